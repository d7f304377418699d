// CPU backend of Dot4Attention: route dispatch and the row helpers the routes share.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>

#include "attention/attention_backends.h"
#include "cpu/rows.h"
#include "common/fp16.h"
#include "common/kernel_io.h"
#include "common/quantize.h"

namespace dot4attn {

int64_t cpu_parallel_units() {
  static const int64_t n = std::max(1u, std::thread::hardware_concurrency());
  return n;
}

int64_t cpu_split_count(const AttentionParams& p) {
  return choose_splits(p.B * p.Hkv, p.Sk, cpu_parallel_units(), /*waves=*/2, /*min keys=*/256);
}

void attention_cpu(const AttentionParams& p, OrtKernelContext* ctx) {
  if (p.Sk == 0 || p.Hkv == 0) {  // no key at all: every row outputs zeros
    const size_t bytes = size_t(p.B * p.Hq * p.Sq * p.D) * (p.half ? 2 : 4);
    std::memset(p.out, 0, bytes);
    return;
  }
  cpu_isa();  // reports a bad DOT4ATTN_CPU_ISA before any worker starts
  switch (p.route) {
    case Route::kPrefill: prefill_cpu(p, ctx); break;
    case Route::kDecode: decode_cpu(p, ctx); break;
    case Route::kSplitK: split_k_cpu(p, ctx); break;
    case Route::kAuto: break;  // resolved by the op
  }
}

AttendRows RowBlock::rows(int D) const {
  AttendRows r;
  r.M = M;
  r.D = D;
  r.q = q.data();
  r.qs = qs.data();
  r.k_limit = causal ? limit.data() : nullptr;
  r.mask_off = mask_off.data();
  return r;
}

AttendState RowBlock::state() { return AttendState{m.data(), l.data(), acc.data()}; }

int64_t RowBlock::key_end(int64_t sk) const {
  if (!causal) return sk;
  int64_t e = 0;
  for (int64_t v : limit) e = std::max(e, v);
  return e;
}

void RowBlock::reset_state(int D) {
  std::fill(m.begin(), m.end(), -std::numeric_limits<float>::infinity());
  std::fill(l.begin(), l.end(), 0.f);
  std::fill(acc.begin(), acc.begin() + int64_t(M) * D, 0.f);
}

void load_rows(const AttentionParams& p, int64_t b, int64_t hkv, int64_t i0, int64_t i1, RowBlock& rb) {
  constexpr float kLog2e = 1.4426950408889634f;
  const int D = p.D, nb = D / kBlock;
  const int64_t G = p.group(), n_i = i1 - i0;
  rb.b = b; rb.hkv = hkv; rb.i0 = i0; rb.i1 = i1;
  rb.M = int(G * n_i);
  rb.causal = p.causal;
  rb.q.resize(size_t(rb.M) * D);
  rb.qs.resize(size_t(rb.M) * nb);
  rb.m.resize(rb.M);
  rb.l.resize(rb.M);
  rb.acc.resize(size_t(rb.M) * D);
  rb.limit.resize(rb.M);
  rb.mask_off.resize(rb.M);
  const CpuKernels& kern = cpu_kernels();
  float row[kMaxHeadDim];
  for (int64_t g = 0; g < G; ++g) {
    const int64_t h = hkv * G + g;
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t m = g * n_i + (i - i0);
      const int64_t src = ((b * p.Hq + h) * p.Sq + i) * D;
      if (p.half) {
        kern.halves_to_floats(static_cast<const uint16_t*>(p.q) + src, row, D);
      } else {
        std::memcpy(row, static_cast<const float*>(p.q) + src, sizeof(float) * D);
      }
      for (int blk = 0; blk < nb; ++blk)
        rb.qs[m * nb + blk] = quantize_q8_block_f32(row + blk * kBlock, rb.q.data() + m * D + blk * kBlock) *
                              p.scale * kLog2e;
      rb.limit[m] = std::clamp<int64_t>(p.Sk - p.Sq + i + 1, 0, p.Sk);
      rb.mask_off[m] = b * p.mask_stride[0] + h * p.mask_stride[1] + i * p.mask_stride[2];
    }
  }
  rb.reset_state(D);
}

void store_rows(const AttentionParams& p, const RowBlock& rb) {
  const int D = p.D;
  const CpuKernels& kern = cpu_kernels();
  const int64_t G = p.group(), n_i = rb.i1 - rb.i0;
  for (int64_t g = 0; g < G; ++g) {
    const int64_t h = rb.hkv * G + g;
    for (int64_t i = rb.i0; i < rb.i1; ++i) {
      const int64_t m = g * n_i + (i - rb.i0);
      const int64_t dst = ((rb.b * p.Hq + h) * p.Sq + i) * D;
      const float l = rb.l[m];
      const float* a = rb.acc.data() + m * D;
      // Non-finite policy: a row that saw a poisoned key (NaN l, or a non-finite accumulator) is NaN throughout.
      bool poisoned = l != l;
      for (int d = 0; d < D; ++d) poisoned |= !std::isfinite(a[d]);
      const float inv = poisoned ? std::numeric_limits<float>::quiet_NaN() : l > 0.f ? 1.f / l : 0.f;
      if (p.half) {  // finite results saturate at +-65504 (docs/ops.md): never inf from a finite row
        float row[kMaxHeadDim];
        if (poisoned) std::fill(row, row + D, inv);
        else for (int d = 0; d < D; ++d) row[d] = clamp_q(a[d] * inv, -65504.f, 65504.f);
        kern.floats_to_halves(row, static_cast<uint16_t*>(p.out) + dst, D);
      } else {
        float* o = static_cast<float*>(p.out) + dst;
        for (int d = 0; d < D; ++d) o[d] = a[d] * inv;
      }
    }
  }
}

AttendKv kv_view(const AttentionParams& p, int64_t b, int64_t hkv) {
  const int64_t row0 = (b * p.Hkv + hkv) * p.head_rows();  // first storage row of this (b, kv head)
  AttendKv kv;
  kv.k_stride = p.k_row();
  kv.ks_stride = p.ks_row();
  kv.v_stride = p.v_row();
  kv.vs_stride = p.vs_row();
  kv.k = p.k + row0 * kv.k_stride;
  kv.ks = p.k_scales + row0 * kv.ks_stride;
  kv.format = p.v_format;
  kv.v_half = p.half;
  const int64_t v_elem = p.v_format == VFormat::kFloat ? (p.half ? 2 : 4) : 1;
  kv.v = static_cast<const char*>(p.v) + row0 * kv.v_stride * v_elem;
  if (p.v_scales) kv.vs = p.v_scales + row0 * kv.vs_stride;
  return kv;
}

AttendMask mask_view(const AttentionParams& p) {
  AttendMask m;
  m.kind = p.mask_kind;
  m.half = p.half;
  m.base = p.mask;
  m.stride_j = p.mask_stride[3];
  return m;
}

}  // namespace dot4attn
