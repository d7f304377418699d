// Dot4Attention prefill route on the GPU (Sq > 8): tiled FlashAttention in one launch. A block owns 64 rows of
// one (batch, KV head) row space (grouped heads x query rows) and walks the keys in 64-key tiles; with causal
// masking it stops at the last key its rows can see, tiles that every row sees fully run without any check,
// and only the causal tail (and explicit masks) is masked per element. Heaviest row chunks launch first.
// Q.K uses 4-way int8 dot products (dp4a / sudot4 / sdot4), P.V float32 FMAs.
// On NVIDIA sm_80+ (CUDA builds) D = 64 / 128 / 256 run the tensor-core kernel of gpu/prefill_mma.cuh instead
// (int8 mma for Q.K, f16 mma for P.V); env DOT4ATTN_GPU_PREFILL=tile forces the tile kernel (comparison), and
// every case the tensor-core kernel does not take (other D, misaligned pointers, older GPUs, HIP) uses it too.
#include "gpu/attention_gpu_internal.h"
#include "gpu/prefill_mma.cuh"

namespace dot4attn {
namespace gpu {

namespace {

constexpr int kRows = 64;

template <int VK>
void launch_d(const TileArgs& a, gpuStream_t s) {
  if (a.D <= 64) launch_tile<VK, 64, kRows, 16, 2>(a, s);
  else if (a.D <= 128) launch_tile<VK, 128, kRows, 16, 2>(a, s);
  else launch_tile<VK, 256, kRows, 16, 2>(a, s);
}

}  // namespace

void run_prefill(const AttentionParams& p, gpuStream_t s) {
  TileArgs a = make_tile_args(p);
#if defined(D4A_HAS_PREFILL_MMA)
  if (pmma::try_prefill_mma(a, s)) return;
#endif
  const int64_t rows = a.g * a.Sq;
  a.n_chunks = (rows + kRows - 1) / kRows;
  a.reverse_chunks = a.causal;
  switch (a.vk) {
    case kVF32: launch_d<kVF32>(a, s); break;
    case kVF16: launch_d<kVF16>(a, s); break;
    case kVQ8: launch_d<kVQ8>(a, s); break;
    default: launch_d<kVQ4>(a, s); break;
  }
}

}  // namespace gpu
}  // namespace dot4attn
