#include <cstdlib>
#include <cstring>
#include <string>

#include "common/errors.h"
#include "cpu/isa.h"

namespace dot4attn {
namespace {

bool supported(CpuIsa isa) {
#if defined(DOT4ATTN_X86)
  switch (isa) {
    case CpuIsa::kScalar: return true;
    case CpuIsa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    case CpuIsa::kAvx512Vnni:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
  }
  return false;
#else
  return isa == CpuIsa::kScalar;
#endif
}

}  // namespace

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar: return "scalar";
    case CpuIsa::kAvx2: return "avx2";
    case CpuIsa::kAvx512Vnni: return "avx512vnni";
  }
  return "?";
}

std::string cpu_isas_supported() {
  std::string s;
  for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512Vnni})
    if (supported(isa)) s += std::string(s.empty() ? "" : ",") + cpu_isa_name(isa);
  return s;
}

// Read on every call (cheap) so tests can switch ISA between sessions in one process.
CpuIsa cpu_isa() {
  const char* env = std::getenv("DOT4ATTN_CPU_ISA");
  if (env && *env && std::strcmp(env, "auto") != 0) {
    for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512Vnni}) {
      if (std::strcmp(env, cpu_isa_name(isa)) == 0) {
        if (!supported(isa))
          fail("Dot4Attention", "DOT4ATTN_CPU_ISA=", env, " is not supported by this CPU (supported: ",
               cpu_isas_supported(), ")");
        return isa;
      }
    }
    fail("Dot4Attention", "DOT4ATTN_CPU_ISA: expected scalar, avx2, avx512vnni or auto, got '", env, "'");
  }
  if (supported(CpuIsa::kAvx512Vnni)) return CpuIsa::kAvx512Vnni;
  if (supported(CpuIsa::kAvx2)) return CpuIsa::kAvx2;
  return CpuIsa::kScalar;
}

const CpuKernels& cpu_kernels() {
  switch (cpu_isa()) {
#if defined(DOT4ATTN_X86)
    case CpuIsa::kAvx512Vnni: return cpu_kernels_avx512vnni();
    case CpuIsa::kAvx2: return cpu_kernels_avx2();
#endif
    default: return cpu_kernels_scalar();
  }
}

}  // namespace dot4attn
