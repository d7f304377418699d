// PackV's and the cache op's V blocks on the GPU, bit-for-bit common/quantize.h. Every function is called by all 32
// lanes of a group, one element x (or level) each, for one 32-value block.
//  * signed_block_scale_half: q4_0 / q6_0's block scale (block_scale_half_signed / block_signed_max): all 16 / 64
//    levels as ggml's q4_0, s = fp16(v / -half_levels) where v is the block's value of largest magnitude, the
//    positive one on a tie (which makes v independent of the order the shuffles combine the lanes in); amax is the
//    group's abs_or_inf max.
//  * store_q4_block / store_q6_block: the block's levels u = level + 8 / + 32 (lane = element) as common/formats.h
//    lays them out.
#pragma once

#include "gpu/vendor.h"

namespace dot4attn {
namespace gpu {

__device__ __forceinline__ uint16_t signed_block_scale_half(float x, float amax, float half_levels, float& div) {
  // Every lane takes part in the shuffles before the uniform early return (amax is the same in all lanes).
  const float hi = group32_max(fmaxf(x, 0.f));    // the CPU's hi (starts at 0)
  const float nlo = group32_max(fmaxf(-x, 0.f));  // minus the CPU's lo (starts at 0)
  if (amax == INFINITY) {  // a NaN / Inf block: NaN scale, q = 0
    div = 0.f;
    return uint16_t(0x7e00u);
  }
  const float v = hi >= nlo ? hi : -nlo;
  uint16_t sh = f2h(div_rn(v, -half_levels));
  if ((sh & 0x7fffu) == 0x7c00u) sh = uint16_t((sh & 0x8000u) | 0x7bffu);  // saturate at +-65504
  if ((sh & 0x7fffu) == 0) sh = 0;                                         // a zero scale is +0
  div = h2f(sh);
  return sh;
}

// 16 bytes: element 2 i in the low nibble of byte i, 2 i + 1 in its high nibble.
__device__ __forceinline__ void store_q4_block(uint8_t* block, int lane, int u) {
  const int hi = shfl_xor(u, 1);
  if ((lane & 1) == 0) block[lane >> 1] = uint8_t((u & 15) | ((hi & 15) << 4));
}

// 24 bytes: the low nibbles as q4_0's 16 bytes, then byte 16 + j holds the high 2 bits of elements j, j + 8,
// j + 16, j + 24 at bits 0-1, 2-3, 4-5, 6-7.
__device__ __forceinline__ void store_q6_block(uint8_t* block, int lane, int u) {
  store_q4_block(block, lane, u);
  int h = (u >> 4) << (2 * (lane >> 3));  // this lane's pair at its place in byte 16 + lane % 8
  h |= shfl_xor(h, 8);
  h |= shfl_xor(h, 16);
  if (lane < 8) block[16 + lane] = uint8_t(h);
}

}  // namespace gpu
}  // namespace dot4attn
