// The tile kernels compiled for avx2 (compile flags set per file in CMakeLists.txt). Everything from
// tile_kernels.inl lands in its own namespace, so this copy cannot be confused with another ISA's.
#include "cpu/isa_includes.h"

namespace dot4attn {
namespace isa_avx2 {
#include "cpu/tile_kernels.inl"
}  // namespace isa_avx2

const CpuKernels& cpu_kernels_avx2() {
  static const CpuKernels k{"avx2", isa_avx2::attend, isa_avx2::halves_to_floats, isa_avx2::floats_to_halves};
  return k;
}
}  // namespace dot4attn
