// What a PackK/PackV launch needs, for every backend. Rows are contiguous: X is [rows, D].
#pragma once
#include <cstdint>

#include "common/formats.h"

namespace dot4attn {

struct PackParams {
  const void* x = nullptr;   // float32 or float16 [rows, D]
  bool x_is_f16 = false;
  int64_t rows = 0;
  int d = 0;
  QFormat format = QFormat::kQ8_0;
  void* payload = nullptr;   // int8 [rows, D] (q8_0) or uint8 [rows, D/2] (q4_0), [rows, 3D/4] (q6_0)
  uint16_t* scales = nullptr;  // float16 bits [rows, D/32]
};

// CPU: parallel over rows on ORT's thread pool (ctx may be null: serial).
void pack_cpu(const PackParams& p, struct OrtKernelContext* ctx);

#if defined(DOT4ATTN_WITH_GPU)
// CUDA / HIP: enqueues on `stream`, no host sync.
void pack_gpu(const PackParams& p, void* stream);
#endif

}  // namespace dot4attn
