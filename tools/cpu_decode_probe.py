"""CPU decode kernel probe: cost per (key, KV head) of one Dot4Attention decode, for kernel tuning.

Not a benchmark against baselines (that is `dot4attn bench`): it isolates the kernel's own cost. With one thread
(default) it reports CPU time of the calling thread (time.thread_time), so other load on the machine does not
inflate it; --flush touches a 96 MiB buffer between runs so K/V come from DRAM (as in the bench, where other
candidates evict them) instead of cache. The numbers behind docs/bench.md's "spread prefetching" paragraph:

    PYTHONPATH=python python3 tools/cpu_decode_probe.py --sk 2048            # from cache
    PYTHONPATH=python python3 tools/cpu_decode_probe.py --sk 16384 --flush   # from DRAM

DOT4ATTN_LIBRARY picks the library build, DOT4ATTN_CPU_ISA the ISA path, as everywhere.
"""
import argparse
import os
import time

import numpy as np

from dot4attn import onnx_builders as B
from dot4attn import reference as R


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--heads", default="32,8,128", help="Hq,Hkv,D (default 32,8,128)")
    ap.add_argument("--sk", type=int, default=16384)
    ap.add_argument("--formats", default="float,q8_0,q4_0", help="V formats (float = f16 V)")
    ap.add_argument("--route", default="decode", choices=["auto", "decode", "split_k"])
    ap.add_argument("--threads", type=int, default=1, help=">1: wall clock instead of thread CPU time")
    ap.add_argument("--flush", action="store_true", help="evict K/V from the caches before every run")
    ap.add_argument("--runs", type=int, default=15, help="timed runs per format (the minimum is reported)")
    a = ap.parse_args()
    hq, hkv, d = map(int, a.heads.split(","))
    rng = np.random.default_rng(0)
    q = (rng.standard_normal((1, hq, 1, d)) * 3).astype(np.float16)
    k = rng.standard_normal((1, hkv, a.sk, d)).astype(np.float32)
    v = rng.standard_normal((1, hkv, a.sk, d)).astype(np.float32)
    kp, ks = R.pack_k(k)
    clock = time.thread_time if a.threads == 1 else time.perf_counter
    junk = np.ones(96 << 20, np.uint8) if a.flush else None
    for fmt in a.formats.split(","):
        vv, vs = (v.astype(np.float16), None) if fmt == "float" else R.pack_v(v, fmt)
        sess = B.session(B.attention_model(np.float16, fmt, route=a.route), threads=a.threads)
        feeds = {"query": q, "k_payload": kp, "k_scales": ks, "value": vv}
        if vs is not None:
            feeds["v_scales"] = vs
        sess.run(None, feeds)
        best = float("inf")
        for _ in range(a.runs):
            if junk is not None:
                junk += 1
            t0 = clock()
            sess.run(None, feeds)
            best = min(best, clock() - t0)
        per = best * 1e9 / (a.sk * hkv) * (a.threads if a.threads > 1 else 1)
        print(f"V={fmt:5s} ({hq},{hkv},{d}) Sk={a.sk} route={a.route} threads={a.threads} "
              f"{'DRAM' if a.flush else 'cache'}: {best * 1e3:.3f} ms, {per:.1f} ns per (key, KV head) per thread")
    print(f"(load average {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
