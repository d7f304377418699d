"""Decode kernel time (no ONNX Runtime): Dot4Attention's auto route (decode < 2048 keys, split_k above) through the
dot4attn_gpu_attention C entry, vs torch SDPA cuDNN / flash (f16), B = 1, Sq = 1, CUDA events, L2 flushed before
every call (python/dot4attn/bench_cuda.py's timer), median of --repeats. Env DOT4ATTN_GPU_DECODE=simt times the SIMT
decode kernel instead of the tensor-core one, =tile the old tile kernel; DOT4ATTN_DECODE_NW / _NST force the decode
kernel's warps / stages, DOT4ATTN_SPLIT_WAVES split_k's split count (SMs x waves items); --route forces a route.
    DOT4ATTN_LIBRARY=build/gpu/libdot4attn_ops.so python3 tools/gpu_time_decode.py --baselines --out t.json
"""
import argparse, json, sys
import torch

sys.path.insert(0, "python")
from dot4attn import bench_cuda as BC  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--baselines", action="store_true", help="also time SDPA cuDNN and flash")
    ap.add_argument("--heads", default="32,8,128;24,4,256")
    ap.add_argument("--sk", default="512,4096,16384,65536,131072")
    ap.add_argument("--formats", default="float,q8_0,q4_0")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--route", default="auto", choices=["auto", "decode", "split_k"])
    ap.add_argument("--label", default="")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    f = BC._lib()
    timer = BC._Timer(torch, a.repeats)
    rows = []
    for hs in a.heads.split(";"):
        hq, hkv, d = map(int, hs.split(","))
        for sk in map(int, a.sk.split(",")):
            torch.manual_seed(0)
            q = torch.randn(1, hq, 1, d, device="cuda", dtype=torch.float16) * 3
            k = torch.randn(1, hkv, sk, d, device="cuda", dtype=torch.float16)
            v = torch.randn(1, hkv, sk, d, device="cuda", dtype=torch.float16)
            kp, ks = BC._pack(torch, k, "q8_0")
            r = {"heads": [hq, hkv, d], "Sk": sk, "label": a.label}
            ref = None
            if a.baselines:
                for name, bk in (("sdpa_cudnn", "cudnn"), ("sdpa_flash", "flash")):
                    try:
                        fn = BC._sdpa(torch, bk, q, k, v, False)
                        ref = fn().float() if ref is None else ref
                        r[name] = timer(fn)
                    except Exception as e:  # noqa: BLE001
                        r[name] = None
                        print(name, "failed:", str(e)[:100])
            for fmt in a.formats.split(","):
                vp, vs = (v, None) if fmt == "float" else BC._pack(torch, v, fmt)
                dd = BC._D4A(torch, f, q, kp, ks, vp, vs, fmt, True, route=a.route)
                dd()
                name = {"float": "d4a_f16", "q8_0": "d4a_q8_0", "q4_0": "d4a_q4_0"}[fmt]
                r[name] = timer(dd)
                kvb = kp.numel() + ks.numel() * 2 + vp.numel() * vp.element_size() + (vs.numel() * 2 if vs is not None else 0)
                r[name + "_TBps"] = kvb / (r[name] * 1e-6) / 1e12
                r["splits"] = dd.n_splits
                if ref is not None:
                    r[name + "_nmse_vs_sdpa"] = BC._nmse(dd.out.float(), ref)
            rows.append(r)
            print(json.dumps({k_: (round(v_, 2) if isinstance(v_, float) and v_ > 1e-3 else v_) for k_, v_ in r.items()}),
                  flush=True)
            del q, k, v, kp, ks, ref
            torch.cuda.empty_cache()
    if a.out:
        json.dump(rows, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
