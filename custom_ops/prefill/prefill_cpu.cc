// prefill route: tiled over query blocks (work items) and key tiles (inside attend). A query block holds Tq
// positions for all G heads of one KV head, so each K/V tile is loaded once for G * Tq rows. Key tiles
// entirely before the block's causal diagonal run without any causal check; only the tail is masked.
#include <algorithm>

#include "cpu/rows.h"
#include "common/kernel_io.h"

namespace dot4attn {

void prefill_cpu(const AttentionParams& p, OrtKernelContext* ctx) {
  const CpuKernels& kern = cpu_kernels();
  const AttendMask mask = mask_view(p);
  const int64_t G = p.group();
  const int64_t tq = std::max<int64_t>(4, 64 / G);  // ~64 rows per block keeps logits and acc in L1/L2
  const int64_t n_tiles = (p.Sq + tq - 1) / tq;
  const int64_t items = p.B * p.Hkv * n_tiles;
  parallel_for(ctx, size_t(items), [&](size_t item) {
    thread_local RowBlock rb;
    // Heaviest (last, longest causal range) query tiles first: better balance across threads.
    const int64_t t = n_tiles - 1 - int64_t(item) % n_tiles;
    const int64_t bh = int64_t(item) / n_tiles, b = bh / p.Hkv, hkv = bh % p.Hkv;
    const int64_t i0 = t * tq, i1 = std::min(p.Sq, i0 + tq);
    load_rows(p, b, hkv, i0, i1, rb);
    AttendState st = rb.state();
    kern.attend(rb.rows(p.D), kv_view(p, b, hkv), mask, 0, rb.key_end(p.Sk), st);
    store_rows(p, rb);
  });
}

}  // namespace dot4attn
