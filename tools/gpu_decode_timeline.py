"""Where a Dot4Attention decode call's time goes, without ONNX Runtime (H200 numbers: docs/gpu.md, eighth session).
For (32, 8, 128), q4_0 and float16 V, at 512 / 16k / 128k keys, through the dot4attn_gpu_attention C entry:
  host_us_per_call   host time of one call (2000 calls without synchronising; once the launch queue is full this is
                     the GPU time instead, so it reads as host cost only where it exceeds the kernels)
  stage1_us_med      the decode / split_k stage-1 kernel (torch.profiler, L2 flushed as by the benchmark's timer)
  stage1_end_to_merge_end_us_med   split_k: from the end of stage 1 to the end of the merge kernel (the tail)
  events_us          the benchmark's CUDA-event time of the whole call
    DOT4ATTN_LIBRARY=build/gpu/libdot4attn_ops.so python3 tools/gpu_decode_timeline.py
"""
import sys, json, time, torch
sys.path.insert(0, "python")
from dot4attn import bench_cuda as BC
from torch.profiler import profile, ProfilerActivity
f = BC._lib()
timer = BC._Timer(torch, 20)  # the benchmark's timer; its 256 MiB buffer also flushes L2 in the profiled loop
for sk in (512, 16384, 131072):
    torch.manual_seed(0)
    q = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.float16) * 3
    k = torch.randn(1, 8, sk, 128, device="cuda", dtype=torch.float16)
    v = torch.randn(1, 8, sk, 128, device="cuda", dtype=torch.float16)
    kp, ks = BC._pack(torch, k, "q8_0")
    for fmt in ("q4_0", "float"):
        vp, vs = (v, None) if fmt == "float" else BC._pack(torch, v, fmt)
        dd = BC._D4A(torch, f, q, kp, ks, vp, vs, fmt, True)
        dd(); torch.cuda.synchronize()
        # host cost: launches without sync
        n = 2000
        t0 = time.perf_counter()
        for _ in range(n): dd()
        t1 = time.perf_counter(); torch.cuda.synchronize(); t2 = time.perf_counter()
        host_us = (t1 - t0) / n * 1e6
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                timer.flush.zero_()
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record(); dd(); e.record()
            torch.cuda.synchronize()
        ev = [x for x in prof.events() if x.device_type == torch.autograd.DeviceType.CUDA]
        ks_ = sorted([x for x in ev if "decode_mma" in x.name or "merge_kernel" in x.name or "decode_kernel" in x.name],
                     key=lambda x: x.time_range.start)
        st = [x for x in ks_ if "merge" not in x.name]; mg = [x for x in ks_ if "merge" in x.name]
        d1 = sorted(x.time_range.elapsed_us() for x in st)
        out = {"Sk": sk, "fmt": fmt, "host_us_per_call": round(host_us, 2), "stage1_us_med": round(d1[len(d1) // 2], 2)}
        if mg:
            d2 = sorted(x.time_range.elapsed_us() for x in mg)
            gaps = sorted(m.time_range.end - s_.time_range.end for s_, m in zip(st, mg))
            out.update({"merge_us_med": round(d2[len(d2) // 2], 2), "stage1_end_to_merge_end_us_med": round(gaps[len(gaps) // 2], 2)})
        out["events_us"] = round(timer(dd), 2)
        print(json.dumps(out), flush=True)
