// split_k route (FlashDecoding): stage 1 runs (batch, KV head, key split) work items in parallel, each with
// its own online-softmax state; stage 2 merges the splits of each row by log-sum-exp:
//   M = max_s m_s,  l = sum_s l_s 2^(m_s - M),  acc = sum_s acc_s 2^(m_s - M),  out = acc / l.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/rows.h"
#include "common/kernel_io.h"

namespace dot4attn {

void split_k_cpu(const AttentionParams& p, OrtKernelContext* ctx) {
  const CpuKernels& kern = cpu_kernels();
  const AttendMask mask = mask_view(p);
  const int D = p.D;
  const int64_t S = std::max<int64_t>(1, p.n_splits);
  const int64_t BH = p.B * p.Hkv;
  const int64_t M = p.group() * p.Sq;
  // Splits are whole 64-key tiles. The last query row sees every key, causal or not, so splits cover all Sk.
  const int64_t key_end = p.Sk;
  const int64_t per_split = ((key_end + S - 1) / S + 63) / 64 * 64;
  std::vector<float> part_m(size_t(BH * S * M)), part_l(size_t(BH * S * M)), part_acc(size_t(BH * S * M * D));

  parallel_for(ctx, size_t(BH * S), [&](size_t item) {
    thread_local RowBlock rb;
    const int64_t bh = int64_t(item) / S, s = int64_t(item) % S;
    const int64_t b = bh / p.Hkv, hkv = bh % p.Hkv;
    load_rows(p, b, hkv, 0, p.Sq, rb);
    const int64_t k0 = std::min(key_end, s * per_split), k1 = std::min(rb.key_end(p.Sk), k0 + per_split);
    AttendState st = rb.state();
    if (k1 > k0) kern.attend(rb.rows(D), kv_view(p, b, hkv), mask, k0, k1, st);
    const size_t base = size_t(item) * M;
    std::copy(rb.m.begin(), rb.m.end(), part_m.begin() + base);
    std::copy(rb.l.begin(), rb.l.end(), part_l.begin() + base);
    std::copy(rb.acc.begin(), rb.acc.begin() + M * D, part_acc.begin() + base * D);
  });

  parallel_for(ctx, size_t(BH), [&](size_t bh) {
    thread_local RowBlock rb;
    const int64_t b = int64_t(bh) / p.Hkv, hkv = int64_t(bh) % p.Hkv;
    // Only the bookkeeping of the row block is needed here (shapes, output rows); its state is overwritten.
    rb.b = b; rb.hkv = hkv; rb.i0 = 0; rb.i1 = p.Sq; rb.M = int(M);
    rb.l.assign(size_t(M), 0.f);
    rb.acc.assign(size_t(M * D), 0.f);
    for (int64_t m = 0; m < M; ++m) {
      float mx = -std::numeric_limits<float>::infinity();
      bool poisoned = false;  // a split saw a NaN logit with nothing else visible (its m is NaN): NaN row
      for (int64_t s = 0; s < S; ++s) {
        const float ms = part_m[size_t((bh * S + s) * M + m)];
        poisoned |= ms != ms;
        mx = std::max(mx, ms);
      }
      if (poisoned) {
        rb.l[m] = std::numeric_limits<float>::quiet_NaN();
        continue;
      }
      if (mx == -std::numeric_limits<float>::infinity()) continue;  // no visible key: stays 0
      float* a = rb.acc.data() + m * D;
      for (int64_t s = 0; s < S; ++s) {
        const size_t idx = size_t((bh * S + s) * M + m);
        if (part_m[idx] == -std::numeric_limits<float>::infinity()) continue;
        const float w = std::exp2(part_m[idx] - mx);
        rb.l[m] += part_l[idx] * w;
        const float* pa = part_acc.data() + idx * D;
        for (int d = 0; d < D; ++d) a[d] += pa[d] * w;
      }
    }
    store_rows(p, rb);
  });
}

}  // namespace dot4attn
