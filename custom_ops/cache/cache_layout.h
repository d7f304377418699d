// The packed KV cache of Dot4GroupQueryAttention (docs/ops.md, "Packed cache"): one uint8 tensor per K and one
// per V per layer, [B, Hkv, L, row_bytes]. Every token row is self-contained -- its int8 / q4_0 payload, then its
// float16 block scales, then zero padding -- so a runtime that owns the cache (onnxruntime-genai: rewind, beam
// reorder) may copy whole rows, and row strides stay multiples of 16 bytes for 16-byte / TMA loads.
#pragma once
#include <cstdint>

#include "common/formats.h"

namespace dot4attn {

// Bytes of a row's payload: D (q8_0, K) or D/2 (q4_0); the scales start there.
inline int64_t cache_payload_bytes(int64_t D, VFormat f) { return f == VFormat::kQ4_0 ? D / 2 : D; }

// Payload + D/32 float16 scales, rounded up to 16 bytes (D = 128: 136 -> 144 for q8_0, 72 -> 80 for q4_0).
inline int64_t cache_row_bytes(int64_t D, VFormat f) {
  return (cache_payload_bytes(D, f) + 2 * (D / kBlock) + 15) / 16 * 16;
}

}  // namespace dot4attn
