// How fast can the split_k access pattern stream the packed K + q4_0 V cache, without the attention math?
// Copy-only kernels over (Hkv 8, 128k keys, D 128): per-warp 32-key chunks as the tensor-core decode reads them,
// moved by cp.async (cp2 / cp3 stages; cp2pfN: plus a TMA L2 prefetch, evict-first, N chunks ahead of the copy), TMA
// bulk copies (bulk2, bulk2h / bulk3h / bulk4h with the L2 evict-first policy; bulk2h64: 64-key chunks, copies twice
// as large; bulk2hsn: scale rows without the hint; bulk2hcs: scale rows by cp.async as the kernel; ...cw: each warp
// walks one contiguous run of chunks), tensor-map TMA as decode_mma.cuh's kStageTma (tens2h; PROBE_PROMO /
// PROBE_SWZ vary its L2 promotion and swizzle),
// registers then shared memory (reg; regcs with evict-first .cs loads: the kStageRegs mode of decode_mma.cuh), or
// registers only (ldg / ldcs, payload without scales); 264 blocks of 4 warps (the split_k grid), an optional
// spin of `delay` cycles per chunk standing in for the compute. Timed like bench_cuda (CUDA events, median): after
// a 256 MiB memset ("dirty": L2 full of dirty lines, the benchmark's flush) and after a read pass ("clean").
//   nvcc -O3 -std=c++17 -arch=sm_90 -Icustom_ops -o /tmp/probe tools/gpu_stream_probe.cu && for v in cp2 bulk2h regcs; do /tmp/probe $v; done
// short512 / split512 / empty: the same cp.async copy at 512 keys as the decode route / split_k grids, and a
// launch with no chunks (the timing floor of a short decode); their TB/s column is meaningless (128k-key bytes).
// Optional second argument: comma-separated spins (dirty L2 only); PROBE_NW / PROBE_WAVES: warps per block / blocks per
// multiprocessor. Fourteenth session (docs/gpu-results/2026-12-01-session14/stream_probe.txt): tensor maps, scale-row
// policies and walk orders all read 60-61 us at delay 0; the spin costs ~1.2-2 us per 1000 cycles at 8 warps per
// multiprocessor, less with 16 (nw 8 or 4 blocks per SM: 61.7-62.8 at 2000 cycles vs 64.4).
// H200, dirty, delay 0 / 2000: empty 3.1 us; short512 5.5 / 7.0; split512 4.5 / 5.6 (the op's 512-key decode: 12.2).
// H200 results (docs/gpu.md, fifth session): q4_0 cache 218 MB, dirty, delay 0 / 2000 cycles: cp2 65.8 / 69.6 us,
// bulk2h 59.6 / 64.5, regcs 61.4 / 64.6; clean: cp2 56.7, regcs 53.2. The L2 prefetch in front of cp.async is
// slower the further ahead it runs: cp2 65.0 / 68.0, cp2pf1 70.0 / 75.8, cp2pf2 75.1 / 80.1, cp2pf4 90.1 / 95.5.
#include <cuda_runtime.h>
#include "gpu/tma.cuh"  // tensor maps (tens2h), as decode_mma.cuh
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>
#include <string>
#include <cstdlib>

constexpr int HKV = 8, KROW = 128, KS = 8, VROW = 64, VS = 8;
constexpr int KC = 32;

// cp.async copies are plain: cp.async...L2::cache_hint (with or without a 256-byte prefetch) dies with an illegal
// instruction on the H200 when built by CUDA 13.0 (ptxas puts the policy descriptor in a misaligned uniform
// register), so the evict-first variants below are TMA bulk copies and .cs loads.
__device__ __forceinline__ void cp16(void* s, const void* g) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"((unsigned)__cvta_generic_to_shared(s)), "l"(g));
}
__device__ __forceinline__ void cp8(void* s, const void* g) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"((unsigned)__cvta_generic_to_shared(s)), "l"(g));
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n"); }
template <int N> __device__ __forceinline__ void waitg() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void spin(long long cyc) {
  if (cyc <= 0) return;
  long long t0 = clock64();
  while (clock64() - t0 < cyc) {}
}

struct Args {
  const int8_t* k; const uint16_t* ks; const uint8_t* v; const uint16_t* vs;
  int64_t S; int splits; int64_t split_len; long long delay; int* sink;
};

// One warp's walk, as in the tensor-core decode: block = (KV head, split), warp w takes chunks w, w + nw, ...
struct Walk {
  int nw, w, lane, my_n, kc;
  int64_t kbeg;
  const int8_t* kg; const uint8_t* vg; const uint16_t* ksg; const uint16_t* vsg;  // the head's rows
  __device__ explicit Walk(const Args& a, int chunk_keys = KC) {
    kc = chunk_keys;
    nw = blockDim.x >> 5; w = threadIdx.x >> 5; lane = threadIdx.x & 31;
    const int head = blockIdx.x / a.splits, split = blockIdx.x % a.splits;
    kbeg = split * a.split_len;
    const int64_t kend = min(a.S, kbeg + a.split_len);
    const int nck = int((kend - kbeg + kc - 1) / kc);
    my_n = nck > w ? (nck - w + nw - 1) / nw : 0;
    kg = a.k + int64_t(head) * a.S * KROW; vg = a.v + int64_t(head) * a.S * VROW;
    ksg = a.ks + int64_t(head) * a.S * 4; vsg = a.vs + int64_t(head) * a.S * 4;
  }
  __device__ int64_t j0(int it) const { return kbeg + int64_t(w + it * nw) * kc; }  // first key of chunk it
};

constexpr int STAGE = KC * (KROW + 16) + KC * KS + KC * (VROW + 16) + KC * VS;

template <int NST, int PF = 0>
__global__ void cpasync_kernel(Args a) {
  const uint64_t pol = dot4attn::gpu::l2_evict_first_policy();  // for the L2 prefetch
  extern __shared__ __align__(16) uint8_t smem[];
  const Walk wk(a);
  const int w = wk.w, lane = wk.lane, my_n = wk.my_n;
  uint8_t* st0 = smem + w * NST * STAGE;
  const int8_t* kg = wk.kg; const uint8_t* vg = wk.vg; const uint16_t* ksg = wk.ksg; const uint16_t* vsg = wk.vsg;
  auto prefetch = [&](int it) {  // TMA L2 prefetch of chunk it with the evict-first policy (one lane)
    if (PF > 0 && lane == 0 && it < my_n) {
      const int64_t j0 = wk.j0(it);
      auto pf = [&](const void* p, int n) {
        asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;\n" ::"l"(p), "r"(n), "l"(pol) : "memory");
      };
      pf(kg + j0 * KROW, KC * KROW); pf(vg + j0 * VROW, KC * VROW); pf(ksg + j0 * 4, KC * KS); pf(vsg + j0 * 4, KC * VS);
    }
  };
  auto issue = [&](int it) {
    prefetch(it + PF);
    if (it < my_n) {
      uint8_t* st = st0 + (it % NST) * STAGE;
      const int64_t j0 = wk.j0(it);
#pragma unroll
      for (int i = 0; i < 8; ++i) { int p = lane + 32 * i; cp16(st + (p / 8) * (KROW + 16) + (p % 8) * 16, kg + j0 * KROW + 16 * p); }
#pragma unroll
      for (int i = 0; i < 4; ++i) { int p = lane + 32 * i; cp16(st + KC * (KROW + 16) + KC * KS + (p / 4) * (VROW + 16) + (p % 4) * 16, vg + j0 * VROW + 16 * p); }
      cp8(st + KC * (KROW + 16) + 8 * lane, ksg + (j0 + lane) * 4);
      cp8(st + KC * (KROW + 16) + KC * KS + KC * (VROW + 16) + 8 * lane, vsg + (j0 + lane) * 4);
    }
    commit();
  };
  int acc = 0;
  for (int p = 0; p < PF; ++p) prefetch(p);
  for (int s = 0; s < NST - 1; ++s) issue(s);
  for (int it = 0; it < my_n; ++it) {
    issue(it + NST - 1);
    waitg<NST - 1>();
    __syncwarp();
    acc ^= st0[(it % NST) * STAGE + lane * 4];
    spin(a.delay);
    __syncwarp();
  }
  waitg<0>();
  if (acc == 0x12345) a.sink[0] = acc;
}

// TMA bulk: lane 0 of each warp issues 4 bulk copies per chunk (K rows, K scales, V rows, V scales), mbarrier per stage.
// KCB keys per chunk (64: copies twice as large, the spin per chunk doubled so the work per key stays the same).
__host__ __device__ constexpr int bulk_stage(int kc) { return kc * (KROW + KS + VROW + VS); }  // one chunk's bytes, dense
// SC: how the scale rows move: 0 bulk copies like the payload, 1 bulk copies without the evict-first hint, 2 cp.async
// (8 bytes per lane, as decode_mma.cuh's TMA mode). CW: each warp walks one contiguous run of chunks instead of
// chunks w, w + nw, ...
template <int NST, int H, int KCB = KC, int SC = 0, bool CW = false>
__global__ void bulk_kernel(Args a) {
  constexpr int BSTAGE = bulk_stage(KCB);
  using namespace dot4attn::gpu;  // tma.cuh: policy and mbarrier helpers
  const uint64_t pol = l2_evict_first_policy();
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ __align__(8) uint64_t bar[8][NST];
  const Walk wk(a, KCB);
  const int nck = int((min(a.S, wk.kbeg + a.split_len) - wk.kbeg + KCB - 1) / KCB);
  const int per_w = (nck + wk.nw - 1) / wk.nw;
  const int w = wk.w, lane = wk.lane, my_n = CW ? max(0, min(per_w, nck - wk.w * per_w)) : wk.my_n;
  auto j0_of = [&](int it) -> int64_t { return CW ? wk.kbeg + int64_t(w * per_w + it) * KCB : wk.j0(it); };
  uint8_t* st0 = smem + w * NST * BSTAGE;
  if (lane == 0) {
    for (int s = 0; s < NST; ++s) mbar_init((unsigned)__cvta_generic_to_shared(&bar[w][s]), 1);
    mbar_init_fence();
  }
  __syncwarp();
  const int8_t* kg = wk.kg; const uint8_t* vg = wk.vg; const uint16_t* ksg = wk.ksg; const uint16_t* vsg = wk.vsg;
  auto issue = [&](int it) {
    if (SC == 2) {
      if (it < my_n) {
        uint8_t* st = st0 + (it % NST) * BSTAGE;
        const int64_t j0 = j0_of(it);
        cp8(st + KCB * KROW + 8 * lane, ksg + (j0 + lane) * 4);
        cp8(st + KCB * KROW + KCB * KS + KCB * VROW + 8 * lane, vsg + (j0 + lane) * 4);
      }
      commit();
    }
    if (it < my_n && lane == 0) {
      const int s = it % NST;
      uint8_t* st = st0 + s * BSTAGE;
      const int64_t j0 = j0_of(it);
      const unsigned b = (unsigned)__cvta_generic_to_shared(&bar[w][s]);
      mbar_arrive_expect(b, SC == 2 ? KCB * (KROW + VROW) : BSTAGE);
      auto bulk = [&](uint8_t* dst, const void* src, int n, bool hint = true) {
        if (H == 0 || !hint) asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                     ::"r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src), "r"(n), "r"(b) : "memory");
        else asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;\n"
                     ::"r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src), "r"(n), "r"(b), "l"(pol) : "memory");
      };
      bulk(st, kg + j0 * KROW, KCB * KROW);
      if (SC != 2) bulk(st + KCB * KROW, ksg + j0 * 4, KCB * KS, SC == 0);
      bulk(st + KCB * KROW + KCB * KS, vg + j0 * VROW, KCB * VROW);
      if (SC != 2) bulk(st + KCB * KROW + KCB * KS + KCB * VROW, vsg + j0 * 4, KCB * VS, SC == 0);
    }
  };
  int acc = 0;
  for (int s = 0; s < NST - 1; ++s) issue(s);
  for (int it = 0; it < my_n; ++it) {
    issue(it + NST - 1);
    const int s = it % NST;
    const unsigned par = (it / NST) & 1;
    if (SC == 2) waitg<NST - 1>();
    mbar_wait((unsigned)__cvta_generic_to_shared(&bar[w][s]), par);
    acc ^= st0[s * BSTAGE + lane * 4];
    spin(a.delay * (KCB / KC));
    __syncwarp();
  }
  if (acc == 0x12345) a.sink[0] = acc;
}


// Tensor-map TMA (decode_mma.cuh's kStageTma): lane 0 copies the chunk's K (32 x 128-byte box, 128-byte swizzle) and V
// (32 x 64-byte box) through 3-D maps with the evict-first policy; the scale rows stay on cp.async (8 bytes per lane).
template <int NST>
__global__ void tensor_kernel(Args a, const __grid_constant__ dot4attn::gpu::TmaMaps tm) {
  using namespace dot4attn::gpu;
  constexpr int TSTAGE = up1024(KC * (KROW + VROW) + KC * (KS + VS));
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + smem_pad1024(smem_raw);
  __shared__ __align__(8) uint64_t bar[8][NST];
  const Walk wk(a);
  const int w = wk.w, lane = wk.lane, my_n = wk.my_n;
  uint8_t* st0 = smem + w * NST * TSTAGE;
  const uint64_t pol = l2_evict_first_policy();
  if (lane == 0) {
    for (int s = 0; s < NST; ++s) mbar_init((unsigned)__cvta_generic_to_shared(&bar[w][s]), 1);
    mbar_init_fence();
  }
  __syncwarp();
  const int head = blockIdx.x / a.splits;
  const uint16_t* ksg = wk.ksg; const uint16_t* vsg = wk.vsg;
  auto issue = [&](int it) {
    if (it < my_n) {
      uint8_t* st = st0 + (it % NST) * TSTAGE;
      const int64_t j0 = wk.j0(it);
      cp8(st + KC * (KROW + VROW) + 8 * lane, ksg + (j0 + lane) * 4);
      cp8(st + KC * (KROW + VROW) + KC * KS + 8 * lane, vsg + (j0 + lane) * 4);
      if (lane == 0) {
        const unsigned b = (unsigned)__cvta_generic_to_shared(&bar[w][it % NST]);
        mbar_arrive_expect(b, KC * (KROW + VROW));
        const unsigned d = (unsigned)__cvta_generic_to_shared(st);
        tma_load_3d(d, &tm.k, 0, int(j0), head, b, pol);
        tma_load_3d(d + KC * KROW, &tm.v, 0, int(j0), head, b, pol);
      }
    }
    commit();
  };
  int acc = 0;
  for (int s = 0; s < NST - 1; ++s) issue(s);
  for (int it = 0; it < my_n; ++it) {
    issue(it + NST - 1);
    const int s = it % NST;
    waitg<NST - 1>();
    mbar_wait((unsigned)__cvta_generic_to_shared(&bar[w][s]), (it / NST) & 1);
    __syncwarp();
    acc ^= st0[s * TSTAGE + lane * 4];
    spin(a.delay);
    __syncwarp();
  }
  if (acc == 0x12345) a.sink[0] = acc;
}

// loads into registers (.cs streaming = evict-first in L2 when CS), stored to shared memory one iteration later
template <int CS>
__global__ void regstage_kernel(Args a) {
  extern __shared__ __align__(16) uint8_t smem[];
  const Walk wk(a);
  const int w = wk.w, lane = wk.lane, my_n = wk.my_n;
  uint8_t* st0 = smem + w * 2 * STAGE;
  const int8_t* kg = wk.kg; const uint8_t* vg = wk.vg; const uint16_t* ksg = wk.ksg; const uint16_t* vsg = wk.vsg;
  uint4 r[12]; uint2 sc[2];
  auto load = [&](int it) {
    const int64_t j0 = wk.j0(it);
#pragma unroll
    for (int i = 0; i < 8; ++i) { const uint4* p = reinterpret_cast<const uint4*>(kg + j0 * KROW) + lane + 32 * i; r[i] = CS ? __ldcs(p) : __ldg(p); }
#pragma unroll
    for (int i = 0; i < 4; ++i) { const uint4* p = reinterpret_cast<const uint4*>(vg + j0 * VROW) + lane + 32 * i; r[8 + i] = CS ? __ldcs(p) : __ldg(p); }
    const uint2* p0 = reinterpret_cast<const uint2*>(ksg + (j0 + lane) * 4); const uint2* p1 = reinterpret_cast<const uint2*>(vsg + (j0 + lane) * 4);
    sc[0] = CS ? __ldcs(p0) : __ldg(p0); sc[1] = CS ? __ldcs(p1) : __ldg(p1);
  };
  auto store = [&](uint8_t* st) {
#pragma unroll
    for (int i = 0; i < 8; ++i) { int p = lane + 32 * i; *reinterpret_cast<uint4*>(st + (p / 8) * (KROW + 16) + (p % 8) * 16) = r[i]; }
#pragma unroll
    for (int i = 0; i < 4; ++i) { int p = lane + 32 * i; *reinterpret_cast<uint4*>(st + KC * (KROW + 16) + KC * KS + (p / 4) * (VROW + 16) + (p % 4) * 16) = r[8 + i]; }
    *reinterpret_cast<uint2*>(st + KC * (KROW + 16) + 8 * lane) = sc[0];
    *reinterpret_cast<uint2*>(st + KC * (KROW + 16) + KC * KS + KC * (VROW + 16) + 8 * lane) = sc[1];
  };
  int acc = 0;
  if (my_n > 0) load(0);
  for (int it = 0; it < my_n; ++it) {
    uint8_t* st = st0 + (it & 1) * STAGE;
    store(st);
    __syncwarp();
    if (it + 1 < my_n) load(it + 1);
    acc ^= st[lane * 4 + 1];
    spin(a.delay);
    __syncwarp();
  }
  if (acc == 0x12345) a.sink[0] = acc;
}

// plain loads into registers, whole chunk per warp in flight (NU chunks unrolled)
template <int NU, int CS>
__global__ void ldg_kernel(Args a) {
  const Walk wk(a);
  const int lane = wk.lane, my_n = wk.my_n;
  const int8_t* kg = wk.kg; const uint8_t* vg = wk.vg;
  uint4 acc = make_uint4(0, 0, 0, 0);
  for (int it = 0; it < my_n; it += NU) {
    uint4 r[NU][12];
#pragma unroll
    for (int u = 0; u < NU; ++u) {
      const int64_t j0 = wk.j0(min(it + u, my_n - 1));
#pragma unroll
      for (int i = 0; i < 8; ++i) r[u][i] = CS ? __ldcs(reinterpret_cast<const uint4*>(kg + j0 * KROW) + lane + 32 * i) : __ldg(reinterpret_cast<const uint4*>(kg + j0 * KROW) + lane + 32 * i);
#pragma unroll
      for (int i = 0; i < 4; ++i) r[u][8 + i] = CS ? __ldcs(reinterpret_cast<const uint4*>(vg + j0 * VROW) + lane + 32 * i) : __ldg(reinterpret_cast<const uint4*>(vg + j0 * VROW) + lane + 32 * i);
    }
#pragma unroll
    for (int u = 0; u < NU; ++u)
#pragma unroll
      for (int i = 0; i < 12; ++i) { acc.x ^= r[u][i].x; acc.y ^= r[u][i].y; }
  }
  if (acc.x == 0x12345 && acc.y == 7) a.sink[0] = 1;
}

__global__ void readall(const uint4* p, int64_t n, int* sink) {
  uint32_t x = 0;
  for (int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) x ^= p[i].x;
  if (x == 0x1234567) sink[0] = x;
}

int main(int argc, char** argv) {
  const int64_t S = 131072;
  int8_t* k; uint16_t *ks, *vs; uint8_t* v; int* sink; uint8_t* flush;
  cudaMalloc(&k, HKV * S * KROW); cudaMalloc(&v, HKV * S * VROW);
  cudaMalloc(&ks, HKV * S * KS); cudaMalloc(&vs, HKV * S * VS);
  cudaMalloc(&sink, 4); cudaMalloc(&flush, 256 << 20); uint8_t* flush2; cudaMalloc(&flush2, 256 << 20); cudaMemset(flush2, 3, 256 << 20);
  cudaMemset(k, 1, HKV * S * KROW); cudaMemset(v, 1, HKV * S * VROW); cudaMemset(ks, 1, HKV * S * KS); cudaMemset(vs, 1, HKV * S * VS);
  const double bytes = double(HKV) * S * (KROW + KS + VROW + VS);
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  auto timeit = [&](const char* name, auto launch, int dirty) {
    std::vector<float> ts;
    for (int r = 0; r < 12; ++r) {
      if (dirty) cudaMemsetAsync(flush, r, 256 << 20);
      else { cudaMemsetAsync(flush, r, 256 << 20); readall<<<1024, 256>>>(reinterpret_cast<const uint4*>(flush2), (256 << 20) / 16, sink); }
      cudaEventRecord(e0); launch(); cudaEventRecord(e1); cudaEventSynchronize(e1);
      float ms; cudaEventElapsedTime(&ms, e0, e1); if (r >= 2) ts.push_back(ms * 1e3f);
    }
    std::sort(ts.begin(), ts.end());
    float med = ts[ts.size() / 2];
    cudaError_t err = cudaGetLastError();
    printf("%-40s %s %8.1f us  %.2f TB/s %s\n", name, dirty ? "dirty" : "clean", med, bytes / (med * 1e-6) / 1e12,
           err ? cudaGetErrorString(err) : "");
  };
  const std::string which = argc > 1 ? argv[1] : "cp2";
  // optional: a comma-separated list of spin lengths (cycles per chunk) and "dirty" only, e.g. 0,1000,2000,3000
  std::vector<long long> delays{0LL, 2000LL};
  std::vector<int> dirties{1, 0};
  if (argc > 2) {
    delays.clear();
    for (const char* p = argv[2]; *p;) { char* e; delays.push_back(strtoll(p, &e, 10)); p = *e ? e + 1 : e; }
    dirties = {1};
  }
  for (int dirty : dirties)
  for (long long delay : delays) {
    // short512: the decode route at 512 keys (one block of 8 warps per KV head, 2 chunks per warp);
    // split512: split_k there (4 splits of 128 keys, 4 warps, one chunk per warp); empty: the launch + timing floor.
    const bool short512 = which == "short512", split512 = which == "split512", empty = which == "empty";
    const int64_t SS = short512 || split512 || empty ? 512 : S;
    const int waves = getenv("PROBE_WAVES") ? atoi(getenv("PROBE_WAVES")) : 2;
    const int nw = getenv("PROBE_NW") ? atoi(getenv("PROBE_NW")) : short512 || empty ? 8 : 4;
    Args a{k, ks, v, vs, SS, 0, 0, delay, sink};
    a.splits = short512 || empty ? 1 : split512 ? 4 : (sms * waves + HKV - 1) / HKV;
    a.split_len = (SS + a.splits - 1) / a.splits;
    a.split_len = (a.split_len + 2 * KC - 1) / (2 * KC) * (2 * KC);  // whole 64-key chunks for bulk2h64 as well
    if (empty) a.split_len = 0;  // no chunks: launch, block set-up, exit
    const int blocks = HKV * a.splits;
    char nm[128];
    auto go = [&](auto kern, int sm) {
      cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, sm);
      snprintf(nm, sizeof nm, "%s delay%lld", which.c_str(), delay);
      timeit(nm, [&] { kern<<<blocks, nw * 32, sm>>>(a); }, dirty);
    };
    if (which == "cp2" || short512 || split512 || empty) go(cpasync_kernel<2>, nw * 2 * STAGE);
    if (which == "cp3") go(cpasync_kernel<3>, nw * 3 * STAGE);
    if (which == "cp2pf1") go(cpasync_kernel<2, 1>, nw * 2 * STAGE);
    if (which == "cp2pf2") go(cpasync_kernel<2, 2>, nw * 2 * STAGE);
    if (which == "cp2pf4") go(cpasync_kernel<2, 4>, nw * 2 * STAGE);
    if (which == "bulk2") go(bulk_kernel<2, 0>, nw * 2 * bulk_stage(KC));
    if (which == "bulk2h") go(bulk_kernel<2, 1>, nw * 2 * bulk_stage(KC));
    if (which == "bulk3h") go(bulk_kernel<3, 1>, nw * 3 * bulk_stage(KC));
    if (which == "bulk4h") go(bulk_kernel<4, 1>, nw * 4 * bulk_stage(KC));
    if (which == "bulk2hsn") go(bulk_kernel<2, 1, KC, 1>, nw * 2 * bulk_stage(KC));
    if (which == "bulk2hcs") go(bulk_kernel<2, 1, KC, 2>, nw * 2 * bulk_stage(KC));
    if (which == "bulk2hcw") go(bulk_kernel<2, 1, KC, 0, true>, nw * 2 * bulk_stage(KC));
    if (which == "bulk2hcscw") go(bulk_kernel<2, 1, KC, 2, true>, nw * 2 * bulk_stage(KC));
    if (which == "tens2h") {
      dot4attn::gpu::TmaMaps tm;
      // PROBE_PROMO: L2 promotion 0 none / 1 64B / 2 128B / 3 256B (decode_mma.cuh: 256B); PROBE_SWZ=0: no swizzle
      const int promo = getenv("PROBE_PROMO") ? atoi(getenv("PROBE_PROMO")) : 3;
      const bool swz = !getenv("PROBE_SWZ") || atoi(getenv("PROBE_SWZ")) != 0;
      auto enc = [&](CUtensorMap* m, const void* base, int row) {
        const cuuint64_t dims[3] = {cuuint64_t(row), cuuint64_t(S), cuuint64_t(HKV)};
        const cuuint64_t strides[2] = {cuuint64_t(row), cuuint64_t(row * S)};
        const cuuint32_t box[3] = {cuuint32_t(row), cuuint32_t(KC), 1u};
        const cuuint32_t es[3] = {1u, 1u, 1u};
        const CUtensorMapSwizzle sw = !swz ? CU_TENSOR_MAP_SWIZZLE_NONE : row == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B;
        const CUtensorMapL2promotion pr[4] = {CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_64B,
                                              CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B};
        return dot4attn::gpu::tma_encoder()(m, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, const_cast<void*>(base), dims, strides, box, es,
                   CU_TENSOR_MAP_INTERLEAVE_NONE, sw, pr[promo], CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
      };
      if (!enc(&tm.k, k, KROW) || !enc(&tm.v, v, VROW)) { printf("tensor maps refused\n"); return 1; }
      constexpr int TST = dot4attn::gpu::up1024(KC * (KROW + VROW) + KC * (KS + VS));
      const int sm = nw * 2 * TST + 1024;
      cudaFuncSetAttribute(tensor_kernel<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, sm);
      snprintf(nm, sizeof nm, "%s delay%lld", which.c_str(), delay);
      timeit(nm, [&] { tensor_kernel<2><<<blocks, nw * 32, sm>>>(a, tm); }, dirty);
    }
    if (which == "bulk2h64") go(bulk_kernel<2, 1, 64>, nw * 2 * bulk_stage(64));
    if (which == "reg") go(regstage_kernel<0>, nw * 2 * STAGE);
    if (which == "regcs") go(regstage_kernel<1>, nw * 2 * STAGE);
    if (which == "ldg" && delay == 0) go(ldg_kernel<2, 0>, 0);
    if (which == "ldcs" && delay == 0) go(ldg_kernel<2, 1>, 0);
  }
  return 0;
}
