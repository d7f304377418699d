// Per-block quantization, the exact math of the contract (scalar; shared by PackK/PackV on CPU and by
// Dot4Attention's on-the-fly Q quantization). `static inline` so that ISA-specific TUs get their own copy.
#pragma once
#include <cmath>
#include <cstdint>

#include "common/fp16.h"
#include "common/formats.h"

namespace dot4attn {

static inline float block_absmax(const float* x) {
  float m = 0.f;
  for (int i = 0; i < kBlock; ++i) m = std::fmax(m, std::fabs(x[i]));
  return m;
}

// q8_0 with a float16 scale (PackK, PackV q8_0): s = fp16(max|x| / 127), q = clamp(rne(x / s), -127, 127).
static inline uint16_t quantize_q8_block(const float* x, int8_t* q) {
  const uint16_t sh = float_to_half(block_absmax(x) / 127.f);
  const float s = half_to_float(sh);
  for (int i = 0; i < kBlock; ++i) {
    float v = s == 0.f ? 0.f : std::nearbyint(x[i] / s);
    v = std::fmin(std::fmax(v, -127.f), 127.f);
    q[i] = int8_t(v);
  }
  return sh;
}

// q4_0: s = fp16(max|x| / 7), u = clamp(rne(x / s), -8, 7) + 8; element 2i in the low nibble of byte i.
static inline uint16_t quantize_q4_block(const float* x, uint8_t* q) {
  const uint16_t sh = float_to_half(block_absmax(x) / 7.f);
  const float s = half_to_float(sh);
  for (int i = 0; i < kBlock; i += 2) {
    uint8_t u[2];
    for (int k = 0; k < 2; ++k) {
      float v = s == 0.f ? 0.f : std::nearbyint(x[i + k] / s);
      v = std::fmin(std::fmax(v, -8.f), 7.f);
      u[k] = uint8_t(int(v) + 8);
    }
    q[i / 2] = uint8_t(u[0] | (u[1] << 4));
  }
  return sh;
}

// Q rows inside Dot4Attention: like q8_0 but the scale stays float32.
static inline float quantize_q8_block_f32(const float* x, int8_t* q) {
  const float s = block_absmax(x) / 127.f;
  for (int i = 0; i < kBlock; ++i) {
    float v = s == 0.f ? 0.f : std::nearbyint(x[i] / s);
    v = std::fmin(std::fmax(v, -127.f), 127.f);
    q[i] = int8_t(v);
  }
  return s;
}

}  // namespace dot4attn
