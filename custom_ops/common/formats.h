// The packed16 layouts shared by every backend (see docs/ops.md for the contract).
#pragma once
#include <cstdint>
#include <string>

namespace dot4attn {

constexpr int kBlock = 32;  // elements per scale along the head dimension D
constexpr int kMinHeadDim = 32;
constexpr int kMaxHeadDim = 256;

enum class QFormat { kQ8_0, kQ4_0, kQ6_0 };         // PackV payloads (PackK is always q8_0)
enum class VFormat { kFloat, kQ8_0, kQ4_0, kQ6_0 };  // how Dot4Attention's `value` is stored (codes stay: C entries)

// Parses "q8_0" / "q4_0" / "q6_0" / "float"; returns false for anything else.
inline bool parse_vformat(const std::string& s, VFormat* out) {
  if (s == "float") { *out = VFormat::kFloat; return true; }
  if (s == "q8_0") { *out = VFormat::kQ8_0; return true; }
  if (s == "q4_0") { *out = VFormat::kQ4_0; return true; }
  if (s == "q6_0") { *out = VFormat::kQ6_0; return true; }
  return false;
}

inline const char* vformat_name(VFormat f) {
  switch (f) {
    case VFormat::kFloat: return "float";
    case VFormat::kQ8_0: return "q8_0";
    case VFormat::kQ4_0: return "q4_0";
    case VFormat::kQ6_0: return "q6_0";
  }
  return "?";
}

// Bytes of one packed row's payload (its D/32 float16 scales are stored apart or after it): D for q8_0, D/2 for
// q4_0, 3 D / 4 for q6_0. Float V: D elements.
inline int64_t payload_bytes(int64_t D, VFormat f) {
  return f == VFormat::kQ4_0 ? D / 2 : f == VFormat::kQ6_0 ? 3 * D / 4 : D;
}

// q6_0: per 32-value block 24 bytes. Bytes 0..15 hold the low 4 bits of u = n + 32 exactly like q4_0's payload
// (element 2i in the low nibble of byte i, 2i+1 in its high nibble); bytes 16..23 the high 2 bits, byte 16 + j
// those of elements j, j + 8, j + 16, j + 24 at bits 0-1, 2-3, 4-5, 6-7. So elements 0..15 take their high bits
// from bytes 16..23 shifted by 0 (0..7) and 2 (8..15), elements 16..31 by 4 and 6: a SIMD decode in element order
// needs two shifts per half.
constexpr int kQ6BlockBytes = 24;
constexpr int kQ6LowBytes = 16;

// The level n in [-32, 31] of element e of a q6_0 block (the scalar decode).
inline int q6_level(const uint8_t* block, int e) {
  const int lo = (block[e / 2] >> (4 * (e & 1))) & 15;
  const int hi = (block[kQ6LowBytes + (e & 7)] >> (2 * (e >> 3))) & 3;
  return (lo | (hi << 4)) - 32;
}

inline bool head_dim_ok(int64_t d) { return d >= kMinHeadDim && d <= kMaxHeadDim && d % kBlock == 0; }

}  // namespace dot4attn
