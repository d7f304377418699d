// The tile kernels compiled for avx512vnni (compile flags set per file in CMakeLists.txt). Everything from
// tile_kernels.inl lands in its own namespace, so this copy cannot be confused with another ISA's.
#include "cpu/isa_includes.h"

namespace dot4attn {
namespace isa_avx512vnni {
#include "cpu/tile_kernels.inl"
}  // namespace isa_avx512vnni

const CpuKernels& cpu_kernels_avx512vnni() {
  static const CpuKernels k{"avx512vnni", isa_avx512vnni::attend, isa_avx512vnni::halves_to_floats, isa_avx512vnni::floats_to_halves};
  return k;
}
}  // namespace dot4attn
