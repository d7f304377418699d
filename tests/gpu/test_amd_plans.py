"""The plans of described AMD devices, run on this CUDA GPU (the C entry's run_as) against the numpy reference.

No AMD GPU is lent to the project, so what the HIP build runs is proven here: a call with run_as=<an AMD description>
executes the plan made for that device (launch_plan.cu) with the same kernel, row tile, key tile, threads, stages,
splits, blocks and shared-memory bytes, within its 64 KB LDS. Checked against reference.attention with the kernel
tests' bar (NMSE <= 1e-6, exact zeros for rows that see no key); packed-cache rows give the dense call's bits.

What this does not verify (docs/gpu.md, "AMD GPUs"): the wave width and the vendor intrinsics. The tile kernel's code
does not depend on the wave width (256 threads, shuffles inside aligned groups of at most 32 lanes), so a tile plan
runs here as on the AMD GPU. The SIMT decode kernel's key chunk is its warp: a wave64 plan (MI300, MI250) runs here as
twice the warps of 32-key chunks, same threads, rows, stages and splits, its shared memory laid out for them (the
planner's run_warp; still within the LDS), so its lane mapping, 64-lane shuffles and ballots and its summation order
are not the AMD GPU's. The wave32 (RDNA3) plans run as they are. dot4 builtins, the plain copy HIP has instead of
cp.async and the HIP runtime calls are covered by tools/hip_compile_check.sh only (it compiles, for gfx90a, gfx942
and gfx1100, and checks the dot instruction is emitted)."""
from __future__ import annotations

import functools
import zlib

import numpy as np
import pytest

import attention_cases as AC
from conftest import check_nmse, gaussian_qkv, pack_value
from dot4attn import native
from dot4attn import reference as R

from gpu_support import AMD_DEVICES, AMD_LDS, mask_strides, to_device
from test_kernels import _bits, _packed

pytestmark = pytest.mark.gpu

# Kernels each route may run on AMD: prefill the tile kernel; decode and split_k the SIMT decode kernel, or the tile
# kernel it falls back to (misaligned pointers, a block that does not fit), forced.
KERNELS = {"prefill": ("",), "decode": ("", "kernel=tile"), "split_k": ("", "kernel=tile")}
# (B, Hq, Hkv, Sq, Sk) per route: a causal prefill off every tile size (GQA 4), a prefill chunk over a longer cache, a
# grouped 4-row decode (16 rows per KV head: two SIMT row tiles), split_k over many splits (the CU counts differ).
SHAPES = {"prefill": [(1, 8, 2, 300, 300), (2, 8, 2, 100, 700)], "decode": [(2, 8, 2, 4, 1000)],
          "split_k": [(1, 8, 2, 1, 8192)]}


def _described(call, device):
    """The plan `call` (made with run_as) would have on the described device itself: the same call, planned there."""
    c = native.GpuCall.from_buffer_copy(call)
    c.run_as = None
    return native.gpu_plan(c, device)


def _check_plan(ran, call, device):
    """The plan that ran is the described device's but, on wave64, for its warps (counted on this GPU: twice as many)
    and the SIMT decode's shared memory (laid out for 32-key chunks), and fits the LDS."""
    want = _described(call, device)
    assert ran["smem_bytes"] <= AMD_LDS and want["smem_bytes"] <= AMD_LDS, (want, ran)
    assert ran["kernel"] in ("tile", "decode_simt"), ran
    if "warp=64" in device:
        assert ran["warps"] == 2 * want["warps"] and ran["threads"] == want["threads"], (want, ran)
        ran = dict(ran, warps=want["warps"])
        if ran["kernel"] == "decode_simt":
            ran["smem_bytes"] = want["smem_bytes"]
    assert ran == want, (want, ran)


@functools.lru_cache(maxsize=None)
def _matrix_data(shape, D, v_format, dtype):
    B, Hq, Hkv, Sq, Sk = shape
    rng = np.random.default_rng(zlib.crc32(f"amd{shape}{D}{v_format}{dtype}".encode()))
    q, k, v = gaussian_qkv(rng, B, Hq, Hkv, Sq, Sk, D, dtype)
    kp, ks = R.pack_k(k)
    value, v_scales = pack_value(v, v_format)
    ref = R.attention(q, kp, ks, value, v_scales, None, causal=1, v_format=v_format)
    return (q, kp, ks, value, v_scales), ref


def _matrix_params():
    return [pytest.param(dev, D, vf, dtype, route, i, ov, id=f"{dev}-D{D}-{vf}-{dtype}-{route}{i}-{ov or 'auto'}")
            for dev in AMD_DEVICES for D in (64, 128, 256) for vf in ("float", "q8_0", "q4_0", "q6_0")
            for dtype in ("float16", "float32") for route, shapes in SHAPES.items() for i in range(len(shapes))
            for ov in KERNELS[route]]


@pytest.mark.parametrize("dev,D,v_format,dtype,route,shape_idx,overrides", _matrix_params())
def test_amd_matrix(torch_cuda, dev, D, v_format, dtype, route, shape_idx, overrides):
    """Every route, D 64 / 128 / 256, float / q8_0 / q4_0 / q6_0 V, float16 and float32 T on each AMD description: the
    described plan runs here against the reference; the same data as a packed cache's rows (payload and scales of a
    token in one padded row, 37 rows per head past Sk, garbage in every byte not read) gives the same bits."""
    torch = torch_cuda
    device = AMD_DEVICES[dev]
    shape = SHAPES[route][shape_idx]
    arrays, ref = _matrix_data(shape, D, v_format, dtype)
    t = [to_device(torch, a) for a in arrays]
    out = torch.full(t[0].shape, float("nan"), dtype=t[0].dtype, device="cuda")
    dense = native.TorchAttention(*t, out, v_format=v_format, route=route, overrides=overrides, run_as=device)
    ran = dense(return_plan=True)
    _check_plan(ran, dense.call, device)
    torch.cuda.synchronize()
    what = f"{dev} D={D} V={v_format} {dtype} route={route} shape={shape} plan={ran}"
    check_nmse(out.cpu().numpy(), ref, AC.REF_TOL, what)

    Sk = shape[4]
    kp, ks = _packed(torch, t[1:3], Sk + 37)
    if v_format == "float":
        (value,), v_scales = _packed(torch, t[3:4], Sk + 37, extra=16), None
    else:
        value, v_scales = _packed(torch, t[3:5], Sk + 37)
    pout = torch.full(t[0].shape, float("nan"), dtype=t[0].dtype, device="cuda")
    packed = native.TorchAttention(t[0], kp, ks, value, v_scales, pout, v_format=v_format, route=route,
                                   overrides=overrides, run_as=device)
    pran = packed(return_plan=True)
    _check_plan(pran, packed.call, device)
    torch.cuda.synchronize()
    assert pran.pop("strided") is True and ran.pop("strided") is False
    assert pran == ran, f"{what}: packed-cache plan {pran}"
    differ = int((_bits(torch, pout) != _bits(torch, out)).sum())
    assert differ == 0, f"{what}: {differ} of {out.numel()} packed-cache output values differ from the dense call"


# ---- the shared case table (masks, dead rows, Sk = 0, every D, float32 T) under the AMD plans ----------------------

def _case_params(cases, devices):
    return [pytest.param(dev, c.name, r, v, id=f"{dev}-{c.name}-{r}-{v or 'auto'}")
            for dev in devices for c in cases for r in AC.routes_for(c) if r != "auto"
            for v in KERNELS[r]]


def _run_case(torch, dev, name, route, overrides):
    c = AC.CASE_BY_NAME[name]
    device = AMD_DEVICES[dev]
    (q, kp, ks, value, v_scales, mask), ref, dead = AC.case_data(name)
    t = [to_device(torch, a) for a in (q, kp, ks, value, v_scales, mask)]
    out = torch.full(q.shape, float("nan"), dtype=t[0].dtype, device="cuda")
    mk = None if mask is None else "bool" if mask.dtype == np.bool_ else "additive"
    r = native.TorchAttention(*t[:5], out, v_format=c.v_format, causal=bool(c.causal), route=route,
                              overrides=overrides, scale=c.scale or 0.0, mask=t[5], mask_kind=mk,
                              mask_strides=mask_strides(mask, (c.B, c.Hq, c.Sq, c.Sk)), run_as=device)
    plan = r(return_plan=True)
    _check_plan(plan, r.call, device)
    torch.cuda.synchronize()
    o = out.cpu().numpy()
    what = f"{dev}: {c} route={route} plan={plan}"
    check_nmse(o, ref, AC.REF_TOL, what)
    assert np.all(o[dead] == 0), f"{what}: rows that see no key are not exact zeros"


@pytest.mark.parametrize("dev,name,route,overrides", _case_params(AC.ALL_CASES, ("mi300", "gfx1100_96")))
def test_amd_case_table(torch_cuda, dev, name, route, overrides):
    _run_case(torch_cuda, dev, name, route, overrides)


@pytest.mark.parametrize("dev,name,route,overrides", _case_params(AC.LONG_CASES, ("mi300",)))
def test_amd_long_cases(torch_cuda, dev, name, route, overrides):
    _run_case(torch_cuda, dev, name, route, overrides)


def test_run_as_takes_amd_descriptions_only(torch_cuda):
    c = native.make_call(1, 8, 2, 1, 1024, 128, run_as="sm=80,sms=108,smem=166912")
    with pytest.raises(native.NativeError, match="run_as: expected a described AMD device"):
        native.gpu_plan(c)
    c = native.make_call(1, 8, 2, 1, 1024, 128, run_as=AMD_DEVICES["mi300"])
    with pytest.raises(native.NativeError, match="a described device and run_as: give one of them"):
        native.gpu_plan(c, AMD_DEVICES["mi300"])
    c = native.make_call(1, 8, 2, 1, 1024, 128, run_as=AMD_DEVICES["mi300"] + ",run_warp=64")
    with pytest.raises(native.NativeError, match="run_warp=64, but this GPU's warps are 32 wide"):
        native.gpu_plan(c)
