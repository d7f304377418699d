// Dot4Attention decode route on the GPU (Sq <= 8), also split_k's stage 1 (a.part_acc set: partial outputs).
// Executes a launch plan (gpu/launch_plan.h) of one of three kernels: the tensor-core decode kernel
// (gpu/decode_mma.cuh: CUDA sm_80+, float16 T, D 64 / 128 / 256), the SIMT decode kernel (gpu/decode_kernel.cuh)
// or the tile kernel (gpu/attention_tile.cuh). Each (kernel, V format, D, row tile[, staging]) is one compiled
// instance in the kernel's own file (decode_instances.h); the planner only names instances that exist there.
#include "decode/decode_instances.h"

namespace dot4attn {
namespace gpu {

bool run_decode(const GpuPlan& pl, const TileArgs& a, gpuStream_t s) {
  switch (pl.kernel) {
    case KernelKind::kTile:
      run_decode_tile(pl, a, s);
      return true;
    case KernelKind::kDecodeSimt:
      run_decode_simt(pl, a, s);
      return true;
#if defined(D4A_CUDA)
    case KernelKind::kDecodeMma:
      return run_decode_mma(pl, a, s);
#endif
    default: no_instance(pl);
  }
}

}  // namespace gpu
}  // namespace dot4attn
