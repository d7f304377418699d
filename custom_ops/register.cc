// The library's one entry point: ONNX Runtime calls RegisterCustomOps when an OrtSessionOptions object loads
// libdot4attn_ops.so. Every op is registered on CPU, and on CUDA / ROCm when built with those kernels, so a
// single register_custom_ops_library serves every execution provider.
#include <onnxruntime_c_api.h>

#include <mutex>
#include <string>
#include <vector>

#include "attention/attention_op.h"
#include "cache/cache_op.h"
#include "common/custom_op.h"
#include "common/ort_api.h"
#include "cpu/isa.h"
#include "pack/pack_op.h"

using namespace dot4attn;

namespace {

constexpr const char* kDomain = "dot4attn";

std::vector<Ep> built_eps() {
  std::vector<Ep> eps{Ep::kCpu};
#if defined(DOT4ATTN_WITH_CUDA)
  eps.push_back(Ep::kCuda);
#endif
#if defined(DOT4ATTN_WITH_HIP)
  eps.push_back(Ep::kRocm);
#endif
  return eps;
}

// The OrtCustomOps, made once per process (ORT keeps pointers to them for the lifetime of every OrtSession).
const std::vector<OrtCustomOp*>& all_ops() {
  static std::vector<OrtCustomOp*> ops;
  static std::once_flag once;
  std::call_once(once, [] {
    std::vector<OpSpec> specs = pack_op_specs();
    for (auto& s : attention_op_specs()) specs.push_back(s);
    for (auto& s : cache_op_specs()) specs.push_back(s);
    for (Ep ep : built_eps())
      for (const auto& s : specs) ops.push_back(make_custom_op(s, ep, ort_api_version()));
  });
  return ops;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) OrtStatus* ORT_API_CALL
RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  if (!init_ort_api(api_base)) {
    // Version 1 of the table exists in every runtime; use it to say why we cannot load.
    const OrtApi* v1 = api_base->GetApi(1);
    const std::string msg = std::string("dot4attn: this onnxruntime (") + api_base->GetVersionString() +
                            ") is too old: the op library needs ORT API version >= " +
                            std::to_string(kMinOrtApiVersion) + " (onnxruntime 1.17+)";
    return v1 ? v1->CreateStatus(ORT_FAIL, msg.c_str()) : nullptr;
  }
  OrtCustomOpDomain* domain = nullptr;
  if (OrtStatus* st = ort().CreateCustomOpDomain(kDomain, &domain)) return st;
  for (OrtCustomOp* op : all_ops())
    if (OrtStatus* st = ort().CustomOpDomain_Add(domain, op)) return st;
  // The domain is deliberately never released: OrtSessions created from these options keep using it.
  return ort().AddCustomOpDomain(options, domain);
}

// Build facts for `dot4attn info` (read through ctypes): version, API version in use, CPU ISA, GPU backends.
extern "C" __attribute__((visibility("default"))) const char* dot4attn_build_info() {
  static std::string s;
  std::string isa;
  try {
    isa = cpu_isa_name(cpu_isa());
  } catch (const std::exception&) {  // a bad DOT4ATTN_CPU_ISA: reported by every run, not here (no throw across C)
    isa = "invalid DOT4ATTN_CPU_ISA";
  }
  s = std::string("version=") + DOT4ATTN_VERSION + ";cpu_isa=" + isa +
      ";cpu_isas=" + cpu_isas_supported() + ";gpu=" +
#if defined(DOT4ATTN_WITH_CUDA)
      "cuda"
#elif defined(DOT4ATTN_WITH_HIP)
      "hip"
#else
      "none"
#endif
      ;
  return s.c_str();
}
