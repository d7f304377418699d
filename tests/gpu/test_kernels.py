"""The GPU kernels against the numpy reference, through the library's C entry (no ONNX Runtime), for every route
and every launch plan the planner can choose: the shared case table (tests/attention_cases.py) under the automatic
plan and with each fallback kernel forced, the long cases under every staging mode, cluster and prefill instance
the tensor-core kernels have, and split_k on concurrent streams and under CUDA graph capture. Tolerances are the
CPU suite's: NMSE <= 1e-6 vs reference.attention, exact zeros for rows that see no key.

The same cases and plans again over strided K / V rows (a packed cache: payload and scales of a token in one padded
row, more rows per head than keys, garbage in the padding and the rows past Sk) must give the dense call's output
bit for bit, under the same plan.

The Q.K-on-f16 prefill (override k_dequant=1: K's float16 copy, QK16 instances, 3 or 2 blocks per SM, and with ws=1
the warp-specialized kernel) runs the shared table and the long cases too, held to the reference's qk_f16 numerics at
the same tolerance; so does the int8 Q.K on wgmma (qk_wgmma=1, S8W instances), held to the reference itself.

q6_0 V runs here at D a multiple of 64 (the shared table's q6_0 cases and long cases at D 64 / 128 / 256); at the
other head sizes the planner refuses it, with a message these tests check."""
from __future__ import annotations

import functools
import re

import numpy as np
import pytest

import attention_cases as AC
from conftest import check_nmse
from dot4attn import native
from dot4attn import reference as R

from gpu_support import mask_strides, packed_layout, q6_d_message, to_device

pytestmark = pytest.mark.gpu

# Plans forced per route on top of the automatic one: every fallback kernel the planner can pick.
FALLBACKS = {"prefill": ["kernel=tile"], "decode": ["kernel=simt", "kernel=tile"],
             "split_k": ["kernel=simt", "kernel=tile"]}
# Q.K on f16 wgmma from K's float16 copy (the QK16 prefill, k_dequant.cuh), with V's float16 copy where V is quantized:
# asked for by override only, so the shared table and the long cases run it explicitly.
K16 = "k_dequant=1,v_dequant=1"
K16O = K16 + ",min_blocks=2"  # its overlapped schedule (2 blocks per SM, three ring slots)
# Its warp-specialized kernel (prefill_ws.cuh, sm_90a: a producer warpgroup, two consumers taking turns;
# V always scanned, the flagged heads on prefill_wg.cuh's checked instance): the same numerics.
K16W = K16 + ",ws=1"
K16W64 = K16W + ",ws_keys=64"  # its 64-key tiles at D 64 / 128 (128 by default there)
K16W1 = K16W + ",ws_persist=0"  # a block per work item instead of one per SM walking them
# The contract's int8 Q.K on wgmma (S8W instances, 2 blocks per SM; V's float16 copy where V is quantized): the
# reference's own numerics.
S8W = ("qk_wgmma=1,v_dequant=1,min_blocks=2",)
# The tensor-core kernels' instances (float16 T, D 64 / 128 / 256), forced on the long cases.
MMA_DECODE = ["staging=cp_async", "staging=tma", "staging=regs", "staging=bulk", "cluster=1", "warps=2,stages=1",
              "warps=8"]
MMA_PREFILL = ["tma=0", "wgmma=0", "min_blocks=2", "m_tiles=2", "tma=0,stages=1", "v_scan=0", "v_scan=1",
               "v_dequant=0", "v_dequant=1", K16, K16 + ",v_scan=0", K16O, K16W, K16W64, K16W1,
               *S8W]
KERNEL_OF = {"kernel=simt": "decode_simt", "kernel=tile": "tile"}
# q6_0 V has no tensor-core prefill of its own: it runs on its float16 copy (v_dequant), so v_dequant=0 takes the tile
# kernel, with this reason
Q6_NO_COPY = "tensor-core prefill: q6_0 V runs on its float16 copy (v_dequant=0)"


def _mma_ok(c) -> bool:
    return c.dtype == "float16" and c.D in (64, 128, 256)


def _params(cases, variants_of):
    return [pytest.param(c.name, r, v, id=f"{c.name}-{r}-{v or 'auto'}")
            for c in cases for r in AC.routes_for(c) if r != "auto" for v in variants_of(c, r)]


def _table_variants(c, r):
    return ["", *FALLBACKS[r], *([K16, K16O, K16W, *S8W] if r == "prefill" and _mma_ok(c) else [])]


def _qk16_expected(torch, c, plan, s8w: bool = False) -> bool:
    """Whether a plan made with K16 / K16O (S8W) must be a QK16 (S8W) instance: sm_90a's float16-V wgmma instance at
    D 64 / 128, or at D = 256 (float16 T, QK16 only) the kernel of prefill_wg.cuh."""
    if torch.cuda.get_device_capability()[0] != 9 or plan["kernel"] != "prefill_mma":
        return False
    if c.D == 256:
        return not s8w and c.dtype == "float16"
    return (c.D in (64, 128) and plan.get("wgmma", False) and plan.get("m_tiles") == 1
            and (plan.get("ws", False) or plan.get("min_blocks") in (2, 3)))  # ws: one block per SM


def _ws_expected(torch, c, plan) -> bool:
    """Whether a plan made with K16W must be the warp-specialized kernel: a QK16 plan."""
    return plan.get("k_dequant", False) and _qk16_expected(torch, c, plan)


def _long_variants(c, r):
    return ["", *FALLBACKS[r][:1], *((MMA_PREFILL if r == "prefill" else MMA_DECODE) if _mma_ok(c) else [])]


def _call(c, t, mask, out, route, overrides):
    """A TorchAttention of case c on device tensors t = (q, kp, ks, value, v_scales, mask); `mask`: the numpy mask."""
    mk = None if mask is None else "bool" if mask.dtype == np.bool_ else "additive"
    return native.TorchAttention(*t[:5], out, v_format=c.v_format, causal=bool(c.causal), route=route,
                                 overrides=overrides, scale=c.scale or 0.0, mask=t[5], mask_kind=mk,
                                 mask_strides=mask_strides(mask, (c.B, c.Hq, c.Sq, c.Sk)))


@functools.lru_cache(maxsize=None)
def _qk16_ref(name: str):
    """The reference of case `name` with the f16 Q.K prefill's logits (reference.dot4_logits(qk_f16=True))."""
    c = AC.CASE_BY_NAME[name]
    (q, kp, ks, value, v_scales, mask), _, _ = AC.case_data(name)
    return R.attention(q, kp, ks, value, v_scales, mask, scale=c.scale, causal=c.causal, v_format=c.v_format,
                       qk_f16=True)


def _run(torch, name: str, route: str, overrides: str):
    c = AC.CASE_BY_NAME[name]
    (q, kp, ks, value, v_scales, mask), ref, dead = AC.case_data(name)
    t = [to_device(torch, a) for a in (q, kp, ks, value, v_scales, mask)]
    out = torch.full(q.shape, float("nan"), dtype=t[0].dtype, device="cuda")
    plan = _call(c, t, mask, out, route, overrides)(return_plan=True)
    torch.cuda.synchronize()
    if plan.get("k_dequant"):  # the f16 Q.K prefill: its own numerics (docs/ops.md), to the same tolerance
        ref = _qk16_ref(name)
    o = out.cpu().numpy()
    what = f"{c} route={route} plan={plan}"
    check_nmse(o, ref, AC.REF_TOL, what)
    assert np.all(o[dead] == 0), f"{what}: rows that see no key are not exact zeros"
    return plan


@pytest.mark.parametrize("name,route,overrides", _params(AC.ALL_CASES, _table_variants))
def test_case_table(torch_cuda, name, route, overrides):
    plan = _run(torch_cuda, name, route, overrides)
    assert plan["route"] == route
    if overrides in KERNEL_OF:
        assert plan["kernel"] == KERNEL_OF[overrides]
    elif overrides in (K16, K16O, K16W):
        c = AC.CASE_BY_NAME[name]
        assert plan.get("k_dequant", False) == _qk16_expected(torch_cuda, c, plan), plan
        if overrides == K16W:
            assert plan.get("ws", False) == _ws_expected(torch_cuda, c, plan), plan
    elif overrides in S8W:
        c = AC.CASE_BY_NAME[name]
        assert plan.get("qk_wgmma", False) == _qk16_expected(torch_cuda, c, plan, s8w=True), plan


@pytest.mark.parametrize("name,route,overrides", _params(AC.LONG_CASES, _long_variants))
def test_long_cases(torch_cuda, name, route, overrides):
    plan = _run(torch_cuda, name, route, overrides)
    c = AC.CASE_BY_NAME[name]
    if overrides in KERNEL_OF:
        assert plan["kernel"] == KERNEL_OF[overrides]
    elif overrides.startswith(K16):
        assert plan.get("k_dequant", False) == _qk16_expected(torch_cuda, c, plan), plan
        if overrides in (K16W, K16W64, K16W1):
            assert plan.get("ws", False) == _ws_expected(torch_cuda, c, plan), plan
            if plan.get("ws", False):
                assert plan["key_tile"] == (64 if overrides == K16W64 or c.D == 256 else 128), plan
                assert plan["persistent"] == (overrides != K16W1), plan
    elif overrides.startswith(S8W[0]):
        assert plan.get("qk_wgmma", False) == _qk16_expected(torch_cuda, c, plan, s8w=True), plan
    elif _mma_ok(c) and c.v_format == "q6_0" and overrides == "v_dequant=0":
        assert (plan["kernel"], plan["fallback"]) == ("tile", Q6_NO_COPY), plan
    elif _mma_ok(c):  # every tensor-core variant must have run on the tensor-core kernel
        assert plan["kernel"] == ("prefill_mma" if route == "prefill" else "decode_mma"), plan
        if c.v_format == "q6_0" and route == "prefill":  # on V's float16 copy, whatever the length and instance
            assert plan["v_dequant"] and plan["scratch_bytes"] >= c.B * c.Hkv * c.Sk * c.D * 2, plan
        elif c.v_format == "q6_0":  # no TMA or register staging for q6_0 V
            assert plan["staging"] == "cp_async", plan


def test_long_cases_cover_every_instance(torch_cuda):
    """The long cases' automatic plans on this device reach every tensor-core staging mode and the cluster."""
    seen = set()
    for c in AC.LONG_CASES:
        for r in (r for r in AC.routes_for(c) if r != "auto"):
            p = native.gpu_plan(native.make_call(c.B, c.Hq, c.Hkv, c.Sq, c.Sk, c.D, half=c.dtype == "float16",
                                                 v_format=c.v_format, causal=bool(c.causal), route=r))
            seen.add((p["kernel"], p.get("staging"), p.get("cluster", 0) > 0, p.get("wgmma")))
    major = torch_cuda.cuda.get_device_capability()[0]
    if major >= 9:
        assert {("decode_mma", "tma", False, None), ("decode_mma", "cp_async", True, None),
                ("decode_mma", "regs", False, None), ("prefill_mma", None, False, True)} <= seen, seen


@pytest.mark.parametrize("name", [c.name for c in AC.CPU_ONLY_CASES])
def test_q6_0_at_other_head_sizes_is_refused_by_the_planner(torch_cuda, name):
    """The shared table's q6_0 cases at D = 32, 96, 160, 224 (CPU only): the kernel-level entry refuses them on
    every route with the planner's message, which names D and the CPU execution provider."""
    c = AC.CASE_BY_NAME[name]
    for r in (r for r in AC.routes_for(c) if r != "auto"):
        call = native.make_call(c.B, c.Hq, c.Hkv, c.Sq, c.Sk, c.D, half=c.dtype == "float16", v_format="q6_0",
                                causal=bool(c.causal), route=r)
        with pytest.raises(native.NativeError, match=re.escape(q6_d_message(c.D))):
            native.gpu_plan(call)
    if name == AC.CPU_ONLY_CASES[0].name:  # and a call with its tensors, through TorchAttention
        t = [to_device(torch_cuda, a) for a in AC.case_data(name)[0][:5]]
        with pytest.raises(native.NativeError, match=re.escape(q6_d_message(c.D))):
            native.TorchAttention(*t, torch_cuda.empty_like(t[0]), v_format="q6_0", route="decode")


def test_strided_long_cases_reach_bulk_staging(torch_cuda):
    """On sm_90 the long cases over a packed cache's rows take the bulk-copy staging (scales in the rows; q8_0 and
    q6_0 V, short q4_0 walks)."""
    if torch_cuda.cuda.get_device_capability()[0] < 9:
        pytest.skip("bulk staging is sm_90's")
    seen = set()
    for c in AC.LONG_CASES:
        if c.v_format == "float" or c.dtype != "float16" or c.D not in (64, 128, 256):
            continue
        layout = packed_layout(c.D, c.v_format, c.Sk + 37)
        for r in (r for r in AC.routes_for(c) if r in ("decode", "split_k")):
            p = native.gpu_plan(native.make_call(c.B, c.Hq, c.Hkv, c.Sq, c.Sk, c.D, v_format=c.v_format,
                                                 causal=bool(c.causal), route=r, kv_layout=layout))
            seen.add((c.v_format, p.get("staging")))
    assert {("q8_0", "bulk"), ("q6_0", "bulk")} <= seen, seen


# ---- strided K / V rows (a packed cache) -------------------------------------------------------------------------

GARBAGE = 0xFF  # every byte the kernels must not read: NaN as fp16 / fp32 (scales, float V), -1 as int8
# Plan keys that do not change the output's bits: how K / V reach shared memory (and why), not who sums what. Padded
# rows may stage q8_0 / q4_0 V without TMA where dense rows take it (launch_plan.cu).
STAGING_KEYS = ("staging", "stages", "smem_bytes", "fallback")


def _dense(torch, p):
    """p with ordinary contiguous strides (numpy gives empty arrays all-zero strides, which a dtype view refuses)."""
    return p.contiguous() if p.numel() else torch.empty(p.shape, dtype=p.dtype, device=p.device)


def _packed(torch, parts, kv_rows: int, extra: int = 0):
    """Views of `parts` (device tensors [B, H, Sk, X_i] sharing B, H, Sk) inside one uint8 buffer [B, H, kv_rows,
    row_bytes]: part i at byte sum(X_j bytes, j < i) of every row, row_bytes = their bytes rounded up to 16, plus
    `extra`; all other bytes (row padding, rows Sk .. kv_rows - 1) hold GARBAGE."""
    B, H, Sk = parts[0].shape[:3]
    if Sk == 0:  # no row to lay out (and torch cannot reinterpret the bytes of an empty slice)
        return [torch.empty_like(p) for p in parts]
    widths = [p.shape[3] * p.element_size() for p in parts]
    row_bytes = -(-sum(widths) // 16) * 16 + extra
    buf = torch.full((B, H, kv_rows, row_bytes), GARBAGE, dtype=torch.uint8, device="cuda")
    views, off = [], 0
    for p, w in zip(parts, widths):
        region = buf[:, :, :Sk, off:off + w]
        region.copy_(_dense(torch, p).view(torch.uint8))
        views.append(region.view(p.dtype))
        off += w
    return views


def _rows(torch, t, kv_rows: int):
    """t [B, H, Sk, X] as the first Sk rows per head of a [B, H, kv_rows, X] buffer (a preallocated cache: dense
    rows, more of them than keys), GARBAGE in the rest."""
    B, H, Sk, X = t.shape
    buf = torch.full((B, H, kv_rows, X * t.element_size()), GARBAGE, dtype=torch.uint8, device="cuda")
    buf[:, :, :Sk].copy_(_dense(torch, t).view(torch.uint8))
    return buf.view(t.dtype)[:, :, :Sk]


def _bits(torch, x):
    return x.view(torch.int16 if x.element_size() == 2 else torch.int32)


def _run_strided(torch, name: str, route: str, overrides: str, layout: str = "packed"):
    """Case `name` on dense tensors and on the same data as packed-cache rows (K payload + scales in one row, V
    payload + scales in another buffer, float V as padded T rows; 37 rows per head past Sk) or (layout "rows") as
    dense rows with 37 rows per head past Sk: the same plan and the same output bits."""
    c = AC.CASE_BY_NAME[name]
    arrays, _, _ = AC.case_data(name)
    t = [to_device(torch, a) for a in arrays]
    dense_out = torch.full(t[0].shape, float("nan"), dtype=t[0].dtype, device="cuda")
    dense = _call(c, t, arrays[5], dense_out, route, overrides)
    dense_plan = dense(return_plan=True)

    kv_rows = c.Sk + 37
    if layout == "rows":
        kp, ks, value, v_scales = (None if x is None else _rows(torch, x, kv_rows) for x in t[1:5])
    elif c.v_format == "float":
        kp, ks = _packed(torch, t[1:3], kv_rows)
        (value,), v_scales = _packed(torch, t[3:4], kv_rows, extra=16), None
    else:
        kp, ks = _packed(torch, t[1:3], kv_rows)
        value, v_scales = _packed(torch, t[3:5], kv_rows)
    out = torch.full(t[0].shape, float("nan"), dtype=t[0].dtype, device="cuda")
    strided = _call(c, [t[0], kp, ks, value, v_scales, t[5]], arrays[5], out, route, overrides)
    if c.Sk > 0:  # (one (b, kv head) only: no head follows, so its rows per head read as Sk)
        assert strided.kv_layout["kv_rows"] == (kv_rows if c.B * c.Hkv > 1 else c.Sk), strided.kv_layout
        assert (strided.kv_layout["k_stride"] > c.D) == (layout == "packed"), strided.kv_layout
    plan = strided(return_plan=True)
    torch.cuda.synchronize()
    what = f"{c} route={route} overrides={overrides!r} layout={strided.kv_layout}"
    assert plan.pop("strided") == (c.Sk > 0 and (layout == "packed" or c.B * c.Hkv > 1)), what
    assert dense_plan.pop("strided") is False, what
    # a dequantized V's / K's float16 copy (v_dequant, k_dequant) spans the layout's rows per head: its scratch
    # follows the layout
    layout_bytes = ("scratch_bytes",) if plan.get("v_dequant") or plan.get("k_dequant") else ()
    math = lambda pl: {k: v for k, v in pl.items() if k not in STAGING_KEYS + layout_bytes}  # noqa: E731
    if "staging=bulk" in overrides and layout == "packed" and math(plan) != math(dense_plan):
        # forced bulk copies may take other warps or no cluster (their shared memory, their instances) than the
        # dense call's fallback: the strided output is then checked against the reference
        _, ref, dead = AC.case_data(name)
        o = out.cpu().numpy()
        check_nmse(o, ref, AC.REF_TOL, f"{what} plan={plan}")
        assert np.all(o[dead] == 0), f"{what}: rows that see no key are not exact zeros"
        return
    assert math(plan) == math(dense_plan), f"{what}: strided plan {plan} != dense plan {dense_plan}"
    if layout == "rows" or ("staging=" in overrides and "staging=bulk" not in overrides):
        same = lambda pl: {k: v for k, v in pl.items() if k not in layout_bytes}  # noqa: E731
        assert same(plan) == same(dense_plan), f"{what}: strided plan {plan} != dense plan {dense_plan}"
    differ = int((_bits(torch, out) != _bits(torch, dense_out)).sum())
    assert differ == 0, f"{what} plan={plan}: {differ} of {out.numel()} output values differ from the dense call"


@pytest.mark.parametrize("name,route,overrides", _params(AC.ALL_CASES, _table_variants))
def test_strided_case_table(torch_cuda, name, route, overrides):
    _run_strided(torch_cuda, name, route, overrides)


@pytest.mark.parametrize("name,route,overrides", _params(AC.LONG_CASES, _long_variants))
def test_strided_long_cases(torch_cuda, name, route, overrides):
    _run_strided(torch_cuda, name, route, overrides)


@pytest.mark.parametrize("name,route,overrides", _params(AC.LONG_CASES, _long_variants))
def test_preallocated_rows_long_cases(torch_cuda, name, route, overrides):
    _run_strided(torch_cuda, name, route, overrides, layout="rows")


def test_strided_explicit_layout(torch_cuda):
    """An explicit kv_layout (base pointers as given) equals the layout read off the views."""
    torch = torch_cuda
    c = AC.CASE_BY_NAME["long_sk512_q4"]
    t = [to_device(torch, a) for a in AC.case_data(c.name)[0]]
    kp, ks = _packed(torch, t[1:3], c.Sk + 5)
    vp, vs = _packed(torch, t[3:5], c.Sk + 5)
    outs = [torch.empty_like(t[0]) for _ in range(2)]
    derived = native.TorchAttention(t[0], kp, ks, vp, vs, outs[0], v_format="q4_0", route="split_k")
    explicit = native.TorchAttention(t[0], kp, ks, vp, vs, outs[1], v_format="q4_0", route="split_k",
                                     kv_layout=dict(derived.kv_layout))
    assert derived.kv_layout == {"kv_rows": c.Sk + 5, "k_stride": 144, "ks_stride": 72, "v_stride": 80,
                                 "vs_stride": 40}
    derived()
    explicit()
    torch.cuda.synchronize()
    assert torch.equal(_bits(torch, outs[0]), _bits(torch, outs[1]))


@functools.lru_cache(maxsize=None)
def _split_k_inputs():
    B, Hq, Hkv, Sq, Sk, D = 2, 32, 8, 1, 16384, 128
    rng = np.random.default_rng(5)
    q = (rng.standard_normal((B, Hq, Sq, D), dtype=np.float32) * 3).astype(np.float16)
    k = rng.standard_normal((B, Hkv, Sk, D), dtype=np.float32).astype(np.float16)
    v = rng.standard_normal((B, Hkv, Sk, D), dtype=np.float32).astype(np.float16)
    kp, ks = R.pack_k(k)
    vp, vs = R.pack_v(v, "q4_0")
    ref = R.attention(q, kp, ks, vp, vs, None, causal=1, v_format="q4_0")
    return (q, kp, ks, vp, vs), ref


def test_split_k_streams_and_graph(torch_cuda):
    """split_k (stage 1 + the programmatic-dependent merge) on four streams at once, 30 calls each, equals one call
    bit for bit; captured into a CUDA graph and replayed it matches the reference."""
    torch = torch_cuda
    arrays, ref = _split_k_inputs()
    t = [to_device(torch, a) for a in arrays]
    new = lambda: native.TorchAttention(*t, torch.empty_like(t[0]), v_format="q4_0", route="split_k")  # noqa: E731
    _streams_and_graph(torch, new, 30, "split_k",
                       lambda out, _: check_nmse(out.cpu().numpy(), ref, AC.REF_TOL, "split_k graph replay"))


def _streams_and_graph(torch, new, calls_per_stream: int, what: str, check_replay):
    """Calls made by new() on four streams at once equal one call bit for bit; one captured into a CUDA graph and
    replayed three times passes check_replay(output, the single call's output). Returns the single call's output."""
    one = new()
    one()
    torch.cuda.synchronize()
    want = one.tensors[-1].clone()
    streams = [torch.cuda.Stream() for _ in range(4)]
    calls = [[new() for _ in range(calls_per_stream)] for _ in streams]
    torch.cuda.synchronize()
    for i in range(calls_per_stream):
        for s, st in enumerate(streams):
            with torch.cuda.stream(st):
                calls[s][i]()
    torch.cuda.synchronize()
    differ = sum(not torch.equal(c.tensors[-1], want) for row in calls for c in row)
    assert differ == 0, f"{differ} of {4 * calls_per_stream} concurrent {what} outputs differ from a single call"

    g = new()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        g()  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        g()
    for _ in range(3):
        g.tensors[-1].fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check_replay(g.tensors[-1], want)
    return want


def test_bad_overrides_are_refused(torch_cuda):
    c = native.make_call(1, 8, 2, 1, 1024, 128, half=False, v_format="q8_0", route="decode",
                         overrides="kernel=mma")
    with pytest.raises(native.NativeError, match="kernel=mma cannot run this call: tensor-core decode: float32 T"):
        native.gpu_plan(c)


@pytest.mark.parametrize("v_format,D", [("q8_0", 128), ("q4_0", 128), ("q8_0", 64), ("q4_0", 64)])
def test_v_dequant_prefill_matches_the_kernels_own_conversion(torch_cuda, v_format, D):
    """A q8_0 / q4_0 V converted once into float16 rows (v_dequant=1) gives the output of the prefill that converts
    each tile itself (v_dequant=0) bit for bit, poisoned V included: a NaN scale (the key's rows turn NaN where they
    see it, as the contract says), a scale past the float16 limit (clamped to +-65504 in both) and an Inf one."""
    torch = torch_cuda
    from dot4attn.bench.cuda import _pack

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the float16-V wgmma prefill runs on sm_90")
    g = torch.Generator(device="cuda").manual_seed(7)
    B, Hq, Hkv, S = 1, 8, 2, 3000  # not a multiple of the 64-key tile: the last tile is partial
    q = torch.randn(B, Hq, S, D, device="cuda", dtype=torch.float16, generator=g)
    k = torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.float16, generator=g)
    v = torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.float16, generator=g)
    kp, ks = _pack(torch, k, "q8_0")
    vp, vs = _pack(torch, v, v_format)
    vs[0, 0, 2500, 0] = float("nan")
    vs[0, 1, 1000, D // 32 - 1] = 600.0 if v_format == "q8_0" else 9000.0  # past 515.5 / 8188
    vs[0, 1, 2999, 0] = float("inf")
    outs, plans = [], []
    for ov in ("k_dequant=0,v_dequant=0", "k_dequant=0,v_dequant=1"):  # the int8 Q.K in both: only V's path differs
        r = native.TorchAttention(q, kp, ks, vp, vs, torch.empty_like(q), v_format=v_format, route="prefill",
                                  overrides=ov)
        r.out.fill_(float("nan"))
        plans.append(r(return_plan=True))
        torch.cuda.synchronize()
        outs.append(r.out.clone())
    assert (plans[0]["v_dequant"], plans[1]["v_dequant"], plans[1]["wgmma"]) == (False, True, True), plans
    a, b = outs
    assert torch.equal(torch.isnan(a), torch.isnan(b))
    assert torch.isnan(a[0, :, 2500:]).any() and not torch.isnan(a[0, :4, :2500]).any()  # seen from 2500 on
    assert torch.equal(torch.nan_to_num(a, nan=0.0), torch.nan_to_num(b, nan=0.0))


@pytest.mark.parametrize("v_format,D,overrides", [("q8_0", 128, K16W), ("q4_0", 128, K16W), ("q4_0", 64, K16W),
                                                   ("q8_0", 256, K16W), ("q6_0", 128, K16W),
                                                   ("q8_0", 128, K16 + ",ws=0")])  # the QK16 instance
def test_v_copy_in_ks_pass_is_vs_float16_values(torch_cuda, v_format, D, overrides):
    """With K's float16 copy (k_dequant=1) a quantized V is converted in the same pass as K (k_dequant.cuh,
    copy_kv): the QK16 prefill on that V gives, bit for bit, its output on V handed over as float16 rows of the
    values the conversion must make (level * scale rounded once to float16; +-65504 where a finite scale is past the
    float16 limit; NaN for a NaN / Inf scale), poisoned keys and a head of K past float16 included."""
    torch = torch_cuda
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the QK16 prefill runs on sm_90a")
    rng = np.random.default_rng(5)
    B, Hq, Hkv, S = 1, 8, 2, 3000  # 47 runs of 64 keys per head, the last one partial
    q = rng.standard_normal((B, Hq, S, D)).astype(np.float16)
    k = rng.standard_normal((B, Hkv, S, D)).astype(np.float32)
    k[:, 1] *= 2e5  # head 1: K scales past 515.5, its copy times 2^-8
    kp, ks = R.pack_k(k)
    vp, vs = R.pack_v(rng.standard_normal((B, Hkv, S, D)).astype(np.float16), v_format)
    vs[0, 0, 2500, 0] = np.float16("nan")
    vs[0, 1, 1000, D // 32 - 1] = 9000.0  # past the float16 limit of every format
    vs[0, 1, 2999, 0] = np.float16("inf")
    with np.errstate(over="ignore", invalid="ignore"):
        vals = (R.levels(vp, v_format).astype(np.float32).reshape(B, Hkv, S, D // 32, 32)
                * vs.astype(np.float32)[..., None]).astype(np.float16)
        # a finite scale's products overflow only past its format's limit: clamped there
        vals = np.where(np.isfinite(vs)[..., None], np.clip(vals, -65504, 65504), np.float16("nan"))
        vals = vals.reshape(B, Hkv, S, D)
    assert np.abs(vals[0, 1, 1000, -32:].astype(np.float32)).max() == 65504  # the block's largest level overflows
    outs, plans = [], []
    for value, scales, fmt in ((vp, vs, v_format), (vals.astype(np.float16), None, "float")):
        t = [to_device(torch, a) for a in (q, kp, ks, value, scales)]
        out = torch.full(q.shape, float("nan"), dtype=torch.float16, device="cuda")
        plans.append(native.TorchAttention(*t, out, v_format=fmt, route="prefill",
                                           overrides=overrides)(return_plan=True))
        torch.cuda.synchronize()
        outs.append(out)
    assert plans[0]["k_dequant"] and plans[0]["v_dequant"] and plans[1]["k_dequant"], plans
    assert plans[0]["ws"] == plans[1]["ws"] == ("ws=1" in overrides), plans
    a, b = outs
    assert torch.isnan(a[0, :4, 2500:]).all() and not torch.isnan(a[0, :4, :2500]).any()  # head 0's NaN, from 2500 on
    assert torch.equal(torch.isnan(a), torch.isnan(b))
    assert torch.equal(torch.nan_to_num(a, nan=0.0), torch.nan_to_num(b, nan=0.0))


@pytest.mark.parametrize("v_format,D,overrides", [("float", 128, K16), ("q8_0", 128, K16), ("float", 128, K16O),
                                                   ("q8_0", 128, K16O), ("q4_0", 64, K16O), ("float", 64, K16O),
                                                   ("float", 256, K16), ("q8_0", 256, K16), ("float", 128, K16W),
                                                   ("q8_0", 128, K16W), ("float", 256, K16W), ("q4_0", 256, K16W),
                                                   ("float", 64, K16W), ("q4_0", 64, K16W), ("q8_0", 128, K16W64)])
def test_qk16_prefill_edges_against_the_reference(torch_cuda, v_format, D, overrides):
    """The QK16 prefill (k_dequant=1) on the edges its K copy has to keep: a head whose K is packed from float32 values
    past float16's range (scales past 515.5: that head's copy holds K times 2^-8 and its logits are multiplied back),
    a NaN K scale (the rows that see the key turn NaN, the others not), a NaN V scale / NaN float16 V value
    (V-poisoned: the key's K row turns NaN in shared memory), a partial last tile. Against reference.attention with
    the f16 Q.K's logits (qk_f16): the same NaN rows and NMSE <= 1e-6 on the rest."""
    torch = torch_cuda
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the QK16 prefill runs on sm_90a")
    rng = np.random.default_rng(11)
    B, Hq, Hkv, S = 1, 8, 2, 1500
    q = rng.standard_normal((B, Hq, S, D)).astype(np.float16)
    k = rng.standard_normal((B, Hkv, S, D)).astype(np.float32)
    k[:, 1] *= 2e5  # head 1: K beyond float16 (scales ~ 5e3)
    v = rng.standard_normal((B, Hkv, S, D)).astype(np.float16)
    kp, ks = R.pack_k(k)
    ks[0, 0, 700, 1] = np.float16("nan")
    if v_format == "float":
        value, vs = v.copy(), None
        value[0, 1, 900, 3] = np.float16("nan")
    else:
        value, vs = R.pack_v(v, v_format)
        vs[0, 1, 900, 0] = np.float16("nan")
    ref = R.attention(q, kp, ks, value, vs, None, causal=1, v_format=v_format, qk_f16=True)
    t = [to_device(torch, a) for a in (q, kp, ks, value, vs)]
    out = torch.full(q.shape, float("nan"), dtype=torch.float16, device="cuda")
    plan = native.TorchAttention(*t, out, v_format=v_format, route="prefill", overrides=overrides)(return_plan=True)
    torch.cuda.synchronize()
    assert plan["k_dequant"] and plan["ws"] == overrides.startswith(K16W), plan
    o = out.cpu().numpy()
    bad = np.isnan(ref)
    assert np.array_equal(np.isnan(o), bad), "NaN rows differ from the reference's"
    assert bad[0, :4, 700:].all() and not bad[0, :4, :700].any() and bad[0, 4:, 900:].all()
    check_nmse(np.where(bad, 0, o).astype(np.float16), np.where(bad, 0, ref).astype(np.float16), AC.REF_TOL,
               f"QK16 {v_format} D={D} plan={plan}")


def _qk16_inputs(torch, seed: int, B: int, Hq: int, Hkv: int, S: int, D: int):
    """Gaussian Q, packed K (payload, scales) and float16 V of the shape, for a test of the sm_90a QK16 prefill
    (skipped on other GPUs)."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the QK16 prefill runs on sm_90a")
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, Hq, S, D)).astype(np.float16)
    kp, ks = R.pack_k(rng.standard_normal((B, Hkv, S, D)).astype(np.float16))
    return q, kp, ks, rng.standard_normal((B, Hkv, S, D)).astype(np.float16)


def _q_levels_rows(rng: np.random.Generator, rows: int, D: int) -> tuple[np.ndarray, np.ndarray]:
    """Q rows whose 32-blocks have fixed maxima AMAX (one element +-amax, placed at random) and values where rounding
    a quotient to a level is hardest: exact half-level ties (amax 127 / 8: level steps of 1 / 8), float16 values whose
    float32 quotient lies within 2^-9 of a half-integer (the GPU's fast rule takes the true division within 2^-13),
    and uniform values. Returns the rows and each block's level step dv (the quantization's divisor)."""
    amax = np.array([15.875, 3.7, 0.011, 250.3], dtype=np.float16)[: D // 32].astype(np.float32)
    dv = (amax / np.float32(127)).astype(np.float32)
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    finite = h[np.isfinite(h)].astype(np.float32)
    q = np.empty((rows, D), np.float32)
    for b, (a, d) in enumerate(zip(amax, dv)):
        cand = finite[np.abs(finite) < a]
        r = (cand / d).astype(np.float32)
        near = cand[np.abs(np.abs(r - np.rint(r)) - 0.5) < 2.0 ** -9]
        ties = ((rng.integers(-127, 127, 4096) + 0.5) * d).astype(np.float32)
        pool = [near, ties[np.float16(ties).astype(np.float32) == ties], rng.uniform(-a, a, 4096).astype(np.float32)]
        pool = np.concatenate([p for p in pool if p.size])
        blk = rng.choice(pool, size=(rows, 32))
        blk[np.arange(rows), rng.integers(0, 32, rows)] = a * rng.choice([-1, 1], rows)
        q[:, 32 * b: 32 * b + 32] = blk
    return q.astype(np.float16), dv


@pytest.mark.parametrize("overrides", [K16W, K16, K16O, ""])
def test_prefill_q_levels_are_the_contracts(torch_cuda, overrides):
    """Q's int8 levels as the kernels compute them inside the prefill (gpu/vendor.h q_levels: a multiply by the
    reciprocal, the true division near half-levels) equal the contract's (reference.quantize_q: float32 division,
    round half to even). K's key j is column j of the identity times c_j and V the identity, so output element (i, j)
    is the softmax weight of logit Q[i, j] c_j: c_j makes one level 0.02 (so a level one off moves that output by 2 %),
    logits stay within +-2.6, every weight >= 1e-4 (float16 keeps them to 0.05 %). Rows with exact half-level ties and
    near-ties; against reference.attention (qk_f16 where the plan takes K's float16 copy), every weight within 0.5 %;
    the default plan too (the int8 Q.K off sm_90a)."""
    torch = torch_cuda
    if torch.cuda.get_device_capability()[0] != 9 and overrides:
        pytest.skip("the QK16 prefill runs on sm_90a")
    D, B, Hq, Hkv, Sq = 128, 1, 2, 1, 320
    rng = np.random.default_rng(43)
    q2, dv = _q_levels_rows(rng, B * Hq * Sq, D)
    q = q2.reshape(B, Hq, Sq, D)
    scale = np.float32(1 / np.sqrt(D))
    c = (0.02 / (scale * np.repeat(dv, 32))).astype(np.float16)
    kp, ks = R.pack_k((np.eye(D, dtype=np.float32) * c.astype(np.float32)).astype(np.float16)[None, None])
    v = np.eye(D, dtype=np.float16)[None, None]
    t = [to_device(torch, a) for a in (q, kp, ks, v, None)]
    out = torch.full(q.shape, float("nan"), dtype=torch.float16, device="cuda")
    plan = native.TorchAttention(*t, out, v_format="float", route="prefill", causal=False,
                                 overrides=overrides)(return_plan=True)
    torch.cuda.synchronize()
    qk_f16 = bool(plan.get("k_dequant", False))
    if overrides:  # the float16-Q.K plans asked for
        assert qk_f16, plan
    ref = R.attention(q, kp, ks, v, None, None, causal=0, v_format="float", qk_f16=qk_f16).astype(np.float32)
    assert ref.min() >= 1e-4, ref.min()
    rel = np.abs(out.cpu().numpy().astype(np.float32) / ref - 1)
    i = np.unravel_index(np.argmax(rel), rel.shape)
    assert rel.max() <= 5e-3, (f"plan {plan}: weight {i} off by {rel.max():.2%} (one level is 2 %): Q[{i[:3]}] = "
                               f"{q[i[:3]][i[3]]!r}, level {R.quantize_q(q)[0][i[:3]][i[3]]}")


@pytest.mark.parametrize("S", [1500, 1536])  # row chunks in (batch, KV head) order; position-major causal items
@pytest.mark.parametrize("v_format,D", [("float", 128), ("q8_0", 64)])
def test_ws_checked_companion_walks_several_items_per_block(torch_cuda, v_format, D, S):
    """The warp-specialized prefill runs the V-flagged heads on its checked companion, a block per SM striding over
    the work items: with more items than SMs a block runs several, flagged and not, and the ring's slots and phases
    carry from one to the next. Two flagged heads of eight, 384 items: against reference.attention (qk_f16), the same
    NaN rows and NMSE <= 1e-6 on the rest."""
    torch = torch_cuda
    q, kp, ks, v = _qk16_inputs(torch, 29, 2, 16, 4, S, D)
    if v_format == "float":
        value, vs = v.copy(), None
        value[0, 1, 1000, 5] = np.float16("inf")
        value[1, 3, 300, 0] = np.float16("nan")
    else:
        value, vs = R.pack_v(v, v_format)
        vs[0, 1, 1000, 0] = np.float16("nan")
        vs[1, 3, 300, D // 32 - 1] = np.float16("nan")
    ref = R.attention(q, kp, ks, value, vs, None, causal=1, v_format=v_format, qk_f16=True)
    t = [to_device(torch, a) for a in (q, kp, ks, value, vs)]
    out = torch.full(q.shape, float("nan"), dtype=torch.float16, device="cuda")
    plan = native.TorchAttention(*t, out, v_format=v_format, route="prefill", overrides=K16W)(return_plan=True)
    torch.cuda.synchronize()
    assert plan["ws"] and plan["items"] > plan["checked_blocks"], plan
    o = out.cpu().numpy()
    bad = np.isnan(ref)
    assert np.array_equal(np.isnan(o), bad), "NaN rows differ from the reference's"
    assert bad[0, 4:8, 1000:].all() and bad[1, 12:, 300:].all() and not bad[0, :4].any() and not bad[1, :12].any()
    check_nmse(np.where(bad, 0, o).astype(np.float16), np.where(bad, 0, ref).astype(np.float16), AC.REF_TOL,
               f"ws checked companion {v_format} D={D} S={S} plan={plan}")


@pytest.mark.parametrize("D,S,causal", [(128, 3000, True), (64, 1536, True), (256, 2000, False), (128, 700, False)])
def test_ws_v_scan_after_the_kernel_matches_ks_pass(torch_cuda, D, S, causal):
    """The warp-specialized prefill's float16 V scanned behind the kernel (ws_late_scan, the default: the kernel runs
    every head, the checked companion the flagged ones again once the scan has flagged them) and in K's pass before it
    (ws_late_scan=0: the kernel skips the flagged heads) give the same output bits, with NaN / Inf V in three heads of
    eight (one in a partial last tile), K past float16 in another, and more work items than blocks."""
    torch = torch_cuda
    q, kp, ks, v = _qk16_inputs(torch, 31, 2, 16, 4, S, D)
    v[0, 1, S // 2, 5] = np.float16("inf")
    v[1, 3, 300, D - 1] = np.float16("nan")
    v[1, 0, S - 1, 0] = np.float16("-inf")
    k = R.pack_k(np.random.default_rng(3).standard_normal((2, 4, S, D)).astype(np.float32) * 2e5)
    kp[0, 2], ks[0, 2] = k[0][0, 2], k[1][0, 2]  # head 2 of batch 0: K scales past 515.5
    t = [to_device(torch, a) for a in (q, kp, ks, v, None)]
    (late, a), (early, b) = (_ws_persistent_out(torch, t, q.shape, ov, causal)
                             for ov in (K16W, K16W + ",ws_late_scan=0"))
    assert late["late_scan"] and not early["late_scan"], (late, early)
    assert np.isnan(a[1, 12:]).any() and not np.isnan(a[0, :4]).any()  # flagged heads' rows, clean ones'
    assert np.array_equal(a, b, equal_nan=True)


def _ws_persistent_out(torch, t, q_shape, overrides: str, causal: bool):
    """One call of the warp-specialized prefill on the device inputs t (q, K payload, K scales, float16 V, None) with
    more work items than blocks, so every block walks several: (its plan, its output as numpy)."""
    out = torch.full(q_shape, float("nan"), dtype=torch.float16, device="cuda")
    plan = native.TorchAttention(*t, out, v_format="float", route="prefill", causal=causal,
                                 overrides=overrides)(return_plan=True)
    torch.cuda.synchronize()
    assert plan["ws"] and plan["persistent"] and plan["items"] > plan["blocks"], plan
    return plan, out.cpu().numpy()


@pytest.mark.parametrize("D,S", [(128, 4096), (64, 3000), (256, 4096)])
def test_ws_deals_give_the_same_output(torch_cuda, D, S):
    """The warp-specialized prefill's persistent deal (which block takes which work item: odd rounds right to left by
    default, or round-robin) and its causal items' order (position-major over all heads, or within groups of 1 or 3
    KV heads, the last group short) change only the order: all give the same output bit for bit, and that matches
    reference.attention (qk_f16). Causal, more items than SMs, Sq a multiple of 128 or not (position-major items or
    row chunks), a last round that does not fill the grid."""
    torch = torch_cuda
    q, kp, ks, v = _qk16_inputs(torch, 31, 2, 8, 2, S, D)
    t = [to_device(torch, a) for a in (q, kp, ks, v, None)]
    outs = {}
    for deal in ("", ",ws_snake=0", ",ws_group=1", ",ws_group=3,ws_snake=0"):
        plan, outs[deal] = _ws_persistent_out(torch, t, q.shape, K16W + deal, True)
        assert plan["snake"] == ("snake" not in deal), (deal, plan)
        assert plan["group"] == (int(deal.split("ws_group=")[1].split(",")[0]) if "group" in deal else 0), plan
    first = outs[""]
    for deal, o in outs.items():
        assert np.array_equal(o, first), f"ws D={D} S={S}: the deal {deal!r} differs from the default one"
    ref = R.attention(q, kp, ks, v, None, None, causal=1, v_format="float", qk_f16=True)
    check_nmse(first, ref.astype(np.float16), AC.REF_TOL, f"ws deals D={D} S={S}")


@pytest.mark.parametrize("D,Sq,Sk,causal", [
    (128, 4096, 4096, True),   # position-major items, every warpgroup's tiles all with work
    (128, 1024, 3072, True),   # a chunk over a longer past, its items one KV head after another (ws_group=1)
    (128, 1000, 1064, True),   # a chunk over 64 keys more: the first warpgroup's last tile of an item has no work
    (64, 3000, 3000, True),    # row chunks
    (128, 700, 400, True),     # fewer keys than rows: the first 300 rows see none (zeros)
    (128, 1500, 2500, False),  # no mask: every tile of every item has work
    (256, 2048, 2112, True),
    (64, 1000, 1064, True),
])
def test_ws_loop_across_items_matches_the_reference(torch_cuda, D, Sq, Sk, causal):
    """The warp-specialized prefill's consumers run their loop across work items (an item's first Q.K issued with
    the item before's last P.V, its rows stored after it, the next item's Q copied in and quantized in place): with
    more items than SMs every block walks several, including items whose first warpgroup has tiles without work,
    rows that see no key (exact zeros), row chunks and no mask. Against reference.attention (qk_f16), and bit-equal
    from one call to the next."""
    torch = torch_cuda
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the QK16 prefill runs on sm_90a")
    rng = np.random.default_rng(37)
    B, Hq, Hkv = 2, 16, 8
    q = rng.standard_normal((B, Hq, Sq, D)).astype(np.float16)
    kp, ks = R.pack_k(rng.standard_normal((B, Hkv, Sk, D)).astype(np.float16))
    v = rng.standard_normal((B, Hkv, Sk, D)).astype(np.float16)
    t = [to_device(torch, a) for a in (q, kp, ks, v, None)]
    grouped = causal and Sq % 128 == 0 and Sk - Sq >= Sq
    runs = [_ws_persistent_out(torch, t, q.shape, K16W + (",ws_group=1" if grouped else ""), causal)
            for _ in range(2)]
    outs = [o for _, o in runs]
    assert runs[0][0]["group"] == int(grouped), runs[0][0]
    assert np.array_equal(outs[0], outs[1]), f"ws D={D} Sq={Sq} Sk={Sk}: two calls differ"
    ref = R.attention(q, kp, ks, v, None, None, causal=int(causal), v_format="float", qk_f16=True)
    check_nmse(outs[0], ref.astype(np.float16), AC.REF_TOL, f"ws D={D} Sq={Sq} Sk={Sk} causal={causal}")
    if causal and Sk < Sq:
        assert not outs[0][:, :, :Sq - Sk].any(), "rows that see no key are not zeros"


@pytest.mark.parametrize("D,overrides,v_format", [
    (128, K16, "q8_0"), (128, K16O, "q8_0"), (256, K16, "q8_0"), (64, K16W, "q8_0"), (128, K16W, "q8_0"),
    (128, K16W64, "q8_0"), (256, K16W, "q8_0"),
    (64, K16W, "float"), (128, K16W, "float"), (256, K16W, "float")])  # float16 V: scanned after the ws kernel
def test_qk16_prefill_streams_and_graph(torch_cuda, D, overrides, v_format):
    """The QK16 prefill (K's float16 copy, its flags, V's copy and scan, then the kernel; at D = 256 the kernel with Q
    in shared memory; with float16 V the warp-specialized kernel, the V scan behind it and the checked companion) on
    four streams at once equals one call bit for bit, and captured into a CUDA graph and replayed it matches the
    reference (qk_f16)."""
    torch = torch_cuda
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the QK16 prefill runs on sm_90a")
    rng = np.random.default_rng(23)
    B, Hq, Hkv, S = 1, 8, 2, 2000
    q = (rng.standard_normal((B, Hq, S, D)) * 3).astype(np.float16)
    kp, ks = R.pack_k(rng.standard_normal((B, Hkv, S, D)).astype(np.float16))
    v = rng.standard_normal((B, Hkv, S, D)).astype(np.float16)
    value, vs = (v, None) if v_format == "float" else R.pack_v(v, v_format)
    ref = R.attention(q, kp, ks, value, vs, None, causal=1, v_format=v_format, qk_f16=True)
    t = [to_device(torch, a) for a in (q, kp, ks, value, vs)]
    new = lambda: native.TorchAttention(*t, torch.empty_like(t[0]), v_format=v_format, route="prefill",  # noqa: E731
                                        overrides=overrides)
    p = native.gpu_plan(new().call)
    assert p["k_dequant"] and p["ws"] == overrides.startswith(K16W), p
    assert p.get("late_scan", False) == (v_format == "float"), p

    def same_bits(out, want):
        assert torch.equal(out, want), "QK16 prefill graph replay differs from a direct call"

    want = _streams_and_graph(torch, new, 8, "QK16 prefill", same_bits)
    check_nmse(want.cpu().numpy(), ref, AC.REF_TOL, f"QK16 {overrides}")
