#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <atomic>
#include <mutex>
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

namespace {

CpuIsa best_supported() {
  if (supported(CpuIsa::kAvx512Vnni)) return CpuIsa::kAvx512Vnni;
  if (supported(CpuIsa::kAvx2)) return CpuIsa::kAvx2;
  return CpuIsa::kScalar;
}

// The ISA for `name` ("auto", "" or null: the best this CPU supports); false with `error` set when it is unknown or
// this CPU lacks it. `label` names where the name came from.
bool resolve(const char* name, const char* label, CpuIsa* isa, std::string* error) {
  if (!name || !*name || std::strcmp(name, "auto") == 0) return *isa = best_supported(), true;
  for (CpuIsa c : {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512Vnni}) {
    if (std::strcmp(name, cpu_isa_name(c)) != 0) continue;
    if (supported(c)) return *isa = c, true;
    *error = std::string("Dot4Attention: ") + label + "=" + name + " is not supported by this CPU (supported: " +
             cpu_isas_supported() + ")";
    return false;
  }
  *error = std::string("Dot4Attention: ") + label + ": expected scalar, avx2, avx512vnni or auto, got '" + name + "'";
  return false;
}

// The process's choice: DOT4ATTN_CPU_ISA, read once when the library first needs it (a bad value is reported by
// every call that would use it), until dot4attn_force_cpu_isa changes it. Read on every work item: an atomic.
struct IsaChoice {
  static constexpr int kBad = -1;
  std::atomic<int> isa{kBad};
  std::mutex mu;  // guards error, written before isa is set to kBad
  std::string error;
  IsaChoice() {
    CpuIsa c = CpuIsa::kScalar;
    if (resolve(std::getenv("DOT4ATTN_CPU_ISA"), "DOT4ATTN_CPU_ISA", &c, &error)) isa = int(c);
  }
};

IsaChoice& choice() {
  static IsaChoice c;
  return c;
}

}  // namespace

CpuIsa cpu_isa() {
  IsaChoice& c = choice();
  const int isa = c.isa.load(std::memory_order_acquire);
  if (isa != IsaChoice::kBad) return CpuIsa(isa);
  std::lock_guard<std::mutex> lock(c.mu);
  throw OpError(c.error);
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

// Forces the CPU ISA of this process for tests and comparisons ("auto" or null: the best this CPU supports, also
// clearing a bad DOT4ATTN_CPU_ISA). Returns 0, or 1 with the reason in err (up to err_len bytes).
extern "C" __attribute__((visibility("default"))) int dot4attn_force_cpu_isa(const char* name, char* err,
                                                                          size_t err_len) {
  using namespace dot4attn;
  CpuIsa isa = CpuIsa::kScalar;
  std::string error;
  if (!resolve(name, "dot4attn_force_cpu_isa", &isa, &error)) {
    if (err && err_len) {
      const size_t n = std::min(error.size(), err_len - 1);
      std::memcpy(err, error.data(), n);
      err[n] = 0;
    }
    return 1;
  }
  choice().isa.store(int(isa), std::memory_order_release);
  return 0;
}
