// The attention half of Dot4GroupQueryAttention, shared by the CPU and GPU backends: batch row b attends with its
// own valid length (never the buffer's), its query rows bottom-right aligned to its keys, straight from the packed
// rows of the cache (strided AttentionParams: no copy of K or V).
#pragma once
#include <vector>

#include "common/attention_params.h"
#include "cache/cache_layout.h"
#include "cache/cache_params.h"

namespace dot4attn {

// Consecutive batch rows that attend in one call: they share their valid length and have all S query rows
// (decode; prompts of equal length). One call over nb rows instead of nb calls keeps the GPU's launch count and
// the CPU's parallel work independent of the batch; rows with their own length get a call each.
struct BatchRun {
  int64_t b0 = 0, nb = 1;
};

inline std::vector<BatchRun> cache_batch_runs(const CacheParams& c) {
  std::vector<BatchRun> runs;
  for (int64_t b = 0; b < c.B; ++b) {
    if (!runs.empty()) {
      BatchRun& r = runs.back();
      const int64_t last = r.b0 + r.nb - 1;
      if (c.q_rows(b) == c.S && c.q_rows(last) == c.S && c.total[b] == c.total[last]) {
        ++r.nb;
        continue;
      }
    }
    runs.push_back({b, 1});
  }
  return runs;
}

// The Dot4Attention call of batch rows r.b0 .. r.b0 + r.nb - 1, its route chosen (auto). Query / output scratch of
// batch row b: [Hq, q_rows(b), D] of T, at element b * Hq * S * D of a [B, Hq, S, D] buffer (rows past q_rows(b)
// unused; a run of several rows has q_rows = S, so its rows are one dense [nb, Hq, S, D] block).
inline AttentionParams cache_attention_params(const CacheParams& c, BatchRun r, const void* q_rows, void* out_rows) {
  const int64_t b = r.b0;
  AttentionParams p;
  p.B = r.nb; p.Hq = c.Hq; p.Hkv = c.Hkv; p.Sq = c.q_rows(b); p.Sk = c.total[b]; p.D = c.D;
  p.scale = c.scale;
  p.causal = true;
  p.half = c.half;
  p.v_format = c.v_format;
  const size_t elem = c.half ? 2 : 4;
  const int64_t q_off = b * c.Hq * c.S * c.D;
  p.q = static_cast<const char*>(q_rows) + q_off * elem;
  p.out = static_cast<char*>(out_rows) + q_off * elem;
  const CacheRowMap& m = c.map;  // where the parts of a token's rows lie (cache_layout.h)
  const int64_t n = c.B * c.Hkv * c.L, r0 = b * c.Hkv * c.L;  // token rows in all, batch row b's first
  p.k = reinterpret_cast<const int8_t*>(c.present_k + m.k_pay_at(r0));
  p.k_scales = reinterpret_cast<const uint16_t*>((m.k_scales_in_v ? c.present_v : c.present_k) + m.k_sc_at(r0, n));
  p.v = c.present_v + m.v_pay_at(r0);
  p.v_scales = reinterpret_cast<const uint16_t*>(c.present_v + m.v_sc_at(r0, n));
  p.kv_rows = c.L;
  p.k_stride = m.k_pay_stride();
  p.ks_stride = m.k_sc_stride() / 2;
  p.v_stride = m.v_pay_stride();
  p.vs_stride = m.v_sc_stride() / 2;
  p.dev_seqlens = c.dev_seqlens ? c.dev_seqlens + b : nullptr;
  p.route = choose_route(p, c.split_k_min_keys);
  return p;
}

}  // namespace dot4attn
