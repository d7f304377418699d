// The decode route's SIMT decode-kernel instances (gpu/decode_kernel.cuh): every (V format, D, rows per block),
// dense and strided rows (q6_0: D a multiple of 64).
#include "decode/decode_instances.h"
#include "gpu/decode_kernel.cuh"

namespace dot4attn {
namespace gpu {

namespace {

// q6_0 rows of 3 D / 4 bytes move in 16-byte pieces only at D % 64 == 0: no instance elsewhere (the planner refuses
// q6_0 V at other D on the GPU).
template <int VK, int D, int RB>
void simt_launch(const GpuPlan& pl, const TileArgs& a, gpuStream_t s) {
  if constexpr (v_row_bytes(VK, D) % 16 != 0) {
    no_instance(pl);
  } else if (dense_rows<VK, D>(a)) launch_planned(decode_kernel<VK, D, RB, kDecodeMaxStages, false>, pl, s, a);
  else launch_planned(decode_kernel<VK, D, RB, kDecodeMaxStages, true>, pl, s, a);
}

template <int VK, int RB>
void simt_d(const GpuPlan& pl, const TileArgs& a, gpuStream_t s) {
  switch (a.D) {
    case 32: return simt_launch<VK, 32, RB>(pl, a, s);
    case 64: return simt_launch<VK, 64, RB>(pl, a, s);
    case 96: return simt_launch<VK, 96, RB>(pl, a, s);
    case 128: return simt_launch<VK, 128, RB>(pl, a, s);
    case 160: return simt_launch<VK, 160, RB>(pl, a, s);
    case 192: return simt_launch<VK, 192, RB>(pl, a, s);
    case 224: return simt_launch<VK, 224, RB>(pl, a, s);
    case 256: return simt_launch<VK, 256, RB>(pl, a, s);
    default: no_instance(pl);
  }
}

template <int VK>
void simt_rb(const GpuPlan& pl, const TileArgs& a, gpuStream_t s) {
  switch (pl.rows_per_block) {
    case 1: return simt_d<VK, 1>(pl, a, s);
    case 4: return simt_d<VK, 4>(pl, a, s);
    case 8: return simt_d<VK, 8>(pl, a, s);
    default: no_instance(pl);
  }
}

}  // namespace

void run_decode_simt(const GpuPlan& pl, const TileArgs& a, gpuStream_t s) {
  switch (a.vk) {
    case kVF32: return simt_rb<kVF32>(pl, a, s);
    case kVF16: return simt_rb<kVF16>(pl, a, s);
    case kVQ8: return simt_rb<kVQ8>(pl, a, s);
    case kVQ6: return simt_rb<kVQ6>(pl, a, s);
    default: return simt_rb<kVQ4>(pl, a, s);
  }
}

}  // namespace gpu
}  // namespace dot4attn
