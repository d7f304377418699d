// Dot4Attention decode route on the GPU (Sq <= 8): one block per (batch, KV head) owns every grouped query head
// and every query row (g x Sq rows in blocks of 4, 8 or 16 rows; more rows go in 16-row chunks that are adjacent
// in launch order, run side by side and share the K/V tiles through L2), so each K/V row is read from memory
// once for all of them. The same launcher runs split_k's stage 1 (a.n_splits > 1, partial outputs).
#include "gpu/attention_gpu_internal.h"

namespace dot4attn {
namespace gpu {

namespace {

template <int VK, int DMAX>
void launch_rb(const TileArgs& a, int rb, gpuStream_t s) {
  if (rb == 4) launch_tile<VK, DMAX, 4, 4, 3>(a, s);
  else if (rb == 8) launch_tile<VK, DMAX, 8, 8, 3>(a, s);
  else launch_tile<VK, DMAX, 16, 16, 3>(a, s);
}

template <int VK>
void launch_d(const TileArgs& a, int rb, gpuStream_t s) {
  if (a.D <= 64) launch_rb<VK, 64>(a, rb, s);
  else if (a.D <= 128) launch_rb<VK, 128>(a, rb, s);
  else launch_rb<VK, 256>(a, rb, s);
}

}  // namespace

void launch_decode_tiles(const TileArgs& a0, gpuStream_t s) {
  TileArgs a = a0;
  const int64_t rows = a.g * a.Sq;
  const int rb = rows <= 4 ? 4 : rows <= 8 ? 8 : 16;
  a.n_chunks = (rows + rb - 1) / rb;
  a.reverse_chunks = 0;
  switch (a.vk) {
    case kVF32: launch_d<kVF32>(a, rb, s); break;
    case kVF16: launch_d<kVF16>(a, rb, s); break;
    case kVQ8: launch_d<kVQ8>(a, rb, s); break;
    default: launch_d<kVQ4>(a, rb, s); break;
  }
}

void run_decode(const AttentionParams& p, gpuStream_t s) {
  TileArgs a = make_tile_args(p);
  launch_decode_tiles(a, s);
}

}  // namespace gpu
}  // namespace dot4attn
