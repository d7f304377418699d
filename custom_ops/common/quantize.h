// Per-block quantization, the exact math of the contract (scalar; shared by PackK/PackV on CPU and by
// Dot4Attention's on-the-fly Q quantization). `static inline` so that ISA-specific TUs get their own copy.
#pragma once
#include <cmath>
#include <cstdint>

#include "common/fp16.h"
#include "common/formats.h"

namespace dot4attn {

// max |x| of a block, +inf when the block holds a NaN or +-Inf. Plain compares, not std::fmax: that would drop a
// NaN, and without SSE4.1 it is a library call per element.
static inline float block_absmax(const float* x) {
  float m = 0.f;
  bool nan = false;
  for (int i = 0; i < kBlock; ++i) {
    const float a = std::fabs(x[i]);
    nan |= a != a;
    m = a > m ? a : m;
  }
  return nan ? INFINITY : m;
}

// clamp for values that are never NaN (x / s of a finite block), as compares (see block_absmax).
static inline float clamp_q(float v, float lo, float hi) { return v < lo ? lo : v > hi ? hi : v; }

constexpr uint16_t kHalfNaN = 0x7e00;  // the scale of a block holding a NaN or +-Inf (docs/ops.md)
constexpr uint16_t kHalfMax = 0x7bff;  // 65504: the saturated scale of a finite block too large for float16

// The float16 scale of a block and the divisor its payload uses: 0 (q = 0) for a non-finite block, whose scale
// is NaN; a finite block whose scale would round to inf saturates at 65504 (its values then clamp).
static inline uint16_t block_scale_half(float amax, float qmax, float* divisor) {
  if (amax == INFINITY) {
    *divisor = 0.f;
    return kHalfNaN;
  }
  uint16_t sh = float_to_half(amax / qmax);
  if (sh == 0x7c00u) sh = kHalfMax;
  *divisor = half_to_float(sh);
  return sh;
}

// q8_0 with a float16 scale (PackK, PackV q8_0): s = fp16(max|x| / 127), q = clamp(rne(x / s), -127, 127).
static inline uint16_t quantize_q8_block(const float* x, int8_t* q) {
  float s;
  const uint16_t sh = block_scale_half(block_absmax(x), 127.f, &s);
  for (int i = 0; i < kBlock; ++i) {
    float v = s == 0.f ? 0.f : std::nearbyint(x[i] / s);
    v = clamp_q(v, -127.f, 127.f);
    q[i] = int8_t(v);
  }
  return sh;
}

// q4_0 uses all 16 levels, as ggml's q4_0 (q6_0 likewise all 64): v = the block's value of largest magnitude (the
// positive one on a tie, so that the choice does not depend on the order a reduction visits the block),
// s = fp16(v / -half_levels) (8 for q4_0, 32 for q6_0), so v itself is the lowest level and the opposite end of the
// block reaches +half_levels, which clamps to half_levels - 1. A scale that rounds to zero is stored as +0 (its
// payload is all zero levels); one that would round to +-inf saturates at +-65504.
static inline uint16_t block_scale_half_signed(float amax, float v, float half_levels, float* divisor) {
  if (amax == INFINITY) {
    *divisor = 0.f;
    return kHalfNaN;
  }
  uint16_t sh = float_to_half(v / -half_levels);
  if ((sh & 0x7fffu) == 0x7c00u) sh = uint16_t((sh & 0x8000u) | kHalfMax);
  if ((sh & 0x7fffu) == 0) sh = 0;
  *divisor = half_to_float(sh);
  return sh;
}

static inline uint16_t block_scale_half_q4(float amax, float v, float* divisor) {
  return block_scale_half_signed(amax, v, 8.f, divisor);
}

// The signed value of largest magnitude of a finite block, the positive one on a tie (0 for a zero block).
static inline float block_signed_max(const float* x) {
  float hi = 0.f, lo = 0.f;
  for (int i = 0; i < kBlock; ++i) {
    hi = x[i] > hi ? x[i] : hi;
    lo = x[i] < lo ? x[i] : lo;
  }
  return hi >= -lo ? hi : lo;
}

// q4_0: s as above, u = clamp(rne(x / s), -8, 7) + 8; element 2i in the low nibble of byte i.
static inline uint16_t quantize_q4_block(const float* x, uint8_t* q) {
  float s;
  const float amax = block_absmax(x);
  const uint16_t sh = block_scale_half_q4(amax, amax == INFINITY ? 0.f : block_signed_max(x), &s);
  for (int i = 0; i < kBlock; i += 2) {
    uint8_t u[2];
    for (int k = 0; k < 2; ++k) {
      float v = s == 0.f ? 0.f : std::nearbyint(x[i + k] / s);
      v = clamp_q(v, -8.f, 7.f);
      u[k] = uint8_t(int(v) + 8);
    }
    q[i / 2] = uint8_t(u[0] | (u[1] << 4));
  }
  return sh;
}

// q6_0: s = fp16(v / -32) as above, u = clamp(rne(x / s), -32, 31) + 32, stored as formats.h's q6_0 block: the
// low nibbles as q4_0's payload (16 bytes), then the high 2-bit pairs (8 bytes).
static inline uint16_t quantize_q6_block(const float* x, uint8_t* q) {
  float s;
  const float amax = block_absmax(x);
  const uint16_t sh = block_scale_half_signed(amax, amax == INFINITY ? 0.f : block_signed_max(x), 32.f, &s);
  uint8_t u[kBlock];
  for (int i = 0; i < kBlock; ++i) {
    float v = s == 0.f ? 0.f : std::nearbyint(x[i] / s);
    v = clamp_q(v, -32.f, 31.f);
    u[i] = uint8_t(int(v) + 32);
  }
  for (int i = 0; i < kQ6LowBytes; ++i) q[i] = uint8_t((u[2 * i] & 15) | ((u[2 * i + 1] & 15) << 4));
  for (int j = 0; j < 8; ++j) {
    const int h0 = u[j] >> 4, h1 = u[j + 8] >> 4, h2 = u[j + 16] >> 4, h3 = u[j + 24] >> 4;
    q[kQ6LowBytes + j] = uint8_t(h0 | (h1 << 2) | (h2 << 4) | (h3 << 6));
  }
  return sh;
}

// Q rows inside Dot4Attention: like q8_0 but the scale stays float32 (NaN, with q = 0, for a non-finite block:
// every logit of the row is then NaN).
static inline float quantize_q8_block_f32(const float* x, int8_t* q) {
  const float amax = block_absmax(x);
  const float s = amax == INFINITY ? 0.f : amax / 127.f;
  for (int i = 0; i < kBlock; ++i) {
    float v = s == 0.f ? 0.f : std::nearbyint(x[i] / s);
    v = clamp_q(v, -127.f, 127.f);
    q[i] = int8_t(v);
  }
  return amax == INFINITY ? NAN : s;
}

}  // namespace dot4attn
