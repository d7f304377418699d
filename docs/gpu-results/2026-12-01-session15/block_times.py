"""Diagnostic: per-block globaltimer stamps of split_k stage 1 and the merge (build with D4A_BLOCK_TIMES)."""
import sys, json, ctypes, os
import numpy as np, torch
sys.path.insert(0, "python")
from dot4attn import bench_cuda as BC
f = BC._lib()
lib = ctypes.CDLL(os.environ["DOT4ATTN_LIBRARY"])
lib.dot4attn_block_times.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
timer = BC._Timer(torch, 20)
NS = 8
lab = os.environ.get("LABEL", "")
for sk in [int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "131072").split(",")]:
  for fmt in (sys.argv[2] if len(sys.argv) > 2 else "q4_0").split(","):
    torch.manual_seed(0)
    q = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.float16) * 3
    k = torch.randn(1, 8, sk, 128, device="cuda", dtype=torch.float16)
    v = torch.randn(1, 8, sk, 128, device="cuda", dtype=torch.float16)
    kp, ks = BC._pack(torch, k, "q8_0")
    vp, vs = (v, None) if fmt == "float" else BC._pack(torch, v, fmt)
    dd = BC._D4A(torch, f, q, kp, ks, vp, vs, fmt, True)
    dd(); torch.cuda.synchronize()
    acc = {}
    def add(k_, v_): acc.setdefault(k_, []).append(v_)
    for rep in range(14):
      lib.dot4attn_block_times(None, 0, 1)
      timer.flush.zero_(); torch.cuda.synchronize()
      dd(); torch.cuda.synchronize()
      buf = np.zeros(4096 * NS + 2048, dtype=np.uint64)
      lib.dot4attn_block_times(buf.ctypes.data, buf.size, 0)
      bt = buf[:4096 * NS].reshape(4096, NS).astype(np.int64)
      bt = bt[bt[:, 0] > 0]
      mg = buf[4096 * NS:].reshape(512, 4).astype(np.int64); mg = mg[mg[:, 0] > 0]
      if rep < 2: continue
      t0 = bt[:, 0].min()
      u = lambda c: (bt[:, c] - t0) / 1e3
      walk = u(3)
      add("walk_end_p0_10_50_90_100", np.percentile(walk, [0, 10, 50, 90, 100]))
      add("warp_spread_med", [np.median(np.abs(u(2) - u(1)))])
      add("comb_red_sync_med", [np.median(u(4) - u(3))])
      add("comb_rows_finish_med", [np.median(u(5) - u(4))])
      add("comb_final_sync_med", [np.median(u(6) - u(5))])
      last = int(np.argmax(walk))
      add("last_block_walk_to_end", [u(6)[last] - walk[last]])
      add("stage1_end_max", [u(6).max()])
      if len(mg):
        m = lambda c: (mg[:, c] - t0) / 1e3
        add("merge_waitdone_first", [m(0).min()])
        add("merge_load_med", [np.median(m(1) - m(0))])
        add("merge_sync_med", [np.median(m(2) - m(1))])
        add("merge_store_med", [np.median(m(3) - m(2))])
        add("merge_end_max", [m(3).max()])
    out = {"label": lab, "Sk": sk, "fmt": fmt}
    for k_, v_ in acc.items():
      r = np.median(np.array(v_), 0)
      out[k_] = [round(float(x), 2) for x in r] if len(r) > 1 else round(float(r[0]), 2)
    print(json.dumps(out), flush=True)
