// q4_0's block scale on the GPU (PackV and the cache op's V rows), bit-for-bit common/quantize.h's
// block_scale_half_q4 / block_signed_max: 16 levels as ggml's q4_0, s = fp16(v / -8) where v is the block's value
// of largest magnitude, the positive one on a tie (which makes v independent of the order the shuffles combine
// the lanes in). Called by all 32 lanes of a group, one element x each; amax is the group's abs_or_inf max.
#pragma once

#include "gpu/vendor.h"

namespace dot4attn {
namespace gpu {

__device__ __forceinline__ uint16_t q4_block_scale_half(float x, float amax, float& div) {
  // Every lane takes part in the shuffles before the uniform early return (amax is the same in all lanes).
  const float hi = group32_max(fmaxf(x, 0.f));    // the CPU's hi (starts at 0)
  const float nlo = group32_max(fmaxf(-x, 0.f));  // minus the CPU's lo (starts at 0)
  if (amax == INFINITY) {  // a NaN / Inf block: NaN scale, q = 0
    div = 0.f;
    return uint16_t(0x7e00u);
  }
  const float v = hi >= nlo ? hi : -nlo;
  uint16_t sh = f2h(div_rn(v, -8.f));
  if ((sh & 0x7fffu) == 0x7c00u) sh = uint16_t((sh & 0x8000u) | 0x7bffu);  // saturate at +-65504
  if ((sh & 0x7fffu) == 0) sh = 0;                                         // a zero scale is +0
  div = h2f(sh);
  return sh;
}

}  // namespace gpu
}  // namespace dot4attn
