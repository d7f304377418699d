// Which (batch, KV head)s hold a NaN / Inf in their float16 V, found once before a long tensor-core prefill (behind the
// warp-specialized one: scan_v_after).
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
#include <stdexcept>
#include <string>
#include <type_traits>

#include "gpu/attention_tile.cuh"
#include "gpu/kv_rows.cuh"
#include "gpu/launch_plan.h"

namespace dot4attn {
namespace gpu {

// Whether this thread's pieces of the run at r0 (nk keys) of float16 V rows of D values hold a NaN / Inf.
template <int D>
__device__ __forceinline__ bool v_run_nonfinite(const TileArgs& a, int64_t r0, int nk) {
  const uint8_t* rows = static_cast<const uint8_t*>(a.v) + r0 * a.v_stride;
  uint32_t nf = 0;
  for_each_run_piece<D / 8>(nk, [&](int, int j, int c) {
    nf = v_nonfinite_acc<kVF16>(nf, *reinterpret_cast<const uint4*>(rows + j * a.v_stride + c * 16));
  });
  return v_nonfinite(nf);
}

// flags: B * Hkv ints, zeroed before; a thread that finds a NaN / Inf stores its head's flag (the same value: rare).
// BEHIND: the scan behind the warp-specialized prefill (GpuPlan::ws_late_scan), a programmatic dependent of it: its
// blocks take the SMs that the prefill's blocks leave as they end (the prefill runs every head, unflagged or not), and
// the checked companion, a programmatic dependent of this kernel, runs the flagged heads again over the prefill's rows.
// Block 0 waits for the prefill's end before it returns, so that this kernel ends after the prefill and the companion,
// which waits for this kernel's end, writes after the prefill's every store. Why behind: in the pass before the
// prefill V took ~40 % of its bytes at 8k keys; the prefill's last items leave SMs idle (~2 % of its SM time at (32,
// 8, 128) 8k, docs/performance.md).
template <int D, bool BEHIND>
__global__ void __launch_bounds__(kScanThreads) v_nonfinite_scan_kernel(const TileArgs a, int* flags) {
  if constexpr (BEHIND) pdl_launch_dependents();  // the companion may launch (it waits for this kernel's end)
  for_each_key_run(a, [&](int64_t bh, int64_t r0, int nk) {
    if (v_run_nonfinite<D>(a, r0, nk)) flags[bh] = 1;
  });
  if constexpr (BEHIND) {
    if (blockIdx.x == 0) pdl_wait();
  }
}

// The head sizes of the tensor-core prefill (the passes' rows are a compile-time number of 16-byte pieces).
template <typename F>
inline void with_head_dim(int64_t D, F&& f) {
  if (D == 64) return f(std::integral_constant<int, 64>{});
  if (D == 128) return f(std::integral_constant<int, 128>{});
  if (D == 256) return f(std::integral_constant<int, 256>{});
  throw std::runtime_error("Dot4Attention GPU: no K / V row pass for head size " + std::to_string(D) +
                           " (the tensor-core prefill's are 64, 128 and 256)");
}

// Enqueues the scan of a (tensor-core prefill, float16 V) call into flags (B * Hkv ints of device memory).
inline void scan_v_nonfinite(const TileArgs& a, int* flags, gpuStream_t s) {
  D4A_GPU_CHECK(gpuMemsetAsync(flags, 0, size_t(a.B * a.Hkv) * sizeof(int), s));
  with_head_dim(a.D, [&](auto d) {
    v_nonfinite_scan_kernel<decltype(d)::value, false><<<row_pass_blocks(a), kScanThreads, 0, s>>>(a, flags);
  });
  D4A_GPU_CHECK(gpuGetLastError());
}

#if defined(D4A_CUDA)
// Enqueues the scan behind the warp-specialized prefill (v_nonfinite_scan_kernel<D, true>), a programmatic dependent
// of it.
inline void scan_v_after(const TileArgs& a, int* flags, gpuStream_t s) {
  with_head_dim(a.D, [&](auto d) {
    launch_dependent(v_nonfinite_scan_kernel<decltype(d)::value, true>, row_pass_blocks(a), unsigned(kScanThreads),
                     size_t(0), s, a, flags);
  });
}
#endif

}  // namespace gpu
}  // namespace dot4attn
