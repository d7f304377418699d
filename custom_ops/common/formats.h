// The packed16 layouts shared by every backend (see docs/ops.md for the contract).
#pragma once
#include <cstdint>
#include <string>

namespace dot4attn {

constexpr int kBlock = 32;  // elements per scale along the head dimension D
constexpr int kMinHeadDim = 32;
constexpr int kMaxHeadDim = 256;

enum class QFormat { kQ8_0, kQ4_0 };           // PackV payloads (PackK is always q8_0)
enum class VFormat { kFloat, kQ8_0, kQ4_0 };   // how Dot4Attention's `value` is stored

// Parses "q8_0" / "q4_0" / "float"; returns false for anything else.
inline bool parse_vformat(const std::string& s, VFormat* out) {
  if (s == "float") { *out = VFormat::kFloat; return true; }
  if (s == "q8_0") { *out = VFormat::kQ8_0; return true; }
  if (s == "q4_0") { *out = VFormat::kQ4_0; return true; }
  return false;
}

inline bool head_dim_ok(int64_t d) { return d >= kMinHeadDim && d <= kMaxHeadDim && d % kBlock == 0; }

}  // namespace dot4attn
