// The packed KV cache of Dot4GroupQueryAttention (docs/ops.md, "Packed cache"): one uint8 tensor per K and one
// per V per layer, [B, Hkv, L, row bytes]. Three layouts (attribute `cache_layout`) place a token's packed K and V:
//
//  rows  every token row is self-contained -- its int8 / q4_0 / q6_0 payload, then its float16 block scales, then
//        zero padding to a multiple of 16 bytes (K 144, q4_0 V 80 and q6_0 V 112 bytes at D = 128). The default.
//  pair  q4_0 or q6_0 V: both tensors D bytes wide, as a runtime that gives K and V one width allocates them
//        (onnxruntime-genai sizes the V cache by the K cache's last dimension). The K tensor holds K's int8
//        payload alone; the V tensor holds V's payload, V's scales, K's scales, then zeros:
//        [v payload D/2 or 3D/4 | v scales D/16 | k scales D/16 | 0 ...]. 2 D bytes per token and head (K + q4_0
//        V need 13 D / 8, K + q6_0 V 15 D / 8): 256 at D = 128 where rows take 224 (q4_0) / 256 (q6_0) and q8_0
//        V under genai 288.
//
//  tight no padding: the K tensor holds every token row's K payload (D bytes) in one run, then every token row's
//        D/32 float16 scales in the run after it; the V tensor the same with V's payload (q8_0 D, q4_0 D/2, q6_0
//        3D/4 bytes). Token row r = (b Hkv + h) L + position of n = B Hkv L: payload at r * payload, scales at
//        n * payload + r * D/16. The tensors keep the widths of rows without padding (K D + D/16 bytes: 68 at
//        D = 64, 136 at D = 128; q8_0 V the same, q4_0 V 36 / 72, q6_0 V 52 / 104), so K + q8_0 V take 17 D / 8
//        bytes per token and head, ORT's int8 cache 2 D (+6.25 %, the least 32-value blocks with float16 scales
//        take; the rows layout pads that to 160 at D = 64, +25 %). Each run is the dense tensors' layout with L
//        rows per (batch, KV head): payload rows a multiple of 16 bytes apart, scale rows D/16 apart, so every GPU
//        kernel reads it as it reads dense K / V. A token's bytes are not in its rows: only a cache whose past and
//        present share one buffer may use it (a runtime's row or batch copies, as rewind or beam reorder of
//        unshared caches, would mix tokens), and the op refuses unshared ones.
//
// In rows and pair a token's bytes stay within its two rows, so a runtime that owns the cache (onnxruntime-genai:
// rewind, beam reorder) may copy whole rows; their row strides are multiples of 16 bytes (16-byte / TMA loads)
// and every part starts aligned to its own size (the pair layout's K scales at D/2 + D/16 or 3D/4 + D/16: 8-byte
// aligned at D = 128).
#pragma once
#include <cstdint>

#include "common/formats.h"

namespace dot4attn {

enum class CacheLayout { kRows, kPair, kTight };

// The V formats whose payload and both scale runs fit a V row of D bytes (q4_0: 5 D / 8, q6_0: 7 D / 8).
inline bool pair_takes_vformat(VFormat f) { return f == VFormat::kQ4_0 || f == VFormat::kQ6_0; }

// Payload (formats.h's payload_bytes; the scales start there) + D/32 float16 scales, rounded up to 16 bytes
// (D = 128: 136 -> 144 for q8_0, 72 -> 80 for q4_0, 104 -> 112 for q6_0).
inline int64_t cache_row_bytes(int64_t D, VFormat f) {
  return (payload_bytes(D, f) + 2 * (D / kBlock) + 15) / 16 * 16;
}

#if defined(__CUDACC__) || defined(__HIPCC__)
#define D4A_CACHE_HD __host__ __device__
#else
#define D4A_CACHE_HD
#endif

// Where each part of a token's packed K and V lies, and the tensors' row widths. rows / pair: a token row's parts
// in its K row and V row (byte offsets); tight (split): in the payload and scale runs of each tensor.
struct CacheRowMap {
  int64_t k_row = 0, v_row = 0;  // row bytes of the K and the V tensor (their last dimension)
  bool split = false;            // tight: payloads in one run, scales in the next (above); no zeros
  bool k_scales_in_v = false;    // K's scales lie in the V row (pair), else in the K row after K's payload
  // rows / pair only (split reads none of these four: k_sc_at / v_sc_at, and it has no zeros)
  int64_t k_scales_off = 0;      // K's scales, in the row k_scales_in_v names
  int64_t v_scales_off = 0;      // V's scales in the V row (V's payload starts the V row, K's the K row)
  int64_t k_zero_from = 0;       // K row bytes from here on are zero
  int64_t v_zero_from = 0;       // V row bytes from here on are zero
  int64_t k_payload = 0, v_payload = 0, scale_bytes = 0;  // a token head's K / V payload and scale bytes

  // Token row r = (b Hkv + h) L + position of n = B Hkv L: byte offsets of its parts in their tensors (K's scales
  // in the tensor k_scales_in_v names) and the byte strides from one token row's part to the next.
  D4A_CACHE_HD int64_t k_pay_stride() const { return split ? k_payload : k_row; }
  D4A_CACHE_HD int64_t v_pay_stride() const { return split ? v_payload : v_row; }
  D4A_CACHE_HD int64_t k_sc_stride() const { return split ? scale_bytes : k_scales_in_v ? v_row : k_row; }
  D4A_CACHE_HD int64_t v_sc_stride() const { return split ? scale_bytes : v_row; }
  D4A_CACHE_HD int64_t k_pay_at(int64_t r) const { return r * k_pay_stride(); }
  D4A_CACHE_HD int64_t v_pay_at(int64_t r) const { return r * v_pay_stride(); }
  D4A_CACHE_HD int64_t k_sc_at(int64_t r, int64_t n) const {
    return split ? n * k_payload + r * scale_bytes : r * k_sc_stride() + k_scales_off;
  }
  D4A_CACHE_HD int64_t v_sc_at(int64_t r, int64_t n) const {
    return split ? n * v_payload + r * scale_bytes : r * v_row + v_scales_off;
  }
};

inline CacheRowMap cache_row_map(int64_t D, VFormat v, CacheLayout layout) {
  CacheRowMap m;
  const int64_t scales = 2 * (D / kBlock), vp = payload_bytes(D, v);
  m.v_scales_off = vp;
  m.k_payload = D;
  m.v_payload = vp;
  m.scale_bytes = scales;
  if (layout == CacheLayout::kPair) {  // q4_0 / q6_0 V (cache_op.cc refuses the rest): 5 D / 8, 7 D / 8 <= D
    m.k_row = m.v_row = D;
    m.k_scales_in_v = true;
    m.k_scales_off = vp + scales;
    m.k_zero_from = D;
    m.v_zero_from = vp + 2 * scales;
  } else if (layout == CacheLayout::kTight) {
    m.k_row = D + scales;
    m.v_row = vp + scales;
    m.split = true;  // the offsets and zero starts below are the rows / pair layouts' only
  } else {
    m.k_row = cache_row_bytes(D, VFormat::kQ8_0);
    m.v_row = cache_row_bytes(D, v);
    m.k_scales_off = D;
    m.k_zero_from = D + scales;
    m.v_zero_from = vp + scales;
  }
  return m;
}

}  // namespace dot4attn
