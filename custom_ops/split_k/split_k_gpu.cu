// Dot4Attention split_k route on the GPU (FlashDecoding). Stage 1: the decode kernel over key splits of equal
// length (a multiple of 64 keys), all in parallel, each writing its unnormalised float32 accumulator with the
// running max (log2 units) and sum into the scratch from ORT's allocator. Stage 2: one block per output row
// merges the splits by log-sum-exp. Splits that see no key (causal, masks) drop out (l = 0).
// The tensor-core stage 1 (decode_mma.cuh) splits the keys evenly by 32-key chunks instead.
//
// Split count and scratch size: the launch plan (gpu/launch_plan.cu; SMs x 2 waves of (batch, KV head, split) items).
// Sizing it from the decode kernel's occupancy instead (more, shorter splits) is no faster at 128k keys
// (docs/performance.md).
#include "gpu/attention_gpu_internal.h"

namespace dot4attn {
namespace gpu {

namespace {

// Writes o / L (zeros where L = 0: no split saw a key; NaN where L is NaN: a split saw a poisoned key) as 4 float16
// (saturating) or float32 values at element offset off.
__device__ __forceinline__ void store4(void* out, int half, int64_t off, float4 o, float L) {
  o = make_float4(normalise(o.x, L), normalise(o.y, L), normalise(o.z, L), normalise(o.w, L));
  if (half) {
    uint2 u;
    u.x = uint32_t(f2h_out(o.x)) | (uint32_t(f2h_out(o.y)) << 16);
    u.y = uint32_t(f2h_out(o.z)) | (uint32_t(f2h_out(o.w)) << 16);
    *reinterpret_cast<uint2*>(static_cast<uint16_t*>(out) + off) = u;
  } else {
    *reinterpret_cast<float4*>(static_cast<float*>(out) + off) = o;
  }
}

constexpr int kMergeThreads = 256;
constexpr int kMergeBatch = 8;  // splits whose loads a merge thread has in flight at once

// A running log-sum-exp state of four output columns: max M (log2 units), sum L, unnormalised accumulator o.
struct MergeState {
  float M = -INFINITY, L = 0.f;
  float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
  // Adds a partial (max m, sum l, accumulator x); partials that saw no key (l = 0) drop out, a NaN l (a poisoned
  // key, possibly with m = -inf: fmaxf skips NaN logits) makes L NaN for good.
  __device__ __forceinline__ void add(float m, float l, float4 x) {
    if (l != l) L = l;
    if (!(l > 0.f)) return;
    const float Mn = fmaxf(M, m);
    const float fo = exp2f(M - Mn), fn = exp2f(m - Mn);  // fo = 0 while M = -inf (o and L are zero then)
    o.x = fmaf(fn, x.x, o.x * fo); o.y = fmaf(fn, x.y, o.y * fo);
    o.z = fmaf(fn, x.z, o.z * fo); o.w = fmaf(fn, x.w, o.w * fo);
    L = fmaf(fn, l, L * fo);
    M = Mn;
  }
};

// Float4 column c of output row `row` over splits s0, s0 + step, ...: in batches of kMergeBatch splits whose loads
// are all issued before any is used (one L2 round trip per batch, not per split), each batch folded in with one
// rescale against its max.
__device__ __forceinline__ MergeState merge_column(const float* __restrict__ acc, const float2* __restrict__ ml,
                                                   int64_t rows, int n_splits, int D, int64_t row, int c, int s0,
                                                   int step) {
  MergeState x;
  for (int s = s0; s < n_splits; s += kMergeBatch * step) {
    float2 v[kMergeBatch];
    float4 a[kMergeBatch];
#pragma unroll
    for (int j = 0; j < kMergeBatch; ++j) {
      const int sj = s + j * step;
      if (sj < n_splits) {
        const int64_t p = int64_t(sj) * rows + row;
        v[j] = ml[p];
        a[j] = reinterpret_cast<const float4*>(acc + p * D)[c];
      } else {
        v[j] = make_float2(-INFINITY, 0.f);
        a[j] = make_float4(0.f, 0.f, 0.f, 0.f);
      }
    }
    float Mn = x.M;
#pragma unroll
    for (int j = 0; j < kMergeBatch; ++j)
      if (v[j].y > 0.f) Mn = fmaxf(Mn, v[j].x);
    bool poisoned = false;  // a split with a NaN sum saw a poisoned key, perhaps nothing else (then its m is -inf)
#pragma unroll
    for (int j = 0; j < kMergeBatch; ++j) poisoned |= v[j].y != v[j].y;
    if (poisoned) x.L = __int_as_float(0x7fc00000);
    if (Mn == -INFINITY) continue;  // no split so far saw a key
    const float fo = exp2f(x.M - Mn);  // 0 while x.M = -inf
    x.o.x *= fo; x.o.y *= fo; x.o.z *= fo; x.o.w *= fo;
    x.L *= fo;
#pragma unroll
    for (int j = 0; j < kMergeBatch; ++j) {
      const float w = v[j].y > 0.f ? exp2f(v[j].x - Mn) : 0.f;  // splits that saw no key drop out
      x.o.x = fmaf(w, a[j].x, x.o.x); x.o.y = fmaf(w, a[j].y, x.o.y);
      x.o.z = fmaf(w, a[j].z, x.o.z); x.o.w = fmaf(w, a[j].w, x.o.w);
      x.L = fmaf(w, v[j].y, x.L);
    }
    x.M = Mn;
  }
  return x;
}

// One block per output row. Its threads form groups of D/4 (one float4 column each; D is a multiple of 32 up to
// 256, so there are 4 to 32 groups); group i merges splits i, i + groups, ..., then the groups meet once in shared
// memory. So each thread has a few splits to load, all in flight together (one column per thread looping over
// every split waits for one L2 round trip per split, about three times this form's tail at 33 splits; loading them
// one or two at a time still leaves a longer tail than this).
__global__ void __launch_bounds__(kMergeThreads)
    merge_kernel(const float* __restrict__ part_acc, const float* __restrict__ part_ml, int64_t rows,
                 int n_splits, int D, int half, void* out) {
  __shared__ float4 go[kMergeThreads];
  __shared__ float2 gml[kMergeThreads];
  pdl_wait();  // launched early (programmatic dependent launch, see run_split_k): stage 1 complete and visible
  const int64_t row = blockIdx.x;
  const int t = threadIdx.x, c4n = D / 4, groups = kMergeThreads / c4n;
  const int grp = t / c4n, c = t % c4n;
  if (grp < groups) {
    const MergeState x = merge_column(part_acc, reinterpret_cast<const float2*>(part_ml), rows, n_splits, D, row, c,
                                      grp, groups);
    go[t] = x.o;
    gml[t] = make_float2(x.M, x.L);
  }
  __syncthreads();
  if (t >= c4n) return;
  MergeState x;
  for (int i = 0; i < groups; ++i) x.add(gml[i * c4n + t].x, gml[i * c4n + t].y, go[i * c4n + t]);
  store4(out, half, row * D + 4 * t, x.o, x.L);
}

}  // namespace

void run_split_k(const GpuPlan& plan, TileArgs a, void* scratch, gpuStream_t s) {
  const int64_t rows = a.B * a.Hq * a.Sq;  // below 2^31 and n_splits <= 8192: plan_attention checks both
  a.part_acc = static_cast<float*>(scratch);
  a.part_ml = a.part_acc + plan.n_splits * rows * a.D;
  if (!run_decode(plan, a, s)) throw std::runtime_error("Dot4Attention GPU: split_k stage 1 was refused");
#if defined(D4A_CUDA)
  // sm_90+: programmatic dependent launch, so the merge grid is resident when stage 1 ends instead of being
  // launched then (the tensor-core stage 1 lets it start once all its blocks are past their key walks; the merge waits
  // for stage 1's completion).
  if (device_facts().cc_major >= 9) {
    launch_dependent(merge_kernel, unsigned(rows), unsigned(kMergeThreads), 0, s, static_cast<const float*>(a.part_acc),
                     static_cast<const float*>(a.part_ml), rows, int(plan.n_splits), int(a.D), a.half, a.out);
    return;
  }
#endif
  merge_kernel<<<unsigned(rows), kMergeThreads, 0, s>>>(a.part_acc, a.part_ml, rows, int(plan.n_splits), a.D, a.half,
                                                         a.out);
  D4A_GPU_CHECK(gpuGetLastError());
}

}  // namespace gpu
}  // namespace dot4attn
