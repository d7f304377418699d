// Reading inputs, allocating outputs and running parallel loops through the negotiated C API.
#pragma once
#include <onnxruntime_c_api.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace dot4attn {

struct TensorIn {
  bool present = false;  // false for an omitted optional input
  ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

size_t input_count(OrtKernelContext* ctx);
TensorIn get_input(OrtKernelContext* ctx, size_t index);
// Allocates output `index` and returns its data; `value` (optional) receives the OrtValue.
void* get_output(OrtKernelContext* ctx, size_t index, const std::vector<int64_t>& shape, OrtValue** value = nullptr);

// Runs fn(i) for i in [0, n) on ONNX Runtime's intra-op thread pool. Exceptions must not escape fn.
void parallel_for(OrtKernelContext* ctx, size_t n, const std::function<void(size_t)>& fn);

// The GPU stream of the kernel's EP (cudaStream_t / hipStream_t), or null on CPU.
void* gpu_stream(OrtKernelContext* ctx);

// Runs fn(scratch) with `bytes` of memory from ORT's allocator for the device of `like` (an output of the kernel),
// allocated on the kernel's stream, and frees it right after fn has enqueued its work: the GPU EPs' stream-aware
// arena gives it to another stream only once that stream has caught up. No cudaMalloc in Compute.
void with_device_scratch(OrtKernelContext* ctx, const OrtValue* like, size_t bytes,
                         const std::function<void(void*)>& fn);

// Throws when an ORT call returned an error status.
void check_status(OrtStatus* status);

}  // namespace dot4attn
