"""64-bit indexing on the CUDA EP: B*H*S*D > 2^31 for each route (decode, split_k over a K/V of 2^31 + 8192
elements each; prefill over the same keys, and a prefill whose query/output hold > 2^31 elements), against the
exact output of tests/scale_cases.py's construction or the reference on a subset of rows; and the planner's
limits (tests need a CUDA build; the planner cases need no GPU) are clear errors, not wrong answers."""
from __future__ import annotations

import numpy as np
import pytest

import scale_cases as SC
from attention_cases import REF_TOL
from conftest import check_nmse
from dot4attn import native
from dot4attn import onnx_builders as ob
from dot4attn import reference as R

pytestmark = pytest.mark.gpu


def _session(route, causal=0, dtype=np.float16):
    from test_ort_cuda import _session_uncached  # imported here: its module-level skip logic needs onnxruntime

    return _session_uncached(ob.attention_model(dtype, "q8_0", causal=causal, route=route))


@pytest.fixture
def _need_gpu():
    from test_ort_cuda import _gpu_unavailable_reason

    reason = _gpu_unavailable_reason()
    if reason:
        pytest.skip(reason)


@pytest.mark.parametrize("route,Sq", [("decode", 1), ("split_k", 1), ("prefill", 16)])
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_keys_past_2_31_elements(_need_gpu, route, Sq, dtype):
    feeds, hot = SC.big_inputs(1, 2, 1, Sq, SC.BIG_SK, dtype=dtype)
    out = _session(route, dtype=dtype).run(None, feeds)[0]
    check_nmse(out.astype(np.float32), SC.expected_output(feeds, hot).astype(np.float32),
               REF_TOL, f"Sk={SC.BIG_SK} route={route} {np.dtype(dtype).name}")


def test_prefill_query_past_2_31_elements(_need_gpu):
    """query / output [1, 1, 2^24 + 64, 128] float16 (2^31 + 8192 elements), 64 keys, non-causal: the first and
    last 256 rows equal the reference of those rows (each row's output depends on its own query only)."""
    Sq, Sk, D = SC.BIG_SK, 64, 128
    rng = np.random.default_rng(5)
    q = np.empty((1, 1, Sq, D), np.float16)
    for i0 in range(0, Sq, 1 << 22):  # chunks: a 4 GB float32 temporary is not needed
        q[0, 0, i0:i0 + (1 << 22)] = rng.standard_normal((min(1 << 22, Sq - i0), D), dtype=np.float32) * 3
    k, v = (rng.standard_normal((1, 1, Sk, D), dtype=np.float32) for _ in range(2))
    kp, ks = R.pack_k(k)
    vp, vs = R.pack_v(v, "q8_0")
    out = _session("prefill").run(None, {"query": q, "k_payload": kp, "k_scales": ks, "value": vp,
                                         "v_scales": vs})[0]
    for rows in (slice(0, 256), slice(Sq - 256, Sq)):
        want = R.attention(q[:, :, rows], kp, ks, vp, vs, causal=0, v_format="q8_0")
        check_nmse(out[:, :, rows].astype(np.float32), want.astype(np.float32), REF_TOL, f"rows {rows}")


# ---- the planner's limits (custom_ops/gpu/launch_plan.cu): clear errors / a named fallback ----------------------

H200 = "sm=90a,sms=132,smem=232448"
needs_planner = pytest.mark.skipif(not native.has_gpu_entries(),
                                   reason="libdot4attn_ops was built without GPU kernels (the planner lives there)")


@needs_planner
def test_split_k_rows_past_2_31_are_refused():
    with pytest.raises(native.NativeError, match=r"split_k cannot merge 4294967296 rows"):
        native.gpu_plan(native.make_call(1 << 24, 256, 256, 1, 4096, 128, route="split_k"), H200)


@needs_planner
def test_more_than_2_31_blocks_are_refused():
    with pytest.raises(native.NativeError, match=r"blocks \(more than 2\^31 - 1\)"):
        native.gpu_plan(native.make_call(1 << 20, 1 << 12, 1 << 12, 1, 64, 128, route="decode"), H200)


@needs_planner
def test_prefill_keys_near_2_31_leave_the_tensor_core_kernel_for_the_tile_kernel():
    """Key indices of the tensor-core prefill are 32-bit: Sk >= 2^31 - 64 takes the tile kernel (64-bit), said in
    the plan's fallback reason."""
    p = native.gpu_plan(native.make_call(1, 1, 1, 16, (1 << 31) - 10, 128, route="prefill"), H200)
    assert p["kernel"] != "prefill_mma" and "Sk >= 2^31 - 64" in p["fallback"], p
