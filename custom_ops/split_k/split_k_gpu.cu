// Dot4Attention split_k route on the GPU (FlashDecoding). Stage 1: the decode kernel over key splits of equal
// length (a multiple of 64 keys), all in parallel, each writing its unnormalised float32 accumulator with the
// running max (log2 units) and sum into the scratch from ORT's allocator. Stage 2: one block per output row
// merges the splits by log-sum-exp. Splits that see no key (causal, masks) drop out (l = 0).
//
// Split count: attention_op.cc's choose_splits (SMs x 2 waves of (batch, KV head, split) items). Sizing it from
// the decode kernel's occupancy instead (more, shorter splits) measured slower at 128k keys on the H200.
#include "gpu/attention_gpu_internal.h"

namespace dot4attn {
namespace gpu {

namespace {

// Writes o / L (zeros where L = 0: no split saw a key) as 4 float16 or float32 values at element offset off.
__device__ __forceinline__ void store4(void* out, int half, int64_t off, float4 o, float L) {
  if (L > 0.f) { o.x /= L; o.y /= L; o.z /= L; o.w /= L; }
  else o = make_float4(0.f, 0.f, 0.f, 0.f);
  if (half) {
    uint2 u;
    u.x = uint32_t(f2h(o.x)) | (uint32_t(f2h(o.y)) << 16);
    u.y = uint32_t(f2h(o.z)) | (uint32_t(f2h(o.w)) << 16);
    *reinterpret_cast<uint2*>(static_cast<uint16_t*>(out) + off) = u;
  } else {
    *reinterpret_cast<float4*>(static_cast<float*>(out) + off) = o;
  }
}

constexpr int kMergeThreads = 256;

// One block per output row. Its threads form groups of D/4 (one float4 column each; D is a multiple of 32 up to
// 256, so there are 4 to 32 groups); group i merges splits i, i + groups, ... against its own max, then the groups
// meet once in shared memory. So each thread has only a few splits to load, all independent (one column per thread
// looping over every split took ~6 us at 33 splits on the H200, 15-20% of split_k at 16k keys).
__global__ void __launch_bounds__(kMergeThreads)
    merge_kernel(const float* __restrict__ part_acc, const float* __restrict__ part_ml, int64_t rows,
                 int n_splits, int D, int half, void* out) {
  __shared__ float4 gacc[kMergeThreads];
  __shared__ float gm[kMergeThreads], gl[kMergeThreads];
#if defined(D4A_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Launched early (programmatic dependent launch, see run_split_k): wait until stage 1 is complete and visible.
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
  const int64_t row = blockIdx.x;
  const int t = threadIdx.x, c4n = D / 4, groups = kMergeThreads / c4n;
  const int grp = t / c4n, c = t % c4n;
  const float2* ml = reinterpret_cast<const float2*>(part_ml);
  float M = -INFINITY, L = 0.f;
  float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
  if (grp < groups) {
    for (int s = grp; s < n_splits; s += groups) {
      const float2 v = ml[int64_t(s) * rows + row];
      if (v.y > 0.f) M = fmaxf(M, v.x);
    }
    if (M != -INFINITY) {
#pragma unroll 4
      for (int s = grp; s < n_splits; s += groups) {
        const float2 v = ml[int64_t(s) * rows + row];
        const float4 x = reinterpret_cast<const float4*>(part_acc + (int64_t(s) * rows + row) * D)[c];
        const float w = v.y > 0.f ? exp2f(v.x - M) : 0.f;  // splits that saw no key drop out
        o.x = fmaf(w, x.x, o.x); o.y = fmaf(w, x.y, o.y); o.z = fmaf(w, x.z, o.z); o.w = fmaf(w, x.w, o.w);
        L = fmaf(w, v.y, L);
      }
    }
    gacc[t] = o;
    if (c == 0) { gm[grp] = M; gl[grp] = L; }
  }
  __syncthreads();
  if (t >= c4n) return;
  float Mx = -INFINITY;
  for (int i = 0; i < groups; ++i) Mx = fmaxf(Mx, gm[i]);
  o = make_float4(0.f, 0.f, 0.f, 0.f);
  L = 0.f;
  for (int i = 0; i < groups; ++i) {
    if (gm[i] == -INFINITY) continue;  // the group saw no key
    const float w = exp2f(gm[i] - Mx);
    const float4 x = gacc[i * c4n + t];
    o.x = fmaf(w, x.x, o.x); o.y = fmaf(w, x.y, o.y); o.z = fmaf(w, x.z, o.z); o.w = fmaf(w, x.w, o.w);
    L = fmaf(w, gl[i], L);
  }
  store4(out, half, row * D + 4 * t, o, L);
}

int64_t split_len_for(int64_t sk, int64_t n_splits) {
  const int64_t n = n_splits < 1 ? 1 : n_splits;
  int64_t len = (sk + n - 1) / n;
  len = (len + KT - 1) / KT * KT;
  return len < KT ? KT : len;
}

}  // namespace

size_t split_k_scratch_bytes(const AttentionParams& p) {
  const int64_t n = p.n_splits < 1 ? 1 : p.n_splits;
  const int64_t rows = p.B * p.Hq * p.Sq;
  return size_t(n) * size_t(rows) * size_t(p.D + 2) * sizeof(float);
}

void run_split_k(const AttentionParams& p, void* scratch, gpuStream_t s) {
  TileArgs a = make_tile_args(p);
  const int64_t rows = p.B * p.Hq * p.Sq;
  const int64_t n = p.n_splits < 1 ? 1 : p.n_splits;
  a.split_len = split_len_for(p.Sk, n);
  a.n_splits = (p.Sk + a.split_len - 1) / a.split_len;  // <= n
  a.part_acc = static_cast<float*>(scratch);
  a.part_ml = a.part_acc + a.n_splits * rows * p.D;
  launch_decode_tiles(a, s);
  if (rows > 0x7fffffffLL || a.n_splits > 8192) throw std::runtime_error("Dot4Attention GPU: too many rows/splits to merge");
  if (p.D % 4 != 0 || p.D / 4 > kMergeThreads) throw std::runtime_error("Dot4Attention GPU: merge needs D % 4 == 0, D <= 1024");
#if defined(D4A_CUDA)
  // sm_90+: programmatic dependent launch, so the merge grid is resident when stage 1 ends instead of being
  // launched then (stage 1 lets it start once all its blocks run; the merge waits for stage 1's completion).
  if (device_attribute(cudaDevAttrComputeCapabilityMajor, 0) >= 9) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(unsigned(rows));
    cfg.blockDim = dim3(kMergeThreads);
    cfg.dynamicSmemBytes = 0;
    cfg.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    D4A_GPU_CHECK(cudaLaunchKernelEx(&cfg, merge_kernel, static_cast<const float*>(a.part_acc),
                                     static_cast<const float*>(a.part_ml), rows, int(a.n_splits), int(p.D),
                                     p.half ? 1 : 0, p.out));
    return;
  }
#endif
  merge_kernel<<<unsigned(rows), kMergeThreads, 0, s>>>(
      a.part_acc, a.part_ml, rows, int(a.n_splits), p.D, p.half ? 1 : 0, p.out);
  D4A_GPU_CHECK(gpuGetLastError());
}

}  // namespace gpu
}  // namespace dot4attn
