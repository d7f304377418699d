// Everything one Dot4GroupQueryAttention call needs after validation (cache_op.cc), for every backend.
#pragma once
#include <cstdint>
#include <vector>

#include "cache/cache_layout.h"
#include "common/formats.h"

namespace dot4attn {

struct CacheParams {
  int64_t B = 0, S = 0, Hq = 0, Hkv = 0;
  int D = 0;
  bool half = false;                 // T = float16, else float32
  VFormat v_format = VFormat::kQ8_0; // the V cache's rows (K is always q8_0)
  float scale = 1.f;
  int64_t split_k_min_keys = 2048;  // the route rule of Dot4Attention (route `auto`)

  // New tokens: query [B, S, Hq*D], key / value [B, S, Hkv*D]; packed QKV: one [B, S, (Hq + 2 Hkv) * D] tensor
  // (key and value null), each token's Q heads, then K heads, then V heads.
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  bool packed_qkv = false;

  // Caches. present_* are [B, Hkv, L, row]; past_* are [B, Hkv, past_rows, row] (the same memory when the runtime
  // shares the buffers: then only the new rows are written).
  const uint8_t* past_k = nullptr;
  const uint8_t* past_v = nullptr;
  int64_t past_rows = 0;
  uint8_t* present_k = nullptr;
  uint8_t* present_v = nullptr;
  int64_t L = 0;
  CacheRowMap map;  // the rows' widths and where a token's K and V parts lie in them (cache_layout.h)

  // Per batch row b (host): keys valid after this call (seqlens_k[b] + 1) and where the new tokens start. A GPU
  // decode step (S = 1) keeps seqlens_k on the device (dev_seqlens): total[b] is then total_sequence_length and
  // past[b] total_sequence_length - 1 for every row, the bounds the kernels clamp each row's own length to.
  std::vector<int64_t> total, past;
  const int32_t* dev_seqlens = nullptr;
  bool first_prompt = false;  // S == total_sequence_length: positions start at 0, shorter rows are right-padded

  // Rotary embedding (GroupQueryAttention's do_rotary): cos / sin [max_pos, rot/2] of T; rot <= D.
  bool rotary = false, interleaved = false;
  const void* cos = nullptr;
  const void* sin = nullptr;
  int64_t rot_half = 0, max_pos = 0;

  // Qwen3's RMS norms over each head of Q and K (weights [D] of T), applied before the rotation, each with its own
  // epsilon (GroupQueryAttention's q_norm_epsilon / k_norm_epsilon, both qk_norm_epsilon unless given).
  const void* q_norm = nullptr;
  const void* k_norm = nullptr;
  float q_norm_eps = 1e-6f, k_norm_eps = 1e-6f;

  void* out = nullptr;  // T [B, S, Hq*D]

  int64_t q_rows(int64_t b) const { return first_prompt ? (total[b] < S ? total[b] : S) : S; }
  bool shared() const { return past_k == present_k; }
};

}  // namespace dot4attn
