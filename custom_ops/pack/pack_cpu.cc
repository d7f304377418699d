#include <algorithm>

#include "common/kernel_io.h"
#include "pack/pack_params.h"
#include "common/quantize.h"

namespace dot4attn {
namespace {

// Block b of row r into the payload ([rows, payload_bytes(D)]); returns its float16 scale.
uint16_t pack_block(QFormat f, const float* x, void* payload, int64_t r, int b, int d) {
  switch (f) {
    case QFormat::kQ8_0:
      return quantize_q8_block(x, static_cast<int8_t*>(payload) + r * d + b * kBlock);
    case QFormat::kQ4_0:
      return quantize_q4_block(x, static_cast<uint8_t*>(payload) + r * (d / 2) + b * (kBlock / 2));
    case QFormat::kQ6_0:
      return quantize_q6_block(x, static_cast<uint8_t*>(payload) + r * (3 * d / 4) + b * kQ6BlockBytes);
  }
  return 0;
}

}  // namespace

void pack_cpu(const PackParams& p, OrtKernelContext* ctx) {
  const int nb = p.d / kBlock;
  const int64_t rows_per_task = std::max<int64_t>(1, 16384 / p.d);
  const int64_t tasks = (p.rows + rows_per_task - 1) / rows_per_task;
  auto body = [&](size_t t) {
    float row[kMaxHeadDim];
    const int64_t r0 = int64_t(t) * rows_per_task, r1 = std::min(p.rows, r0 + rows_per_task);
    for (int64_t r = r0; r < r1; ++r) {
      if (p.x_is_f16) {
        const uint16_t* x = static_cast<const uint16_t*>(p.x) + r * p.d;
        for (int i = 0; i < p.d; ++i) row[i] = half_to_float(x[i]);
      } else {
        std::copy_n(static_cast<const float*>(p.x) + r * p.d, p.d, row);
      }
      uint16_t* s = p.scales + r * nb;
      for (int b = 0; b < nb; ++b) s[b] = pack_block(p.format, row + b * kBlock, p.payload, r, b, p.d);
    }
  };
  if (ctx) {
    parallel_for(ctx, size_t(tasks), body);
  } else {
    for (int64_t t = 0; t < tasks; ++t) body(size_t(t));
  }
}

}  // namespace dot4attn
