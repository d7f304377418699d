// The tile kernels compiled for scalar (compile flags set per file in CMakeLists.txt). Everything from
// tile_kernels.inl lands in its own namespace, so this copy cannot be confused with another ISA's.
#include "cpu/isa_includes.h"

namespace dot4attn {
namespace isa_scalar {
#include "cpu/tile_kernels.inl"
}  // namespace isa_scalar

const CpuKernels& cpu_kernels_scalar() {
  static const CpuKernels k{"scalar", isa_scalar::attend, isa_scalar::halves_to_floats, isa_scalar::floats_to_halves};
  return k;
}
}  // namespace dot4attn
