"""Kernel-level correctness check of the GPU prefill route (no ONNX Runtime): Dot4Attention through the library's
dot4attn_gpu_attention_masked C entry (route forced to prefill) on torch tensors vs python/dot4attn/reference.py.
Covers the tensor-core kernel (gpu/prefill_mma.cuh: D 64/128/256) and its tile-kernel fallback (D 32/96/160):
g 1/4/8; Sq = Sk from 1 to 4096; Sq < Sk and Sq > Sk (bottom-right causal, dead rows); causal 0/1; bool and
additive masks incl. broadcast strides and fully masked rows; f16 / f32; float / q8_0 / q4_0 V. Each case also
runs the old tile kernel (DOT4ATTN_GPU_PREFILL=tile) and reports its NMSE. Exit status 1 on any failure.
    DOT4ATTN_LIBRARY=build/gpu/libdot4attn_ops.so python3 tools/gpu_check_prefill.py [--small] [--out FILE]
--small: a few quick cases (for compute-sanitizer).
"""
import argparse, ctypes, os, sys
import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import dot4attn  # noqa: E402
from dot4attn import reference as R  # noqa: E402

VFMT = {"float": 0, "q8_0": 1, "q4_0": 2}


def lib():
    f = ctypes.CDLL(dot4attn.get_library_path()).dot4attn_gpu_attention_masked
    i64, i32, vp = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p
    f.argtypes = [i64, i64, i64, i64, i64, i32, i32, i32, i32, i32, ctypes.c_float, i64, vp, vp, vp, vp, vp, vp,
                  vp, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(i64), vp, ctypes.c_char_p, ctypes.c_size_t,
                  i32, vp, ctypes.POINTER(i64)]
    f.restype = i32
    return f


def make_mask(rng, kind, B, Hq, Sq, Sk, dt):
    m = None
    if kind == "bool":  # [B, Hq, Sq, Sk], ~20 % hidden, row (0, 0, 0) fully hidden (a dead row)
        m = rng.random((B, Hq, Sq, Sk)) > 0.2
        m[0, 0, 0, :] = False
    elif kind == "bool_bcast":  # [1, 1, Sq, Sk] padding-like: last 10 % of keys hidden, plus random holes
        m = rng.random((1, 1, Sq, Sk)) > 0.1
        m[..., Sk - max(1, Sk // 10):] = False
    elif kind == "bool_key":  # [B, 1, 1, Sk] key padding mask
        m = np.ones((B, 1, 1, Sk), bool)
        m[:, :, :, : Sk // 3] = False
    elif kind == "add":  # [B, 1, Sq, Sk] additive, some -inf, one row all -inf
        m = (rng.standard_normal((B, 1, Sq, Sk)) * 2).astype(dt)
        m[rng.random(m.shape) < 0.1] = -np.inf
        m[0, 0, Sq - 1, :] = -np.inf
    elif kind == "add_head":  # [1, Hq, 1, Sk] per-head additive bias (ALiBi-like)
        m = (-0.05 * np.arange(Sk)[None, None, None, :] * (1 + np.arange(Hq))[None, :, None, None]).astype(dt)
    return m


def run_case(f, rng, B, Hq, Hkv, Sq, Sk, D, vf, causal, mask, half):
    dt = np.float16 if half else np.float32
    q = (rng.standard_normal((B, Hq, Sq, D), dtype=np.float32) * 3).astype(dt)
    k = rng.standard_normal((B, Hkv, Sk, D), dtype=np.float32).astype(np.float16)
    v = rng.standard_normal((B, Hkv, Sk, D), dtype=np.float32).astype(dt)
    kp, ks = R.pack_k(k)
    vp, vs = (v, None) if vf == "float" else R.pack_v(v, vf)
    m = make_mask(rng, mask, B, Hq, Sq, Sk, dt)
    ref = R.attention(q, kp, ks, vp, vs, m, causal=causal, v_format=vf)
    T = lambda a: torch.from_numpy(np.ascontiguousarray(a)).cuda()  # noqa: E731
    tq, tk, tks, tv = T(q), T(kp), T(ks.view(np.int16)), T(vp)
    tvs = None if vs is None else T(vs.view(np.int16))
    tm, strides = None, None
    if m is not None:
        tm = T(m.astype(np.uint8) if m.dtype == np.bool_ else m)
        st = [s // m.itemsize if n > 1 else 0 for s, n in zip(m.strides, m.shape)]
        strides = (ctypes.c_int64 * 4)(*st)
    mk = 0 if m is None else (1 if m.dtype == np.bool_ else 2)
    stream = torch.cuda.current_stream().cuda_stream
    err = ctypes.create_string_buffer(512)

    def call(tile):
        if tile:
            os.environ["DOT4ATTN_GPU_PREFILL"] = "tile"
        else:
            os.environ.pop("DOT4ATTN_GPU_PREFILL", None)
        out = torch.full(q.shape, float("nan"), dtype=tq.dtype, device="cuda")
        rc = f(B, Hq, Hkv, Sq, Sk, D, int(half), VFMT[vf], causal, 1, 0.0, 2048, tq.data_ptr(), tk.data_ptr(),
               tks.data_ptr(), tv.data_ptr(), None if tvs is None else tvs.data_ptr(), out.data_ptr(), None, None,
               None, stream, err, 512, mk, None if tm is None else tm.data_ptr(), strides)
        os.environ.pop("DOT4ATTN_GPU_PREFILL", None)
        if rc:
            raise RuntimeError(err.value.decode())
        torch.cuda.synchronize()
        return out.cpu().numpy()

    o = call(False)
    e = R.nmse(o, ref)
    dead = np.all(ref == 0, axis=-1)  # rows with no visible key: exact zeros
    dead_ok = bool(np.all(o[dead] == 0)) if dead.any() else True
    ok = bool(np.isfinite(o).all() and e <= 1e-6 and dead_ok)
    e_tile = R.nmse(call(True), ref) if Sq * Sk * Hq <= (1 << 28) else float("nan")
    return ok, e, e_tile, int(dead.sum()), dead_ok


# (B, Hq, Hkv, Sq, Sk, D, v_format, causal, mask, half)
CASES = [
    (1, 4, 1, 64, 64, 128, "float", 1, None, 1),
    (1, 4, 4, 1, 1, 128, "float", 1, None, 1),
    (1, 8, 2, 9, 9, 64, "q8_0", 1, None, 1),
    (1, 8, 1, 33, 33, 128, "q4_0", 1, None, 0),
    (1, 8, 8, 65, 65, 256, "float", 1, None, 1),
    (1, 4, 1, 127, 127, 128, "q8_0", 0, None, 1),
    (2, 8, 2, 200, 200, 128, "q4_0", 1, None, 1),
    (1, 8, 8, 300, 300, 64, "q4_0", 0, None, 0),
    (2, 8, 1, 257, 257, 256, "float", 1, None, 0),
    (1, 8, 2, 1000, 1000, 128, "float", 1, None, 1),
    (1, 8, 2, 1000, 1000, 128, "q8_0", 1, None, 1),
    (1, 8, 2, 1000, 1000, 128, "q4_0", 1, None, 1),
    (1, 8, 2, 1000, 1000, 128, "float", 1, None, 0),
    (1, 8, 2, 1000, 1000, 64, "q8_0", 1, None, 0),
    (1, 8, 1, 1000, 1000, 256, "q4_0", 1, None, 1),
    (1, 4, 1, 4096, 4096, 128, "q4_0", 1, None, 1),
    (1, 4, 1, 4096, 4096, 128, "float", 1, None, 1),
    (1, 2, 1, 4096, 4096, 256, "float", 1, None, 1),
    (1, 8, 1, 100, 700, 128, "float", 1, "bool", 1),
    (1, 8, 2, 700, 100, 64, "q8_0", 1, None, 1),
    (1, 8, 2, 700, 100, 128, "q4_0", 1, "add", 0),
    (2, 8, 2, 130, 130, 128, "float", 0, "add", 0),
    (1, 8, 2, 77, 77, 256, "q4_0", 1, "bool_bcast", 1),
    (2, 8, 2, 300, 300, 128, "q8_0", 1, "bool_key", 1),
    (1, 16, 2, 33, 1000, 128, "q4_0", 1, "add", 1),
    (1, 8, 4, 256, 256, 64, "float", 1, "add_head", 1),
    (1, 8, 1, 512, 512, 128, "float", 0, "bool", 0),
    (1, 8, 2, 200, 200, 96, "q8_0", 1, None, 1),     # tile-kernel fallback (D = 96)
    (1, 8, 2, 150, 150, 32, "float", 1, "bool", 0),  # fallback (D = 32)
    (1, 6, 2, 130, 300, 160, "q4_0", 1, None, 1),    # fallback (D = 160)
    (1, 32, 8, 2048, 2048, 128, "float", 1, None, 1),
    (1, 24, 4, 1024, 1024, 256, "q8_0", 1, None, 1),
]
SMALL = [CASES[i] for i in (0, 2, 4, 6, 8, 19, 21, 22, 24, 27)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    f = lib()
    rng = np.random.default_rng(0)
    lines = ["| # | B,Hq,Hkv,Sq,Sk,D | V | causal | mask | T | dead rows | nmse | nmse (tile kernel) | result |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    fails, worst = 0, 0.0
    for n, c in enumerate(SMALL if a.small else CASES):
        B, Hq, Hkv, Sq, Sk, D, vf, causal, mask, half = c
        try:
            ok, e, et, nd, dok = run_case(f, rng, *c)
            res = "PASS" if ok else ("FAIL" + ("" if dok else " (dead rows not zero)"))
            worst = max(worst, e)
        except Exception as ex:  # noqa: BLE001
            ok, e, et, nd, res = False, float("nan"), float("nan"), 0, f"ERROR {ex}"
        fails += not ok
        lines.append(f"| {n} | {B},{Hq},{Hkv},{Sq},{Sk},{D} | {vf} | {causal} | {mask or '-'} | "
                     f"{'f16' if half else 'f32'} | {nd} | {e:.1e} | {et:.1e} | {res} |")
        print(lines[-1], flush=True)
    lines.append(f"\n{len(lines) - 2 - fails} passed, {fails} failed, worst nmse {worst:.2e}")
    print(lines[-1])
    if a.out:
        open(a.out, "w").write("\n".join(lines) + "\n")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
