"""Shared fixtures and helpers of the dot4attn op tests.

The library is found the way users find it: `dot4attn.get_library_path()` (the copy installed with the
package, or $DOT4ATTN_LIBRARY). Nothing here hardcodes a build folder. When the library cannot be found every
test errors (it is never skipped).

CPU ISA paths are forced per test with the `isa` fixture (dot4attn.native.force_cpu_isa: DOT4ATTN_CPU_ISA is read
once per process); tests that do not ask for an ISA run with the library's own choice.
Sessions are cached per model configuration: creating them dominates the run time otherwise.
"""
from __future__ import annotations

import functools
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

REPO_ROOT = Path(__file__).resolve().parents[1]

try:
    import dot4attn  # noqa: F401
except ImportError:  # not pip-installed: use the repository's python/ folder (then DOT4ATTN_LIBRARY is needed)
    sys.path.insert(0, str(REPO_ROOT / "python"))
    import dot4attn  # noqa: F401

from onnxruntime.capi import onnxruntime_pybind11_state as _ort_state

from dot4attn import native
from dot4attn import onnx_builders as ob
from dot4attn import reference as R

ALL_ISAS = ("scalar", "avx2", "avx512vnni")

# Every exception class ONNX Runtime's Python binding raises (Fail, InvalidArgument, InvalidGraph, ...).
ORT_ERRORS = tuple(
    obj for obj in vars(_ort_state).values()
    if isinstance(obj, type) and issubclass(obj, Exception) and obj.__module__ == _ort_state.__name__)
INVALID_ARGUMENT = _ort_state.InvalidArgument


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "rocm_runtime: runs in the onnxruntime-rocm 1.22 venv .venv-ortrocm (or $DOT4ATTN_ROCM_PYTHON) "
                   "(skips cleanly when it is not set up)")


# ---- library and ISA --------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def library_path() -> str:
    return dot4attn.get_library_path()  # raises FileNotFoundError with a clear message when missing


@functools.lru_cache(maxsize=None)
def supported_isas() -> tuple[str, ...]:
    return tuple(s for s in dot4attn.build_info()["cpu_isas"].split(",") if s)


@pytest.fixture(scope="session", autouse=True)
def _library_present():
    library_path()


@pytest.fixture(autouse=True)
def _default_isa():
    """Tests run with the library's own ISA choice unless they use the `isa` fixture."""
    native.force_cpu_isa(None)
    yield
    native.force_cpu_isa(None)


@pytest.fixture(params=ALL_ISAS)
def isa(request, _default_isa):
    """Forces one CPU ISA path (skips when this CPU lacks it)."""
    name = request.param
    if name not in supported_isas():
        pytest.skip(f"this CPU does not support the {name} path (supported: {','.join(supported_isas())})")
    native.force_cpu_isa(name)
    return name


# ---- models and sessions ----------------------------------------------------------------------------------------

def free_rank(model, *names: str):
    """Drops the declared shape (rank included) of the named graph inputs, so any rank can be fed."""
    for vi in model.graph.input:
        if vi.name in names:
            vi.type.tensor_type.ClearField("shape")
    return model


def set_input_dtype(model, name: str, dtype):
    for vi in model.graph.input:
        if vi.name == name:
            vi.type.tensor_type.elem_type = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
            return model
    raise KeyError(name)


def new_session(model, threads: int = 0):
    return ob.session(model, threads=threads)


@functools.lru_cache(maxsize=None)
def attention_session(dtype: str = "float32", v_format: str = "float", mask_dtype: str | None = None,
                      causal: int = 1, route: str = "auto", split_k_min_keys: int | None = None,
                      scale: float | None = None, with_v_scales: bool | None = None, threads: int = 0):
    """A cached session of one Dot4Attention node (the mask input takes any rank)."""
    model = ob.attention_model(np.dtype(dtype), v_format, None if mask_dtype is None else np.dtype(mask_dtype),
                               scale=scale, causal=causal, route=route, split_k_min_keys=split_k_min_keys,
                               with_v_scales=with_v_scales)
    free_rank(model, "attn_mask")
    return new_session(model, threads)


@functools.lru_cache(maxsize=None)
def pack_session(op: str = "PackK", x_dtype: str = "float32", fmt: str | None = None):
    return new_session(ob.pack_model(op, np.dtype(x_dtype), fmt))


def attention_feeds(query, k_payload, k_scales, value, v_scales=None, attn_mask=None) -> dict:
    feeds = {"query": query, "k_payload": k_payload, "k_scales": k_scales, "value": value}
    if v_scales is not None:
        feeds["v_scales"] = v_scales
    if attn_mask is not None:
        feeds["attn_mask"] = attn_mask
    return feeds


def run_attention(query, k_payload, k_scales, value, v_scales=None, attn_mask=None, *, v_format="float",
                  causal=1, route="auto", split_k_min_keys=None, scale=None, threads=0) -> np.ndarray:
    sess = attention_session(query.dtype.name, v_format, None if attn_mask is None else attn_mask.dtype.name,
                             causal, route, split_k_min_keys, scale, None, threads)
    return sess.run(None, attention_feeds(query, k_payload, k_scales, value, v_scales, attn_mask))[0]


def run_pack(x: np.ndarray, op: str = "PackK", fmt: str | None = None):
    out = pack_session(op, x.dtype.name, fmt).run(None, {"X": x})
    return out[0], out[1]


# ---- data -------------------------------------------------------------------------------------------------------

def gaussian_qkv(rng, B, Hq, Hkv, Sq, Sk, D, dtype="float32"):
    """The quality inputs: Q standard normal x3, K and V standard normal."""
    q = (rng.standard_normal((B, Hq, Sq, D), dtype=np.float32) * 3).astype(dtype)
    k = rng.standard_normal((B, Hkv, Sk, D), dtype=np.float32).astype(dtype)
    v = rng.standard_normal((B, Hkv, Sk, D), dtype=np.float32).astype(dtype)
    return q, k, v


def pack_value(v: np.ndarray, v_format: str):
    """(value, v_scales) as Dot4Attention takes them for `v_format` (reference packing)."""
    if v_format == "float":
        return v, None
    return R.pack_v(v, v_format)


# ---- checks -----------------------------------------------------------------------------------------------------

def check_nmse(out: np.ndarray, ref: np.ndarray, tol: float, what: str) -> float:
    assert out.shape == ref.shape, f"{what}: shape {out.shape} != reference {ref.shape}"
    assert out.dtype == ref.dtype, f"{what}: dtype {out.dtype} != reference {ref.dtype}"
    assert np.isfinite(out).all(), f"{what}: {np.count_nonzero(~np.isfinite(out))} non-finite output values"
    err = R.nmse(out, ref)
    assert err <= tol, f"{what}: NMSE {err:.3e} > {tol:.0e}"
    return err


def nibbles(payload: np.ndarray) -> np.ndarray:
    u = np.empty((*payload.shape[:-1], payload.shape[-1] * 2), np.int16)
    u[..., 0::2] = payload & 0x0F
    u[..., 1::2] = payload >> 4
    return u


def check_packed(x: np.ndarray, payload: np.ndarray, scales: np.ndarray, fmt: str, what: str):
    ref_p, ref_s = R.pack_v(x, fmt)
    assert payload.dtype == ref_p.dtype and payload.shape == ref_p.shape, \
        f"{what}: payload {payload.dtype}{list(payload.shape)}, expected {ref_p.dtype}{list(ref_p.shape)}"
    assert scales.dtype == np.float16 and scales.shape == ref_s.shape, \
        f"{what}: scales {scales.dtype}{list(scales.shape)}, expected float16{list(ref_s.shape)}"
    bad = scales.view(np.uint16) != ref_s.view(np.uint16)
    assert not bad.any(), (
        f"{what}: {np.count_nonzero(bad)} of {bad.size} scales differ from the reference, first at "
        f"{np.argwhere(bad)[0].tolist()}: got {scales[bad][0]!r}, expected {ref_s[bad][0]!r}")
    got, ref = R.levels(payload, fmt), R.levels(ref_p, fmt)
    if fmt == "q8_0":
        assert got.size == 0 or (got.min() >= -127 and got.max() <= 127), f"{what}: q8_0 payload outside [-127, 127]"
    diff = np.abs(got - ref)
    if diff.size:
        assert diff.max() <= 1, (
            f"{what}: payload off by {diff.max()} at {np.argwhere(diff == diff.max())[0].tolist()} "
            f"({np.count_nonzero(diff > 1)} elements off by more than 1)")
    off = np.count_nonzero(diff)
    assert off <= 0.001 * diff.size, f"{what}: {off} of {diff.size} payload elements off by 1 (> 0.1%)"


def expect_error(fn, *patterns: str, cls=ORT_ERRORS):
    """Calls fn, expects an ONNX Runtime error of class `cls` whose message matches every regex."""
    with pytest.raises(ORT_ERRORS) as info:
        fn()
    msg = str(info.value)
    assert isinstance(info.value, cls), f"expected {cls}, got {type(info.value).__name__}: {msg}"
    for pat in patterns:
        assert re.search(pat, msg), f"pattern {pat!r} not found in the error message:\n{msg}"
    return msg


# ---- GPU kernel tests (tests/gpu) ----------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def torch_cuda_unavailable() -> str | None:
    if dot4attn.build_info().get("gpu") != "cuda":
        return "libdot4attn_ops was built without CUDA kernels"
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    return None


@pytest.fixture
def torch_cuda():
    """torch, when it has a CUDA device and the library CUDA kernels; else the test skips and says why."""
    reason = torch_cuda_unavailable()
    if reason:
        pytest.skip(reason)
    import torch

    return torch
