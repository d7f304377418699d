// CPU backend of Dot4GroupQueryAttention: copy the past rows when the buffers are not shared, norm / rotate /
// pack the new tokens into their cache rows and lay Q out per head, attend per batch row over the packed rows
// (strided, through the Dot4Attention CPU routes), and lay the output back out as [B, S, Hq * D].
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "attention/attention_backends.h"
#include "cache/cache_attention.h"
#include "cache/cache_backends.h"
#include "common/fp16.h"
#include "common/kernel_io.h"
#include "cpu/isa.h"
#include "common/quantize.h"

namespace dot4attn {
namespace {

// Element offset of head h of token (b, s) in the query (which 0), key (1) or value (2) input.
int64_t head_offset(const CacheParams& c, int which, int64_t b, int64_t s, int64_t h) {
  if (c.packed_qkv) {
    const int64_t first = which == 0 ? 0 : which == 1 ? c.Hq : c.Hq + c.Hkv;
    return ((b * c.S + s) * (c.Hq + 2 * c.Hkv) + first + h) * c.D;
  }
  return ((b * c.S + s) * (which == 0 ? c.Hq : c.Hkv) + h) * c.D;
}

void load_floats(const void* src, bool half, int64_t off, int n, float* dst) {
  if (half) cpu_kernels().halves_to_floats(static_cast<const uint16_t*>(src) + off, dst, n);
  else std::memcpy(dst, static_cast<const float*>(src) + off, sizeof(float) * n);
}

// RMS norm over the head (Qwen3's q_norm / k_norm): x * w / sqrt(mean(x^2) + eps).
void rms_norm(const CacheParams& c, const void* w, float eps, float* x) {
  if (!w) return;
  float wf[kMaxHeadDim];
  load_floats(w, c.half, 0, c.D, wf);
  double ss = 0;
  for (int d = 0; d < c.D; ++d) ss += double(x[d]) * x[d];
  const float inv = 1.f / std::sqrt(float(ss / c.D) + eps);
  for (int d = 0; d < c.D; ++d) x[d] = x[d] * inv * wf[d];
}

// GroupQueryAttention's rotary embedding at position pos over the first 2 * rot_half dims: halves
// (x_i, x_{i + rot_half}) or, interleaved, pairs (x_{2i}, x_{2i+1}).
void rotate(const CacheParams& c, int64_t pos, float* x) {
  if (!c.rotary) return;
  const int64_t R = c.rot_half;
  float cs[kMaxHeadDim / 2], sn[kMaxHeadDim / 2];
  load_floats(c.cos, c.half, pos * R, int(R), cs);
  load_floats(c.sin, c.half, pos * R, int(R), sn);
  for (int64_t i = 0; i < R; ++i) {
    const int64_t i0 = c.interleaved ? 2 * i : i, i1 = c.interleaved ? 2 * i + 1 : i + R;
    const float a = x[i0], b = x[i1];
    x[i0] = a * cs[i] - b * sn[i];
    x[i1] = b * cs[i] + a * sn[i];
  }
}

// One token's K or V: its payload at the start of `row`, its float16 scales at `scales`.
void pack_part(const float* x, int D, VFormat f, uint8_t* row, uint8_t* scales) {
  uint16_t s[kMaxHeadDim / kBlock];
  for (int blk = 0; blk < D / kBlock; ++blk) {
    const float* xb = x + blk * kBlock;
    switch (f) {
      case VFormat::kQ4_0: s[blk] = quantize_q4_block(xb, row + blk * kBlock / 2); break;
      case VFormat::kQ6_0: s[blk] = quantize_q6_block(xb, row + blk * kQ6BlockBytes); break;
      default: s[blk] = quantize_q8_block(xb, reinterpret_cast<int8_t*>(row) + blk * kBlock); break;
    }
  }
  std::memcpy(scales, s, 2 * (D / kBlock));
}

// Token row r's K and V of one head (cache_layout.h's map; r of n = B Hkv L): payloads and scales where the layout
// puts them, and the zeros after them in the layouts whose rows are self-contained.
void pack_token(const float* k, const float* v, const CacheParams& c, int64_t r, int64_t n) {
  const CacheRowMap& m = c.map;
  pack_part(k, c.D, VFormat::kQ8_0, c.present_k + m.k_pay_at(r),
            (m.k_scales_in_v ? c.present_v : c.present_k) + m.k_sc_at(r, n));
  pack_part(v, c.D, c.v_format, c.present_v + m.v_pay_at(r), c.present_v + m.v_sc_at(r, n));
  if (m.split) return;
  std::memset(c.present_k + r * m.k_row + m.k_zero_from, 0, size_t(m.k_row - m.k_zero_from));
  std::memset(c.present_v + r * m.v_row + m.v_zero_from, 0, size_t(m.v_row - m.v_zero_from));
}

void store_floats(const float* src, bool half, void* dst, int64_t off, int n) {
  if (half) cpu_kernels().floats_to_halves(src, static_cast<uint16_t*>(dst) + off, n);
  else std::memcpy(static_cast<float*>(dst) + off, src, sizeof(float) * n);
}

}  // namespace

void cache_attention_cpu(const CacheParams& c, OrtKernelContext* ctx) {
  const int D = c.D;
  const size_t elem = c.half ? 2 : 4;
  // 1. Not shared: the present caches start as the past rows, the rest zeros (rows and pair: cache_op.cc refuses
  // an unshared tight cache, whose runs move with L).
  if (!c.shared()) {
    parallel_for(ctx, size_t(c.B * c.Hkv), [&](size_t bh) {
      for (int t = 0; t < 2; ++t) {
        const int64_t row = t == 0 ? c.map.k_row : c.map.v_row;
        const uint8_t* src = (t == 0 ? c.past_k : c.past_v) + int64_t(bh) * c.past_rows * row;
        uint8_t* dst = (t == 0 ? c.present_k : c.present_v) + int64_t(bh) * c.L * row;
        std::memcpy(dst, src, size_t(c.past_rows * row));
        std::memset(dst + c.past_rows * row, 0, size_t((c.L - c.past_rows) * row));
      }
    });
  }
  // 2. New tokens: K and V rows into the caches, Q (normed, rotated) into q_rows [B][Hq][q_rows(b)][D].
  // Scratch left uninitialised: rows past q_rows(b) are never read, every other byte is written first.
  const size_t scratch = size_t(c.B * c.Hq * c.S * D) * elem;
  std::unique_ptr<uint8_t[]> q_rows(new uint8_t[scratch]), out_rows(new uint8_t[scratch]);
  parallel_for(ctx, size_t(c.B * c.S), [&](size_t item) {
    const int64_t b = int64_t(item) / c.S, s = int64_t(item) % c.S;
    const int64_t pos = c.past[b] + s;
    float x[kMaxHeadDim], xv[kMaxHeadDim];
    for (int64_t h = 0; h < c.Hkv; ++h) {
      load_floats(c.packed_qkv ? c.q : c.k, c.half, head_offset(c, 1, b, s, h), D, x);
      rms_norm(c, c.k_norm, c.k_norm_eps, x);
      rotate(c, pos, x);
      load_floats(c.packed_qkv ? c.q : c.v, c.half, head_offset(c, 2, b, s, h), D, xv);
      pack_token(x, xv, c, (b * c.Hkv + h) * c.L + pos, c.B * c.Hkv * c.L);
    }
    if (s >= c.q_rows(b)) return;  // right padding of a first prompt: no query row
    for (int64_t h = 0; h < c.Hq; ++h) {
      load_floats(c.q, c.half, head_offset(c, 0, b, s, h), D, x);
      rms_norm(c, c.q_norm, c.q_norm_eps, x);
      rotate(c, pos, x);
      store_floats(x, c.half, q_rows.get(), b * c.Hq * c.S * D + (h * c.q_rows(b) + s) * D, D);
    }
  });
  // 3. Attention over each batch row's own valid keys (rows of one length together).
  for (const BatchRun& r : cache_batch_runs(c)) {
    AttentionParams p = cache_attention_params(c, r, q_rows.get(), out_rows.get());
    if (p.route == Route::kSplitK) p.n_splits = cpu_split_count(p);
    attention_cpu(p, ctx);
  }
  // 4. [B][Hq][q_rows][D] -> [B, S, Hq * D]; padding rows of a first prompt are zeros.
  parallel_for(ctx, size_t(c.B * c.S), [&](size_t item) {
    const int64_t b = int64_t(item) / c.S, s = int64_t(item) % c.S;
    char* dst = static_cast<char*>(c.out) + (b * c.S + s) * c.Hq * D * elem;
    if (s >= c.q_rows(b)) {
      std::memset(dst, 0, size_t(c.Hq * D) * elem);
      return;
    }
    for (int64_t h = 0; h < c.Hq; ++h)
      std::memcpy(dst + h * D * elem, out_rows.get() + (b * c.Hq * c.S * D + (h * c.q_rows(b) + s) * D) * elem,
                  D * elem);
  });
}

}  // namespace dot4attn
