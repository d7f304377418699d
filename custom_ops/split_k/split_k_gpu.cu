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

constexpr int kMergeThreads = 128;

// Block-wide max / sum over kMergeThreads threads (any warp size dividing it).
template <bool kMax>
__device__ float block_reduce(float v, float* tmp) {
  v = kMax ? warp_max(v) : warp_sum(v);
  const int lane = threadIdx.x % D4A_WARP, w = threadIdx.x / D4A_WARP;
  constexpr int nw = kMergeThreads / D4A_WARP;
  if (lane == 0) tmp[w] = v;
  __syncthreads();
  float r = tmp[0];
  for (int i = 1; i < nw; ++i) r = kMax ? fmaxf(r, tmp[i]) : r + tmp[i];
  __syncthreads();
  return r;
}

// One block per output row. The per-split (m, l) are read in parallel (one split per thread) and turned into
// weights exp2(m - M) in shared memory once; the column loop then streams independent loads of the partials.
__global__ void __launch_bounds__(kMergeThreads)
    merge_kernel(const float* __restrict__ part_acc, const float* __restrict__ part_ml, int64_t rows,
                 int n_splits, int D, int half, void* out) {
  extern __shared__ float wsh[];  // [n_splits rounded up to 8] weights, zero past n_splits
  __shared__ float tmp[kMergeThreads / 16];
  const int64_t row = blockIdx.x;
  const int t = threadIdx.x;
  float m = -INFINITY;
  for (int s = t; s < n_splits; s += kMergeThreads)
    if (part_ml[(s * rows + row) * 2 + 1] > 0.f) m = fmaxf(m, part_ml[(s * rows + row) * 2]);
  const float M = block_reduce<true>(m, tmp);
  float l = 0.f;
  for (int s = t; s < n_splits; s += kMergeThreads) {
    const float ls = part_ml[(s * rows + row) * 2 + 1];
    const float w = ls > 0.f ? exp2f(part_ml[(s * rows + row) * 2] - M) : 0.f;
    wsh[s] = w;
    l += ls > 0.f ? ls * w : 0.f;
  }
  const int n_pad = (n_splits + 7) & ~7;  // the unrolled column loop below may read up to the next 8
  for (int s = n_splits + t; s < n_pad; s += kMergeThreads) wsh[s] = 0.f;
  const float L = block_reduce<false>(l, tmp);  // its barriers also publish wsh
  for (int c = t; c < D; c += kMergeThreads) {
    float o = 0.f;
    if (L > 0.f) {
#pragma unroll 8
      for (int s = 0; s < n_splits; ++s) o += part_acc[(int64_t(s) * rows + row) * D + c] * wsh[s];
      o /= L;
    }
    if (half) static_cast<uint16_t*>(out)[row * D + c] = f2h(o);
    else static_cast<float*>(out)[row * D + c] = o;
  }
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
  merge_kernel<<<unsigned(rows), kMergeThreads, size_t((a.n_splits + 7) & ~7) * sizeof(float), s>>>(
      a.part_acc, a.part_ml, rows, int(a.n_splits), p.D, p.half ? 1 : 0, p.out);
  D4A_GPU_CHECK(gpuGetLastError());
}

}  // namespace gpu
}  // namespace dot4attn
