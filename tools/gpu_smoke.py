"""Kernel-only GPU smoke test (no ONNX Runtime): Dot4Attention through the library's dot4attn_gpu_attention C entry on
torch tensors vs reference.attention, every route and D class. Used under compute-sanitizer racecheck/synccheck:
    DOT4ATTN_LIBRARY=build/gpu/libdot4attn_ops.so compute-sanitizer --tool racecheck python3 tools/gpu_smoke.py
"""
import sys, time, numpy as np, torch
sys.path.insert(0, "python")
from dot4attn import reference as R
from dot4attn import bench_cuda as BC
f = BC._lib()
rng = np.random.default_rng(0)
fails = 0
cases = [(1,4,2,1,37,64,"float",1,"decode"),(1,32,8,1,5000,128,"q4_0",1,"split_k"),(2,8,2,8,3000,128,"q8_0",1,"decode"),
         (1,4,1,300,300,64,"q4_0",1,"prefill"),(1,2,2,70,100,256,"float",0,"prefill"),(1,24,4,1,9000,256,"float",1,"split_k"),
         (1,2,1,5,33,32,"q8_0",1,"decode"),(1,4,4,130,130,96,"float",1,"prefill"),(1,16,1,8,600,160,"q4_0",1,"decode")]
for (B,Hq,Hkv,Sq,Sk,D,vf,causal,route) in cases:
    q = (rng.standard_normal((B,Hq,Sq,D),dtype=np.float32)*3).astype(np.float16)
    k = rng.standard_normal((B,Hkv,Sk,D),dtype=np.float32).astype(np.float16)
    v = rng.standard_normal((B,Hkv,Sk,D),dtype=np.float32).astype(np.float16)
    kp, ks = R.pack_k(k)
    if vf == "float": vp, vs = v, None
    else: vp, vs = R.pack_v(v, vf)
    ref = R.attention(q,kp,ks,vp,vs,causal=causal,v_format=vf)
    T = lambda a: None if a is None else torch.from_numpy(np.ascontiguousarray(a)).cuda()
    r = BC._D4A(torch, f, T(q), T(kp), T(ks.view(np.int16)).view(torch.float16), T(vp), None if vs is None else T(vs.view(np.int16)).view(torch.float16), vf, causal, route)
    r(); torch.cuda.synchronize()
    out = r.out.cpu().numpy()
    e = R.nmse(out, ref)
    ok = e < 1e-6 and np.isfinite(out).all()
    fails += not ok
    print(("OK  " if ok else "FAIL"), (B,Hq,Hkv,Sq,Sk,D,vf,causal,route), "splits", r.n_splits, "nmse %.2e" % e, flush=True)
print("smoke fails:", fails)
