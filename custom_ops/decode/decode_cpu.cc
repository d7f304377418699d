// decode route (few query rows): one work item per (batch, KV head). All G grouped query heads and all Sq
// rows are one row block, so every K/V row is read once from memory for all of them.
#include "cpu/rows.h"
#include "common/kernel_io.h"

namespace dot4attn {

void decode_cpu(const AttentionParams& p, OrtKernelContext* ctx) {
  const CpuKernels& kern = cpu_kernels();
  const AttendMask mask = mask_view(p);
  parallel_for(ctx, size_t(p.B * p.Hkv), [&](size_t item) {
    thread_local RowBlock rb;
    const int64_t b = int64_t(item) / p.Hkv, hkv = int64_t(item) % p.Hkv;
    load_rows(p, b, hkv, 0, p.Sq, rb);
    AttendState st = rb.state();
    kern.attend(rb.rows(p.D), kv_view(p, b, hkv), mask, 0, rb.key_end(p.Sk), st);
    store_rows(p, rb);
  });
}

}  // namespace dot4attn
