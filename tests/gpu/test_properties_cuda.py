"""The property-based tests of tests/ops/test_properties.py on ONNX Runtime's CUDA execution provider: the same
generator (tests/property_cases.py: shapes, dtypes, masks in every broadcast form, V formats, every route, edge
values with NaN / Inf rows and out-of-range blocks) and the same checks against reference.py, on the GPU kernels.
Skips cleanly (test_ort_cuda's autouse fixture) without a CUDA EP or a CUDA build of the library; sessions disable
the CPU fallback, so every node runs on the GPU.

    DOT4ATTN_LIBRARY=<cuda build>/libdot4attn_ops.so pytest -q tests/gpu/test_properties_cuda.py
    DOT4ATTN_FUZZ=long DOT4ATTN_FUZZ_SEED=7 ...   (20x the examples)
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, seed, settings

import property_cases as P
from conftest import check_packed
from gpu_support import to_device
from dot4attn import native
from dot4attn import reference as R
from test_ort_cuda import _need_gpu, gpu_attention, gpu_pack  # noqa: F401 (_need_gpu: autouse, skips without CUDA)


pytestmark = pytest.mark.gpu


@seed(P.FUZZ_SEED)
@settings(max_examples=P.examples(600))
@given(case=P.pack_cases())
def test_pack_properties_gpu(case):
    payload, scales = gpu_pack(case.x, case.op, case.fmt_attr)
    what = f"{case!r} EP=CUDA"
    check_packed(case.x, payload, scales, case.fmt, what)
    P.check_pack_policy(case.x, payload, scales, case.fmt, what)


@seed(P.FUZZ_SEED)
@settings(max_examples=P.examples(1500))
@given(case=P.attention_cases(gpu=True))
def test_attention_properties_gpu(case):
    out = gpu_attention(*case.inputs(), v_format=case.v_format, causal=case.causal, route=case.route)
    P.check_attention(out, case.reference(), case, f"{case!r} EP=CUDA")


# ---- the V side of the policy, one NaN in one V row, every route and V format ---------------------------------
# P.V multiplies every key of a tile by its p, so a hidden key (p = 0) whose V is NaN / Inf would poison the row
# (0 x NaN), and a visible one would make only its columns non-finite instead of the whole row: the kernels fold a
# V-poisoned key into its logit and feed its V to P.V as zeros (gpu/vendor.h, fold_v_poison).

def _v_poison_case(v_format, route, hidden):
    rng = np.random.default_rng(11)
    B, Hq, Hkv, Sq, Sk, D = 1, 4, 2, 4, 300, 128
    q = rng.standard_normal((B, Hq, Sq, D), dtype=np.float32).astype(np.float16)
    k = rng.standard_normal((B, Hkv, Sk, D), dtype=np.float32)
    v = rng.standard_normal((B, Hkv, Sk, D), dtype=np.float32)
    v[0, 1, Sk - 1 if hidden else 5, 7] = np.nan  # key Sk - 1: seen by the last query row only (causal)
    kp, ks = R.pack_k(k)
    value, vs = (v.astype(np.float16), None) if v_format == "float" else R.pack_v(v, v_format)
    case = P.AttnCase("float16", v_format, 1, route, q, kp, ks, value, vs, None, ("normal", "normal", "nonfinite"))
    return case


@pytest.mark.parametrize("route", ["prefill", "decode", "split_k"])
@pytest.mark.parametrize("v_format", ["float", "q8_0", "q4_0", "q6_0"])
@pytest.mark.parametrize("hidden", [True, False], ids=["hidden-key", "visible-key"])
def test_nonfinite_v_gpu(hidden, v_format, route):
    case = _v_poison_case(v_format, route, hidden)
    out = gpu_attention(*case.inputs(), v_format=case.v_format, causal=case.causal, route=case.route)
    P.check_attention(out, case.reference(), case, f"{case!r} EP=CUDA")


# ---- the float16-V prefill's V scan (gpu/v_scan.cuh): one pass flags the (batch, KV head)s whose V holds a NaN / Inf,
# and only their tiles check V. Two heads poisoned (a NaN seen by most rows, an Inf seen by the last row only), two
# clean: the poisoned heads' rows must follow the policy, the clean heads must equal the reference; with the scan
# forced on, off, and the planner's choice (on at this size).

@pytest.mark.parametrize("overrides", ["", "v_scan=1", "v_scan=0"])
def test_prefill_v_scan_gpu(torch_cuda, overrides):
    rng = np.random.default_rng(23)
    B, Hq, Hkv, S, D = 2, 4, 2, 2048, 128
    q = rng.standard_normal((B, Hq, S, D), dtype=np.float32).astype(np.float16)
    kp, ks = R.pack_k(rng.standard_normal((B, Hkv, S, D), dtype=np.float32))
    v = rng.standard_normal((B, Hkv, S, D), dtype=np.float32).astype(np.float16)
    v[1, 0, 1000, 77] = np.nan
    v[0, 1, S - 1, 3] = np.inf
    case = P.AttnCase("float16", "float", 1, "prefill", q, kp, ks, v, None, None, ("normal", "normal", "nonfinite"))
    t = [to_device(torch_cuda, a) for a in (q, kp, ks, v)]
    out = torch_cuda.empty_like(t[0])
    call = native.TorchAttention(*t, None, out, v_format="float", causal=True, route="prefill", overrides=overrides)
    plan = call(return_plan=True)
    torch_cuda.cuda.synchronize()
    assert plan["kernel"] == "prefill_mma" and plan["v_scan"] == (overrides != "v_scan=0")
    assert plan["k_dequant"] == plan["wgmma"], plan  # the f16 Q.K wherever the wgmma instance runs this shape
    P.check_attention(out.cpu().numpy(), case.reference(qk_f16=plan["k_dequant"]), case,
                      f"{case!r} {overrides or 'auto'} EP=CUDA")


# ---- float16 V blocks of +-65504 under q8_0 / q4_0 / q6_0 -----------------------------------------------------------
# Such a q8_0 block's scale rounds up (fp16(65504 / 127) = 516), so its largest level dequantizes to 65532, past
# float16: the tensor-core kernels, which dequantize V in float16, clamp such tiles to +-65504
# (gpu/mma_primitives.cuh). The case the property test first found: B = Hq = Hkv = Sq = 1, Sk = 513, D = 64, decode.
# q6_0's scale of such a block is 65504 / 32 = 2047 exactly, the largest its float16 dequantization takes.

@pytest.mark.parametrize("v_format", ["q8_0", "q6_0"])
def test_fp16_max_v_blocks_gpu(v_format):
    rng = np.random.default_rng(3)
    Sk, D = 513, 64
    q = rng.standard_normal((1, 1, 1, D), dtype=np.float32).astype(np.float16)
    k = rng.standard_normal((1, 1, Sk, D), dtype=np.float32)
    v = rng.standard_normal((1, 1, Sk, D), dtype=np.float32)
    v = np.where(rng.random(v.shape) < 0.05, np.sign(v) * np.float32(65504), v).astype(np.float16)
    kp, ks = R.pack_k(k)
    value, vs = R.pack_v(v, v_format)
    case = P.AttnCase("float16", v_format, 0, "auto", q, kp, ks, value, vs, None, ("normal", "normal", "fp16max"))
    out = gpu_attention(*case.inputs(), v_format=case.v_format, causal=case.causal, route=case.route)
    P.check_attention(out, case.reference(), case, f"{case!r} EP=CUDA")
