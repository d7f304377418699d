// Dot4Attention split_k route on the GPU (FlashDecoding). Stage 1: the decode kernel over p.n_splits key splits
// of equal length (a multiple of the 64-key tile), all in parallel, each writing its unnormalised float32
// accumulator with the running max (log2 units) and sum into the scratch from ORT's allocator. Stage 2: one
// block per output row merges the splits by log-sum-exp. Splits that see no key (causal, masks) drop out.
#include "gpu/attention_gpu_internal.h"

namespace dot4attn {
namespace gpu {

namespace {

constexpr int kMergeThreads = 128;

__global__ void __launch_bounds__(kMergeThreads)
    merge_kernel(const float* __restrict__ part_acc, const float* __restrict__ part_ml, int64_t rows,
                 int64_t n_splits, int D, int half, void* out) {
  const int64_t row = blockIdx.x;
  float M = -INFINITY;
  for (int64_t s = 0; s < n_splits; ++s) {
    const float l = part_ml[(s * rows + row) * 2 + 1];
    if (l > 0.f) M = fmaxf(M, part_ml[(s * rows + row) * 2]);
  }
  float L = 0.f;
  for (int64_t s = 0; s < n_splits; ++s) {
    const float l = part_ml[(s * rows + row) * 2 + 1];
    if (l > 0.f) L += l * exp2f(part_ml[(s * rows + row) * 2] - M);
  }
  for (int c = threadIdx.x; c < D; c += kMergeThreads) {
    float o = 0.f;
    if (L > 0.f) {
      for (int64_t s = 0; s < n_splits; ++s) {
        const float l = part_ml[(s * rows + row) * 2 + 1];
        if (l > 0.f) o += part_acc[(s * rows + row) * D + c] * exp2f(part_ml[(s * rows + row) * 2] - M);
      }
      o /= L;
    }
    if (half) static_cast<uint16_t*>(out)[row * D + c] = f2h(o);
    else static_cast<float*>(out)[row * D + c] = o;
  }
}

int64_t split_len_for(const AttentionParams& p) {
  const int64_t n = p.n_splits < 1 ? 1 : p.n_splits;
  int64_t len = (p.Sk + n - 1) / n;
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
  a.split_len = split_len_for(p);
  a.n_splits = (p.Sk + a.split_len - 1) / a.split_len;  // <= p.n_splits
  a.part_acc = static_cast<float*>(scratch);
  a.part_ml = a.part_acc + a.n_splits * rows * p.D;
  launch_decode_tiles(a, s);
  if (rows > 0x7fffffffLL) throw std::runtime_error("Dot4Attention GPU: too many rows to merge");
  merge_kernel<<<unsigned(rows), kMergeThreads, 0, s>>>(a.part_acc, a.part_ml, rows, a.n_splits, p.D,
                                                      p.half ? 1 : 0, p.out);
  D4A_GPU_CHECK(gpuGetLastError());
}

}  // namespace gpu
}  // namespace dot4attn
