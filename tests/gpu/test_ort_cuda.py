"""The op suite on ONNX Runtime's CUDA execution provider : GPU vs the numpy reference with the CPU
tolerances, PackK/PackV bit-for-bit equal to the CPU contract, every route forced and auto, quality vs float
attention, Sk = 0, empty dims; q6_0 V at head sizes that are multiples of 64, and the planner's error at the
others. Every test is marked `gpu` and skips cleanly when onnxruntime has no working
CUDAExecutionProvider or the library was built without CUDA kernels.

Sessions are created with CPU fallback disabled (session.disable_cpu_ep_fallback), so a node that would silently
run on the CPU fails the test instead of passing it. The case table is tests/attention_cases.py.
"""
from __future__ import annotations

import functools
import re

import numpy as np
import pytest

from conftest import attention_feeds, check_nmse, gaussian_qkv, pack_value
from dot4attn import onnx_builders as ob
from dot4attn import reference as R
import dot4attn

import attention_cases as AC
from gpu_support import q6_d_message

pytestmark = pytest.mark.gpu
CUDA = "CUDAExecutionProvider"


@functools.lru_cache(maxsize=None)
def _gpu_unavailable_reason() -> str | None:
    try:
        import onnxruntime as ort
    except ImportError:
        return "onnxruntime is not installed"
    if CUDA not in ort.get_available_providers():
        return f"onnxruntime {ort.__version__} has no {CUDA} (install onnxruntime-gpu)"
    if dot4attn.build_info().get("gpu") != "cuda":
        return "libdot4attn_ops was built without CUDA kernels"
    try:  # CUDA/cuDNN libraries shipped by pip packages (torch or nvidia-*), when present
        import torch  # noqa: F401
    except Exception:
        pass
    if hasattr(ort, "preload_dlls"):
        try:
            ort.preload_dlls()
        except Exception:
            pass
    try:
        sess = _session_uncached(ob.pack_model("PackK", np.float32))
        if CUDA not in sess.get_providers():
            return "the CUDA execution provider could not be created (no GPU or driver?)"
        sess.run(None, {"X": np.zeros((1, 1, 1, 32), np.float32)})
    except Exception as e:  # no device, driver mismatch, missing CUDA libraries
        return f"CUDA session failed: {str(e).splitlines()[0][:200]}"
    return None


@pytest.fixture(autouse=True)
def _need_gpu():
    reason = _gpu_unavailable_reason()
    if reason:
        pytest.skip(reason)


def _session_uncached(model):
    import onnxruntime as ort

    so = ort.SessionOptions()
    dot4attn.register(so)
    so.log_severity_level = 3
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")  # every node must run on the GPU
    return ort.InferenceSession(model.SerializeToString(), so, providers=[CUDA])


@functools.lru_cache(maxsize=None)
def gpu_attention_session(dtype, v_format, mask_dtype, causal, route, split_k_min_keys, scale):
    model = ob.attention_model(np.dtype(dtype), v_format, None if mask_dtype is None else np.dtype(mask_dtype),
                               scale=scale, causal=causal, route=route, split_k_min_keys=split_k_min_keys)
    for vi in model.graph.input:
        if vi.name == "attn_mask":
            vi.type.tensor_type.ClearField("shape")
    return _session_uncached(model)


@functools.lru_cache(maxsize=None)
def gpu_pack_session(op, x_dtype, fmt):
    return _session_uncached(ob.pack_model(op, np.dtype(x_dtype), fmt))


def gpu_attention(query, k_payload, k_scales, value, v_scales=None, attn_mask=None, *, v_format="float",
                  causal=1, route="auto", split_k_min_keys=None, scale=None):
    sess = gpu_attention_session(query.dtype.name, v_format, None if attn_mask is None else attn_mask.dtype.name,
                                 causal, route, split_k_min_keys, scale)
    return sess.run(None, attention_feeds(query, k_payload, k_scales, value, v_scales, attn_mask))[0]


def gpu_pack(x, op="PackK", fmt=None):
    out = gpu_pack_session(op, x.dtype.name, fmt).run(None, {"X": x})
    return out[0], out[1]


# ---- PackK / PackV: bit for bit -------------------------------------------------------------------------------

def _pack_inputs(dtype):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 2, 37, 96), dtype=np.float32) * 4
    x[0, 0, 0, :32] = 0                    # all-zero block: s = 0, q = 0
    x[0, 0, 1, :32] = 1e-30                # underflows to a zero fp16 scale
    x[0, 0, 2, :32] = np.linspace(-3.5, 3.5, 32)  # exact halves: round-half-even ties
    x[0, 0, 3, 5] = 60000.0                # large values
    x[1, 1, 4, :] = -7.0
    x[2, 1, 5, 1::2] = np.float32(0.5) * np.arange(48)  # ties at q4 scale
    # q4_0's signed max (docs/ops.md, PackV): the value of largest magnitude sets s = v / -8, the positive one on a
    # tie, which the GPU's shuffle reduction must pick whatever the lane order
    x[1, 0, 6, :32] = -0.0                 # signed zeros: the scale is +0
    x[1, 0, 7, 32:64] *= 0.1
    x[1, 0, 7, 40], x[1, 0, 7, 33] = 5.0, -5.0  # a tie between +5 (lane 8) and -5 (lane 1): s = -5 / 8
    x[2, 0, 8, 64:96] = -np.abs(x[2, 0, 8, 64:96])  # all negative: s > 0
    x[2, 0, 9, :32] = np.abs(x[2, 0, 9, :32])       # all positive: s < 0, the smallest values reach level 7
    x[0, 1, 10, :32] = np.r_[-8, 0.25 * (np.arange(31) - 15) + 0.125]  # q6_0: s = 0.25, every other value a tie
    return x.astype(dtype)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("op,fmt", [("PackK", None), ("PackV", "q8_0"), ("PackV", "q4_0"), ("PackV", "q6_0")])
def test_pack_bit_exact(op, fmt, dtype):
    x = _pack_inputs(dtype)
    pay, sc = gpu_pack(x, op, fmt)
    ref_pay, ref_sc = R.pack_k(x) if op == "PackK" else R.pack_v(x, fmt)
    assert pay.dtype == ref_pay.dtype and pay.shape == ref_pay.shape
    assert np.array_equal(pay, ref_pay), f"{op} {fmt} {dtype}: {np.count_nonzero(pay != ref_pay)} payload bytes differ"
    assert np.array_equal(sc.view(np.uint16), ref_sc.view(np.uint16)), f"{op} {fmt} {dtype}: scales differ"


@pytest.mark.parametrize("D", [32, 64, 128, 160, 256])
def test_pack_equals_cpu_op(D):
    """GPU PackK / PackV q4_0 equal the CPU op's output byte for byte (large tensor, every D class)."""
    rng = np.random.default_rng(D)
    x = (rng.standard_normal((2, 3, 1001, D), dtype=np.float32) * 2).astype(np.float16)
    for op, fmt in (("PackK", None), ("PackV", "q4_0")):
        g = gpu_pack(x, op, fmt)
        c = ob.run_pack(x, op, fmt)
        assert np.array_equal(g[0], c[0]) and np.array_equal(g[1].view(np.uint16), c[1].view(np.uint16)), (op, D)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("D", [64, 96, 128, 256])
def test_pack_q6_0_equals_cpu_op(D, dtype):
    """GPU PackV q6_0 equals the CPU op's output byte for byte, float32 and float16 input, at every D class: PackV
    takes any D on the GPU (only Dot4Attention's q6_0 V needs D a multiple of 64 there). Edge blocks included: zeros,
    ties at half a level, a signed-max tie, a value past q6_0's float16 scale range (float32: saturated at 65504,
    float16: Inf, so a NaN scale) and a NaN."""
    rng = np.random.default_rng(100 + D)
    x = rng.standard_normal((2, 3, 1001, D), dtype=np.float32) * 2
    x[0, 0, 0, :32] = 0
    x[0, 0, 1, :32] = np.r_[-8, 0.25 * (np.arange(31) - 15) + 0.125]
    x[0, 0, 2, :32] *= 0.1
    x[0, 0, 2, 9], x[0, 0, 2, 20] = 5.0, -5.0
    x[1, 1, 3, 5] = 3e6
    x[1, 2, 4, D - 1] = np.nan
    x = x.astype(dtype)
    g = gpu_pack(x, "PackV", "q6_0")
    c = ob.run_pack(x, "PackV", "q6_0")
    assert g[0].dtype == np.uint8 and g[0].shape == (2, 3, 1001, 3 * D // 4), (g[0].dtype, g[0].shape)
    assert np.array_equal(g[0], c[0]), f"D={D} {dtype}: {np.count_nonzero(g[0] != c[0])} payload bytes differ"
    assert np.array_equal(g[1].view(np.uint16), c[1].view(np.uint16)), f"D={D} {dtype}: scales differ"


# ---- Dot4Attention: the CPU suite's case table on every route ----------------------------------------------------

# The hand-picked table and the q6_0 cases the GPU kernels take (D a multiple of 64)
GPU_CASES = AC.CASES + [c for c in AC.ALL_CASES if c.v_format == "q6_0"]


@pytest.mark.parametrize("name,route", [(c.name, r) for c in GPU_CASES for r in AC.routes_for(c)])
def test_matches_reference_gpu(name, route):
    c = AC.CASE_BY_NAME[name]
    inputs, ref, dead = AC.case_data(name)
    out = gpu_attention(*inputs, v_format=c.v_format, causal=c.causal, route=route,
                        split_k_min_keys=c.split_k_min_keys, scale=c.scale)
    what = f"{c} route={route} EP=CUDA"
    check_nmse(out, ref, AC.REF_TOL, what)
    if dead.any():
        assert (out[dead] == 0).all(), f"{what}: rows with no visible key are not 0"


@pytest.mark.parametrize("name", [c.name for c in GPU_CASES if c.Sq <= 8 and c.Sk > 0 and c.dtype == "float32"])
def test_routes_agree_gpu(name):
    c = AC.CASE_BY_NAME[name]
    inputs, _, _ = AC.case_data(name)
    outs = {r: gpu_attention(*inputs, v_format=c.v_format, causal=c.causal, route=r,
                             split_k_min_keys=c.split_k_min_keys, scale=c.scale) for r in AC.ROUTES}
    for r in ("decode", "split_k", "auto"):
        err = R.nmse(outs[r], outs["prefill"])
        assert err <= 1e-8, f"{c}: route {r} vs prefill NMSE {err:.3e}"


# Shapes the CPU table does not reach: bigger GQA groups (row chunks), long prefill, many splits, D classes.
EXTRA = [  # B, Hq, Hkv, Sq, Sk, D, dtype, v_format, causal, route
    (1, 32, 8, 1, 20000, 128, "float16", "q4_0", 1, "auto"),
    (1, 24, 4, 1, 9000, 256, "float16", "float", 1, "split_k"),
    (2, 16, 1, 8, 3000, 64, "float32", "q8_0", 1, "decode"),    # 128 rows per KV head: 8 row chunks
    (2, 16, 1, 8, 5000, 96, "float16", "q4_0", 1, "split_k"),
    (1, 8, 2, 777, 777, 128, "float16", "q8_0", 1, "prefill"),
    (1, 4, 4, 1000, 1500, 224, "float32", "float", 1, "prefill"),
    (1, 2, 1, 129, 4000, 160, "float16", "q4_0", 0, "prefill"),
    (1, 64, 8, 3, 70000, 128, "float16", "q4_0", 1, "split_k"),
    (1, 32, 8, 1, 20000, 128, "float16", "q6_0", 1, "auto"),
    (2, 16, 1, 8, 5000, 256, "float16", "q6_0", 1, "split_k"),
    (1, 8, 2, 777, 777, 128, "float16", "q6_0", 1, "prefill"),
    (1, 2, 1, 129, 4000, 192, "float16", "q6_0", 0, "prefill"),  # D = 192: the tile kernel
    (2, 16, 1, 8, 3000, 64, "float32", "q6_0", 1, "decode"),
]


@pytest.mark.parametrize("idx", range(len(EXTRA)), ids=[f"{e[1]}-{e[2]}-Sq{e[3]}-Sk{e[4]}-D{e[5]}-{e[7]}-{e[9]}"
                                                      for e in EXTRA])
def test_extra_shapes_gpu(idx):
    B, Hq, Hkv, Sq, Sk, D, dtype, vf, causal, route = EXTRA[idx]
    rng = np.random.default_rng(1000 + idx)
    q, k, v = gaussian_qkv(rng, B, Hq, Hkv, Sq, Sk, D, dtype)
    kp, ks = R.pack_k(k)
    value, vs = pack_value(v, vf)
    ref = R.attention(q, kp, ks, value, vs, causal=causal, v_format=vf)
    out = gpu_attention(q, kp, ks, value, vs, v_format=vf, causal=causal, route=route)
    check_nmse(out, ref, AC.REF_TOL, f"{EXTRA[idx]} EP=CUDA")


@pytest.mark.parametrize("idx", range(len(AC.QUALITY)),
                         ids=[f"D{d}-{vf}-{dt}-Sq{s[3]}-Sk{s[4]}" for d, vf, s, dt, _ in AC.QUALITY])
def test_quality_gpu(idx):
    """End to end on the GPU: PackK / PackV on CUDA, then Dot4Attention, vs float attention."""
    D, vf, shape, dtype, causal = AC.QUALITY[idx]
    q, k, v, base = AC.quality_data(idx)
    kp, ks = gpu_pack(k, "PackK")
    value, v_scales = (v, None) if vf == "float" else gpu_pack(v, "PackV", vf)
    out = gpu_attention(q, kp, ks, value, v_scales, v_format=vf, causal=causal)
    check_nmse(out, R.attention(q, kp, ks, value, v_scales, causal=causal, v_format=vf), AC.REF_TOL, "vs reference")
    err = R.nmse(out.astype(np.float32), base)
    assert err <= AC.QUALITY_TOL[vf], f"NMSE vs float attention {err:.3e}"


@pytest.mark.parametrize("shape", [(0, 4, 7, 64, 2, 16), (3, 4, 0, 64, 2, 16), (1, 0, 1, 32, 0, 16)],
                         ids=["B0", "Sq0", "H0"])
def test_empty_dims_gpu(shape):
    B, Hq, Sq, D, Hkv, Sk = shape
    rng = np.random.default_rng(0)
    q, k, v = gaussian_qkv(rng, B, Hq, Hkv, Sq, Sk, D, "float16")
    kp, ks = R.pack_k(k)
    for route in ("auto", "prefill"):
        out = gpu_attention(q, kp, ks, v, route=route)
        assert out.shape == q.shape and out.dtype == q.dtype


# ---- split_k from several threads and streams at once ------------------------------------------------------------

def test_split_merge_concurrent_sessions_gpu():
    """Two sessions (two CUDA streams) running split_k from four threads at once: the split scratch comes from each
    run's allocation and nothing is shared between launches, so every run gives the single run's output bit for
    bit, and that output matches the reference."""
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(77)
    q, k, v = gaussian_qkv(rng, 1, 32, 8, 1, 20000, 128, "float16")
    kp, ks = R.pack_k(k)
    value, vs = pack_value(v, "q4_0")
    ref = R.attention(q, kp, ks, value, vs, causal=1, v_format="q4_0")
    model = ob.attention_model(np.dtype("float16"), "q4_0", None, causal=1, route="split_k")
    sessions = [_session_uncached(model) for _ in range(2)]
    feeds = attention_feeds(q, kp, ks, value, vs)
    want = sessions[0].run(None, feeds)[0]
    check_nmse(want, ref, AC.REF_TOL, "split_k")

    def work(i):
        return [sessions[i % 2].run(None, feeds)[0] for _ in range(25)]

    with ThreadPoolExecutor(4) as ex:
        outs = [o for lst in ex.map(work, range(4)) for o in lst]
    bad = sum(not np.array_equal(o.view(np.uint16), want.view(np.uint16)) for o in outs)
    assert bad == 0, f"{bad} of {len(outs)} concurrent runs differ from the single run"


# ---- a small representative set for compute-sanitizer (memcheck / racecheck) ---------------------------------------

SANITIZER_SET = ["gqa4_b3_leftpad", "mha6_bias", "gqa8_sq300", "splitk_sk4099_pad", "sk0_decode",
                 "bool_dead_rows_prefill", "scale_mask_qk", "q6_prefill_sq300", "q6_splitk_sk4099_pad"]


@pytest.mark.parametrize("name", SANITIZER_SET)
def test_sanitizer_set(name):
    """Run under compute-sanitizer (memcheck | racecheck):
    `python -m pytest tests/gpu/test_ort_cuda.py -k sanitizer`."""
    c = AC.CASE_BY_NAME[name]
    inputs, ref, _ = AC.case_data(name)
    for route in AC.routes_for(c):
        out = gpu_attention(*inputs, v_format=c.v_format, causal=c.causal, route=route,
                            split_k_min_keys=c.split_k_min_keys, scale=c.scale)
        check_nmse(out, ref, AC.REF_TOL, f"{c} route={route}")
    x = _pack_inputs("float16")
    for op, fmt in (("PackK", None), ("PackV", "q4_0"), ("PackV", "q6_0")):
        gpu_pack(x, op, fmt)


@pytest.mark.parametrize("model", [
    lambda: ob.attention_model(np.float16, "q6_0"),
    lambda: ob.pack_model("PackV", np.float16, "q6_0"),
    lambda: ob.cache_attention_model(np.float16, num_heads=4, kv_num_heads=2, v_format="q6_0", cache_layout="pair"),
    lambda: ob.cache_attention_model(np.float32, num_heads=4, kv_num_heads=2, v_format="q6_0"),
], ids=["Dot4Attention", "PackV", "Dot4GroupQueryAttention-pair", "Dot4GroupQueryAttention-rows"])
def test_q6_0_sessions_run_on_cuda(model):
    """Each op takes q6_0 on the CUDA EP: its session is created with the CPU fallback disabled, so every node is
    assigned to CUDA (the runs are the tests above)."""
    sess = _session_uncached(model())
    assert sess.get_providers()[0] == CUDA


@pytest.mark.parametrize("name", [c.name for c in AC.CPU_ONLY_CASES])
def test_q6_0_at_other_head_sizes_fails_at_run(name):
    """q6_0 V at a head size that is not a multiple of 64 (D = 32, 96, 160, 224): the session is created, and the
    run fails with the GPU planner's message, which names D and the CPU execution provider."""
    c = AC.CASE_BY_NAME[name]
    inputs, _, _ = AC.case_data(name)
    route = "prefill" if c.Sq > 8 else "decode"
    gpu_attention_session(c.dtype, c.v_format, None if inputs[5] is None else inputs[5].dtype.name, c.causal, route,
                          c.split_k_min_keys, c.scale)  # created without error
    with pytest.raises(Exception, match=re.escape(q6_d_message(c.D))):
        gpu_attention(*inputs, v_format=c.v_format, causal=c.causal, route=route,
                      split_k_min_keys=c.split_k_min_keys, scale=c.scale)
