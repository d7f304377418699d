"""Prefill kernel time (no ONNX Runtime): Dot4Attention's prefill route (causal, Sq = Sk, query f16) through the
dot4attn_gpu_attention C entry, vs torch SDPA flash (FlashAttention-2) and cuDNN (f16), B = 1, CUDA events,
L2 flushed before every call (python/dot4attn/bench_cuda.py's timer), median of --repeats.
--tile also times the old tile kernel (DOT4ATTN_GPU_PREFILL=tile) at S <= --tile-max.
    DOT4ATTN_LIBRARY=build/gpu/libdot4attn_ops.so python3 tools/gpu_time_prefill.py --baselines --out t.json
"""
import argparse, json, os, sys
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from dot4attn import bench_cuda as BC  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--baselines", action="store_true", help="also time SDPA flash and cuDNN")
    ap.add_argument("--heads", default="32,8,128;24,4,256")
    ap.add_argument("--s", default="2048,8192,32768")
    ap.add_argument("--formats", default="float,q8_0,q4_0")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--tile", action="store_true")
    ap.add_argument("--tile-max", type=int, default=8192)
    ap.add_argument("--label", default="")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    f = BC._lib()
    timer = BC._Timer(torch, a.repeats)
    rows = []
    for hs in a.heads.split(";"):
        hq, hkv, d = map(int, hs.split(","))
        for s in map(int, a.s.split(",")):
            torch.manual_seed(0)
            q = torch.randn(1, hq, s, d, device="cuda", dtype=torch.float16)
            k = torch.randn(1, hkv, s, d, device="cuda", dtype=torch.float16)
            v = torch.randn(1, hkv, s, d, device="cuda", dtype=torch.float16)
            kp, ks = BC._pack(torch, k, "q8_0")
            flops = 4.0 * hq * s * s * d / 2
            r = {"heads": [hq, hkv, d], "S": s, "label": a.label}
            ref = None
            if a.baselines:
                for name, bk in (("sdpa_flash", "flash"), ("sdpa_cudnn", "cudnn")):
                    try:
                        fn = BC._sdpa(torch, bk, q, k, v, True)
                        ref = fn().float() if ref is None else ref
                        r[name] = timer(fn)
                    except Exception as e:  # noqa: BLE001
                        r[name] = None
                        print(name, "failed:", str(e)[:100])
            for fmt in a.formats.split(","):
                vp, vs = (v, None) if fmt == "float" else BC._pack(torch, v, fmt)
                dd = BC._D4A(torch, f, q, kp, ks, vp, vs, fmt, True, route="prefill")
                dd()
                name = {"float": "d4a_f16", "q8_0": "d4a_q8_0", "q4_0": "d4a_q4_0"}[fmt]
                r[name] = timer(dd)
                r[name + "_TFLOPs"] = flops / (r[name] * 1e-6) / 1e12
                if ref is not None:
                    r[name + "_nmse_vs_sdpa"] = BC._nmse(dd.out.float(), ref)
                if a.tile and s <= a.tile_max:
                    os.environ["DOT4ATTN_GPU_PREFILL"] = "tile"
                    r[name + "_tile"] = timer(dd)
                    os.environ.pop("DOT4ATTN_GPU_PREFILL")
            if r.get("sdpa_flash"):
                r["speed_vs_fa2_f16"] = r["sdpa_flash"] / r["d4a_f16"] if "d4a_f16" in r else None
            rows.append(r)
            print(json.dumps({k_: (round(v_, 2) if isinstance(v_, float) and v_ > 1e-3 else v_) for k_, v_ in r.items()}),
                  flush=True)
            del q, k, v, kp, ks, ref
            torch.cuda.empty_cache()
    if a.out:
        json.dump(rows, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
