// The decode route's compiled instances, one translation unit per kernel family so that a build compiles them in
// parallel (each holds dozens to hundreds of kernel instances): decode_tile_gpu.cu (the tile kernel),
// decode_simt_gpu.cu (the SIMT decode kernel), decode_mma_gpu.cu (the tensor-core decode kernel, CUDA only).
// decode_gpu.cu dispatches a plan to them. Each runs the plan's instance or throws (no_instance).
#pragma once

#include "gpu/attention_gpu_internal.h"

namespace dot4attn {
namespace gpu {

void run_decode_tile(const GpuPlan& pl, const TileArgs& a, gpuStream_t s);
void run_decode_simt(const GpuPlan& pl, const TileArgs& a, gpuStream_t s);
#if defined(D4A_CUDA)
// False when the device refused a cluster launch.
bool run_decode_mma(const GpuPlan& pl, const TileArgs& a, gpuStream_t s);
#endif

// Whether K / V are dense tensors (Sk rows per head, rows the dense widths): such launches run the kernels' dense
// instances (SR false), which are today's dense code; the rest the strided ones.
template <int VK, int D>
inline bool dense_rows(const TileArgs& a) {
  constexpr int NB = D / 32;
  return a.seqlens == nullptr && a.kv_rows == a.Sk && a.k_stride == D && a.v_stride == v_row_bytes(VK, D) && a.ks_stride == NB &&
         (!v_quantized(VK) || a.vs_stride == NB);
}

}  // namespace gpu
}  // namespace dot4attn
