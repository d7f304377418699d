"""Kernel-level correctness check of the GPU decode / split_k routes (no ONNX Runtime): Dot4Attention through the
library's dot4attn_gpu_attention_masked C entry on torch tensors vs python/dot4attn/reference.py, over a
representative set (decode and split_k forced; D 32..256; g 1/4/8; Sq 1/4/8 (up to 64 rows per KV head); bool /
additive masks through broadcast strides; causal 0/1; f16 / f32; float / q8_0 / q4_0 V; Sk 0/1/63/512/4097/70000;
rows with no visible key). Prints a pass/fail table; exit status 1 on any failure. --streams: split_k on four
streams at once and under CUDA graph capture instead (stage 1 + the programmatic-dependent merge launch).
    DOT4ATTN_LIBRARY=build/gpu/libdot4attn_ops.so python3 tools/gpu_check_decode.py [--small] [--out FILE]
--small: a few quick cases (for compute-sanitizer), both decode kernels (tensor-core: float16 T, D 64/128/256).
--pool PCT: split_k with the opt-in key pool (DOT4ATTN_SPLIT_POOL=PCT) on long walks (>= 24 chunks per warp, where
the launcher takes it on sm_90), plus a CUDA graph replay of such a call (zeroing kernel + dependent stage 1).
"""
import argparse, ctypes, os, sys
import numpy as np
import torch

sys.path.insert(0, "python")
import dot4attn  # noqa: E402
from dot4attn import reference as R  # noqa: E402

ROUTES = {"decode": 2, "split_k": 3}
VFMT = {"float": 0, "q8_0": 1, "q4_0": 2}


def lib():
    f = ctypes.CDLL(dot4attn.get_library_path()).dot4attn_gpu_attention_masked
    i64, i32, vp = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p
    f.argtypes = [i64, i64, i64, i64, i64, i32, i32, i32, i32, i32, ctypes.c_float, i64, vp, vp, vp, vp, vp, vp,
                  vp, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(i64), vp, ctypes.c_char_p, ctypes.c_size_t,
                  i32, vp, ctypes.POINTER(i64)]
    f.restype = i32
    return f


def make_qkv(rng, B, Hq, Hkv, Sq, Sk, D, vf, half):
    """Query (x3), packed K, V in format vf (float: as drawn) and its scales (None for float), as numpy arrays."""
    dt = np.float16 if half else np.float32
    q = (rng.standard_normal((B, Hq, Sq, D), dtype=np.float32) * 3).astype(dt)
    k = rng.standard_normal((B, Hkv, Sk, D), dtype=np.float32).astype(np.float16)
    v = rng.standard_normal((B, Hkv, Sk, D), dtype=np.float32).astype(dt)
    kp, ks = R.pack_k(k)
    vp, vs = (v, None) if vf == "float" else R.pack_v(v, vf)
    return q, kp, ks, vp, vs


def to_gpu(a):
    return torch.from_numpy(np.ascontiguousarray(a)).cuda()


def gpu_inputs(q, kp, ks, vp, vs):
    """make_qkv's arrays on the GPU (the float16 scales as raw 16-bit words)."""
    tvs = None if vs is None else to_gpu(vs.view(np.int16))
    return to_gpu(q), to_gpu(kp), to_gpu(ks.view(np.int16)), to_gpu(vp), tvs


def call_entry(f, args, inputs, out, scratch, stream, sizes=(None, None), mask=(0, None, None)):
    """One call of the C entry. inputs: (q, K payload, K scales, V, V scales or None) on the GPU; scratch: a tensor,
    or None with sizes = (byref size_t, byref int64) to ask for the scratch bytes and split count; mask: (kind,
    tensor or None, strides or None)."""
    err = ctypes.create_string_buffer(512)
    ptrs = [None if x is None else x.data_ptr() for x in (*inputs, out, scratch)]
    mk, tm, strides = mask
    if f(*args, *ptrs, *sizes, stream, err, 512, mk, None if tm is None else tm.data_ptr(), strides):
        raise RuntimeError(err.value.decode())


def run_case(f, rng, B, Hq, Hkv, Sq, Sk, D, vf, causal, route, mask, half):
    dt = np.float16 if half else np.float32
    q, kp, ks, vp, vs = make_qkv(rng, B, Hq, Hkv, Sq, Sk, D, vf, half)
    m = None
    if mask == "bool":  # [B, Hq, Sq, Sk], ~20 % hidden, row (0, 0, 0) fully hidden (a dead row)
        m = rng.random((B, Hq, Sq, Sk)) > 0.2
        m[0, 0, 0, :] = False
    elif mask == "bool_bcast":  # [1, 1, Sq, Sk]
        m = rng.random((1, 1, Sq, Sk)) > 0.5
    elif mask == "add":  # [B, 1, Sq, Sk] additive, some -inf, one row all -inf
        m = (rng.standard_normal((B, 1, Sq, Sk)) * 2).astype(dt)
        m[rng.random(m.shape) < 0.1] = -np.inf
        m[0, 0, Sq - 1, :] = -np.inf
    ref = R.attention(q, kp, ks, vp, vs, m, causal=causal, v_format=vf)
    inputs = gpu_inputs(q, kp, ks, vp, vs)
    tm, strides = None, None
    if m is not None:
        tm = to_gpu(m.astype(np.uint8) if m.dtype == np.bool_ else m)
        st = [s // m.itemsize if n > 1 else 0 for s, n in zip(m.strides, m.shape)]
        strides = (ctypes.c_int64 * 4)(*st)
    out = torch.full(q.shape, float("nan"), dtype=inputs[0].dtype, device="cuda")
    nbytes, nsp = ctypes.c_size_t(0), ctypes.c_int64(0)
    mk = (0 if m is None else (1 if m.dtype == np.bool_ else 2), tm, strides)
    stream = torch.cuda.current_stream().cuda_stream
    args = (B, Hq, Hkv, Sq, Sk, D, int(half), VFMT[vf], causal, ROUTES[route], 0.0, 2048)
    call_entry(f, args, inputs, out, None, stream, (ctypes.byref(nbytes), ctypes.byref(nsp)), mk)
    scratch = torch.empty(max(1, nbytes.value), dtype=torch.uint8, device="cuda") if nbytes.value else None
    call_entry(f, args, inputs, out, scratch, stream, mask=mk)
    torch.cuda.synchronize()
    o = out.cpu().numpy()
    e = R.nmse(o, ref)
    dead = np.all(ref == 0, axis=-1)  # rows with no visible key: exact zeros
    dead_ok = bool(np.all(o[dead] == 0)) if dead.any() else True
    ok = bool(np.isfinite(o).all() and e <= 1e-6 and dead_ok)
    return ok, e, int(nsp.value), int(dead.sum()), dead_ok


# (B, Hq, Hkv, Sq, Sk, D, v_format, causal, route, mask, half)
CASES = [
    (1, 8, 8, 1, 512, 128, "q4_0", 1, "decode", None, 1),
    (1, 32, 8, 1, 512, 128, "q4_0", 1, "decode", None, 1),
    (1, 32, 8, 1, 512, 128, "float", 1, "decode", None, 1),
    (1, 32, 8, 1, 512, 128, "q8_0", 0, "decode", None, 0),
    (1, 32, 8, 1, 4097, 128, "float", 1, "split_k", None, 1),
    (1, 32, 8, 1, 4097, 128, "q4_0", 1, "split_k", None, 0),
    (1, 32, 4, 1, 70000, 128, "q4_0", 1, "split_k", None, 1),
    (1, 32, 4, 1, 70000, 128, "float", 1, "split_k", None, 1),
    (1, 24, 4, 1, 70000, 256, "q8_0", 1, "split_k", None, 1),
    (2, 16, 2, 4, 63, 64, "q8_0", 1, "decode", "bool", 0),
    (2, 16, 2, 4, 63, 64, "q4_0", 1, "split_k", "bool", 1),
    (1, 8, 2, 8, 512, 32, "q4_0", 1, "split_k", "add", 1),
    (1, 8, 2, 8, 512, 32, "float", 0, "decode", "add", 0),
    (1, 4, 4, 8, 1, 256, "float", 1, "decode", None, 0),
    (1, 4, 4, 8, 1, 256, "q4_0", 1, "split_k", None, 1),
    (1, 8, 1, 8, 4097, 256, "q8_0", 0, "split_k", "bool", 1),
    (1, 8, 1, 8, 4097, 256, "float", 1, "decode", "bool_bcast", 0),
    (1, 8, 2, 1, 0, 128, "q4_0", 1, "decode", None, 1),
    (1, 8, 2, 1, 0, 128, "float", 1, "split_k", None, 0),
    (1, 12, 4, 2, 777, 96, "q4_0", 1, "decode", None, 1),
    (1, 12, 4, 2, 4097, 160, "q8_0", 1, "split_k", "add", 1),
    (2, 6, 3, 3, 1000, 224, "float", 0, "split_k", None, 0),
    (1, 6, 3, 1, 1000, 192, "float", 1, "decode", None, 0),
    (3, 4, 1, 1, 63, 32, "q8_0", 1, "decode", None, 1),
    (1, 4, 1, 4, 4097, 32, "float", 1, "split_k", "bool", 0),
    (1, 8, 8, 1, 70000, 64, "q4_0", 0, "split_k", None, 1),
    (1, 16, 2, 4, 512, 64, "float", 1, "split_k", "add", 1),
    (1, 32, 8, 4, 4097, 128, "q4_0", 1, "decode", "bool_bcast", 1),
    (1, 32, 8, 8, 512, 128, "q8_0", 1, "split_k", None, 0),
    (1, 64, 8, 8, 512, 128, "q4_0", 1, "decode", "add", 1),
    (1, 64, 8, 8, 4097, 64, "float", 1, "split_k", "bool", 1),
    (1, 2, 2, 1, 1, 128, "q4_0", 1, "split_k", None, 1),
    (1, 2, 1, 5, 33, 32, "q8_0", 1, "decode", None, 0),
    (2, 32, 8, 1, 16384, 128, "q4_0", 1, "split_k", None, 1),
]
# the key pool engages at >= 24 chunks per warp: 131072 keys over 33 splits for B x Hkv = 8
POOL_CASES = [
    (1, 32, 8, 1, 131072, 128, "q4_0", 1, "split_k", None, 1),
    (1, 32, 8, 1, 131072, 128, "q8_0", 0, "split_k", "bool_bcast", 1),
    (1, 32, 8, 1, 131072, 128, "float", 1, "split_k", None, 1),
    (1, 32, 8, 4, 120000, 128, "q4_0", 1, "split_k", None, 1),  # two row chunks per KV head: two pools
]
SMALL = [CASES[i] for i in (1, 2, 5, 9, 10, 11, 13, 14, 17, 19, 21, 29)]  # float16 D 64/128/256: tensor cores


def stream_checks(f, pool=False):
    """split_k launched on four streams at once, 30 times each, must give the single-stream output bit for bit;
    captured into a CUDA graph (stage 1 and the programmatic-dependent merge launch) and replayed, it must match the
    reference. pool: a long call with the key pool instead, graph replay only (its summation order depends on
    timing, so there is no bitwise check). Returns the number of failures."""
    B, Hq, Hkv, Sq, Sk, D = (1, 32, 8, 1, 131072, 128) if pool else (2, 32, 8, 1, 16384, 128)
    q, kp, ks, vp, vs = make_qkv(np.random.default_rng(5), B, Hq, Hkv, Sq, Sk, D, "q4_0", 1)
    ref = R.attention(q, kp, ks, vp, vs, None, causal=1, v_format="q4_0")
    inputs = gpu_inputs(q, kp, ks, vp, vs)
    args = (B, Hq, Hkv, Sq, Sk, D, 1, VFMT["q4_0"], 1, ROUTES["split_k"], 0.0, 2048)
    nbytes, nsp = ctypes.c_size_t(0), ctypes.c_int64(0)
    new_out = lambda: torch.empty_like(inputs[0])  # noqa: E731
    new_scratch = lambda: torch.empty(nbytes.value, dtype=torch.uint8, device="cuda")  # noqa: E731

    def call(out, scratch, stream):
        call_entry(f, args, inputs, out, scratch, stream)

    stream = torch.cuda.current_stream().cuda_stream
    call_entry(f, args, inputs, new_out(), None, stream, (ctypes.byref(nbytes), ctypes.byref(nsp)))
    want = new_out()
    call(want, new_scratch(), stream)
    torch.cuda.synchronize()
    fails = 0
    if pool:
        e = R.nmse(want.cpu().numpy(), ref)
        ok = bool(np.isfinite(e) and e <= 1e-6)
        print(f"| pool call | key pool, one call vs reference (NMSE {e:.1e}) | {'PASS' if ok else 'FAIL'} |")
        fails += not ok
    streams = [torch.cuda.Stream() for _ in range(0 if pool else 4)]
    outs = [[new_out() for _ in range(30)] for _ in streams]
    scrs = [new_scratch() for _ in streams]
    torch.cuda.synchronize()
    for i in range(30):
        for s, st in enumerate(streams):
            call(outs[s][i], scrs[s], st.cuda_stream)
    torch.cuda.synchronize()
    if not pool:
        bad = sum(not torch.equal(o, want) for lst in outs for o in lst)
        res = "PASS" if bad == 0 else f"FAIL ({bad} differ)"
        print(f"| streams | 4 streams x 30 calls, bitwise equal to one call | {res} |")
        fails += bad != 0
    g_out, g_scr = new_out(), new_scratch()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call(g_out, g_scr, side.cuda_stream)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call(g_out, g_scr, torch.cuda.current_stream().cuda_stream)
    ok = True
    for _ in range(3):
        g_out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        e = R.nmse(g_out.cpu().numpy(), ref)
        ok = ok and bool(np.isfinite(e) and e <= 1e-6)
    print(f"| graph | captured split_k replayed 3 times vs reference (NMSE {e:.1e}) | {'PASS' if ok else 'FAIL'} |")
    fails += not ok
    return fails


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--streams", action="store_true", help="only the multi-stream and CUDA graph checks")
    ap.add_argument("--pool", type=int, default=0, help="check split_k with the key pool at this percentage")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if a.pool:
        os.environ["DOT4ATTN_SPLIT_POOL"] = str(a.pool)  # read once, at the library's first launch
    f = lib()
    if a.streams:
        return 1 if stream_checks(f) else 0
    rng = np.random.default_rng(0)
    lines = ["| # | B,Hq,Hkv,Sq,Sk,D | V | causal | route | mask | T | splits | dead rows | nmse | result |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    fails = 0
    for n, c in enumerate(POOL_CASES if a.pool else SMALL if a.small else CASES):
        B, Hq, Hkv, Sq, Sk, D, vf, causal, route, mask, half = c
        try:
            ok, e, ns, nd, dok = run_case(f, rng, *c)
            res = "PASS" if ok else ("FAIL" + ("" if dok else " (dead rows not zero)"))
        except Exception as ex:  # noqa: BLE001
            ok, e, ns, nd, res = False, float("nan"), 0, 0, f"ERROR {ex}"
        fails += not ok
        lines.append(f"| {n} | {B},{Hq},{Hkv},{Sq},{Sk},{D} | {vf} | {causal} | {route} | {mask or '-'} | "
                     f"{'f16' if half else 'f32'} | {ns} | {nd} | {e:.1e} | {res} |")
        print(lines[-1], flush=True)
    n_cases = len(lines) - 2
    if a.pool:  # the graph rows count as one more check each
        sf = stream_checks(f, pool=True)
        n_cases, fails = n_cases + 2, fails + sf
    lines.append(f"\n{n_cases - fails} passed, {fails} failed")
    print(lines[-1])
    if a.out:
        open(a.out, "w").write("\n".join(lines) + "\n")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
