// The decode route's tile-kernel instances (gpu/attention_tile.cuh): decode and split_k stage 1 rows of 4 / 8 / 16
// (and 16 rows of 32-key tiles at D > 128).
#include "decode/decode_instances.h"

namespace dot4attn {
namespace gpu {

namespace {

// Rows of 4 / 8 / 16 per block, 3 stages at most; at D > 128, where no such block of 64-key tiles fits the shared
// memory (AMD's 64 KB LDS), 16 rows of 32-key tiles (launch_plan.cu, plan_tile).
template <int VK, int DMAX>
void tile_rb(const GpuPlan& pl, const TileArgs& a, gpuStream_t s) {
  if (pl.key_tile != kTileKeys) {
    if constexpr (DMAX == 256) {
      if (pl.key_tile == 32 && pl.rows_per_block == 16)
        return launch_planned(attn_tile_kernel<VK, DMAX, 16, 16, 3, 32>, pl, s, a);
    }
    no_instance(pl);
  }
  switch (pl.rows_per_block) {
    case 4: return launch_planned(attn_tile_kernel<VK, DMAX, 4, 4, 3>, pl, s, a);
    case 8: return launch_planned(attn_tile_kernel<VK, DMAX, 8, 8, 3>, pl, s, a);
    case 16: return launch_planned(attn_tile_kernel<VK, DMAX, 16, 16, 3>, pl, s, a);
    default: no_instance(pl);
  }
}

template <int VK>
void tile_d(const GpuPlan& pl, const TileArgs& a, gpuStream_t s) {
  if (a.D <= 64) tile_rb<VK, 64>(pl, a, s);
  else if (a.D <= 128) tile_rb<VK, 128>(pl, a, s);
  else tile_rb<VK, 256>(pl, a, s);
}

}  // namespace

void run_decode_tile(const GpuPlan& pl, const TileArgs& a, gpuStream_t s) {
  switch (a.vk) {
    case kVF32: return tile_d<kVF32>(pl, a, s);
    case kVF16: return tile_d<kVF16>(pl, a, s);
    case kVQ8: return tile_d<kVQ8>(pl, a, s);
    case kVQ6: return tile_d<kVQ6>(pl, a, s);
    default: return tile_d<kVQ4>(pl, a, s);
  }
}

}  // namespace gpu
}  // namespace dot4attn
