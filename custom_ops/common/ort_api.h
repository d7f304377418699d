// The ONNX Runtime C API table this library talks to, negotiated once at registration.
//
// We compile against the 1.21 headers but must run inside whatever onnxruntime loads us (1.22 ROCm, 1.31 CPU,
// ...). Asking for a version the runtime does not have returns null, and using a newer table than the runtime's
// crashes; so RegisterCustomOps asks for the newest version both sides know, down to the oldest we can use.
#pragma once
#include <onnxruntime_c_api.h>

#include <cstdint>

namespace dot4attn {

// Oldest API we need: 1.17 brought KernelContext_ParallelFor and custom-op shape inference.
constexpr uint32_t kMinOrtApiVersion = 17;

// Negotiates and stores the API table. Returns false when the runtime is older than kMinOrtApiVersion.
bool init_ort_api(const OrtApiBase* base);
const OrtApi& ort();
uint32_t ort_api_version();

}  // namespace dot4attn
