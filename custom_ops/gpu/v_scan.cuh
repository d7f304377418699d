// Which (batch, KV head)s hold a NaN / Inf in their float16 V, found once before a long tensor-core prefill.
//
// The tensor-core prefill reads every V tile of a (batch, KV head) once per block of its query rows (hundreds of
// times at 8k keys). Checking each tile for a V-poisoned key there (vendor.h, "The V side") costs the wgmma path a
// shared-memory pass over the whole float16 tile per tile, 8-13 % of the kernel at 2k-32k keys, because its P.V
// reads V straight from shared memory and never holds it in registers. This kernel reads V once instead (one HFMA2
// per word, as the in-kernel check) and sets flags[b * Hkv + h] for each head that holds such a value; the prefill
// then checks only the tiles of flagged heads, exactly as before. The planner takes it where the prefill reads V
// often enough to pay for the extra launch (launch_plan.cu, v_scan).
#pragma once

#include <cstdint>

#include "gpu/attention_tile.cuh"
#include "gpu/launch_plan.h"

namespace dot4attn {
namespace gpu {

constexpr int kScanThreads = 256;

// Block x covers keys [kVScanKeys * (x % nblk), ...) of (b, kv head) x / nblk. flags: B * Hkv ints, zeroed before.
// Only keys < Sk are read (a strided cache's rows past them are not the prefill's).
__global__ void __launch_bounds__(kScanThreads) v_nonfinite_scan_kernel(const TileArgs a, int64_t nblk, int* flags) {
  const int64_t bid = int64_t(blockIdx.x);
  const int64_t bh = bid / nblk;
  const int64_t j0 = (bid % nblk) * kVScanKeys;
  const int64_t nk = a.Sk - j0 < kVScanKeys ? a.Sk - j0 : kVScanKeys;
  const int pieces = a.D * 2 / 16;  // 16-byte pieces of a float16 row
  const uint8_t* rows = static_cast<const uint8_t*>(a.v) + (bh * a.kv_rows + j0) * a.v_stride;
  uint32_t nf = 0;
#pragma unroll 4
  for (int u = threadIdx.x; u < int(nk) * pieces; u += kScanThreads) {
    const int j = u / pieces, c = u - j * pieces;
    nf = v_nonfinite_acc<kVF16>(nf, *reinterpret_cast<const uint4*>(rows + j * a.v_stride + c * 16));
  }
  if (__syncthreads_or(v_nonfinite(nf)) && threadIdx.x == 0) flags[bh] = 1;
}

// Enqueues the scan of a (tensor-core prefill, float16 V) call into flags (B * Hkv ints of device memory).
inline void scan_v_nonfinite(const TileArgs& a, int* flags, gpuStream_t s) {
  D4A_GPU_CHECK(gpuMemsetAsync(flags, 0, size_t(a.B * a.Hkv) * sizeof(int), s));
  const int64_t nblk = (a.Sk + kVScanKeys - 1) / kVScanKeys;
  v_nonfinite_scan_kernel<<<unsigned(a.B * a.Hkv * nblk), kScanThreads, 0, s>>>(a, nblk, flags);
  D4A_GPU_CHECK(gpuGetLastError());
}

}  // namespace gpu
}  // namespace dot4attn
