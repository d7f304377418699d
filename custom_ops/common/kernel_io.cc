#include "common/kernel_io.h"

#include <string>

#include "common/errors.h"
#include "common/ort_api.h"

namespace dot4attn {

void check_status(OrtStatus* status) {
  if (!status) return;
  std::string msg = ort().GetErrorMessage(status);
  ort().ReleaseStatus(status);
  throw std::runtime_error(msg);
}

size_t input_count(OrtKernelContext* ctx) {
  size_t n = 0;
  check_status(ort().KernelContext_GetInputCount(ctx, &n));
  return n;
}

TensorIn get_input(OrtKernelContext* ctx, size_t index) {
  TensorIn t;
  if (index >= input_count(ctx)) return t;
  const OrtValue* v = nullptr;
  check_status(ort().KernelContext_GetInput(ctx, index, &v));
  if (!v) return t;  // omitted optional input ("" in the node)
  OrtTensorTypeAndShapeInfo* info = nullptr;
  check_status(ort().GetTensorTypeAndShape(v, &info));
  size_t rank = 0;
  check_status(ort().GetTensorElementType(info, &t.type));
  check_status(ort().GetDimensionsCount(info, &rank));
  t.shape.resize(rank);
  check_status(ort().GetDimensions(info, t.shape.data(), rank));
  ort().ReleaseTensorTypeAndShapeInfo(info);
  void* data = nullptr;
  check_status(ort().GetTensorMutableData(const_cast<OrtValue*>(v), &data));
  t.data = data;
  t.present = true;
  return t;
}

void* get_output(OrtKernelContext* ctx, size_t index, const std::vector<int64_t>& shape, OrtValue** value) {
  OrtValue* v = nullptr;
  check_status(ort().KernelContext_GetOutput(ctx, index, shape.data(), shape.size(), &v));
  if (value) *value = v;
  void* data = nullptr;
  check_status(ort().GetTensorMutableData(v, &data));
  return data;
}

namespace {
void trampoline(void* user, size_t i) { (*static_cast<const std::function<void(size_t)>*>(user))(i); }
}  // namespace

void parallel_for(OrtKernelContext* ctx, size_t n, const std::function<void(size_t)>& fn) {
  if (n == 0) return;
  if (n == 1) {
    fn(0);
    return;
  }
  // num_batch = n: every index may go to its own task; ORT's pool then balances them dynamically.
  check_status(ort().KernelContext_ParallelFor(ctx, trampoline, n, n,
                                               const_cast<std::function<void(size_t)>*>(&fn)));
}

void* gpu_stream(OrtKernelContext* ctx) {
  void* s = nullptr;
  check_status(ort().KernelContext_GetGPUComputeStream(ctx, &s));
  return s;
}

void with_device_scratch(OrtKernelContext* ctx, const OrtValue* like, size_t bytes,
                         const std::function<void(void*)>& fn) {
  if (bytes == 0) {
    fn(nullptr);
    return;
  }
  const OrtMemoryInfo* mem = nullptr;
  check_status(ort().GetTensorMemoryInfo(like, &mem));
  OrtAllocator* alloc = nullptr;
  check_status(ort().KernelContext_GetAllocator(ctx, mem, &alloc));
  // GetScratchBuffer allocates on the kernel's stream: the GPU EPs' stream-aware arena then hands the memory freed
  // below to no other stream until that stream has caught up. A plain alloc->Alloc is not tied to a stream, and
  // concurrent runs (their own streams) could reuse it while this run's kernels still read it (seen as wrong
  // split_k merges under compute-sanitizer's slowed kernels).
  void* scratch = nullptr;
  if (OrtStatus* st = ort().KernelContext_GetScratchBuffer(ctx, mem, bytes, &scratch)) {
    ort().ReleaseAllocator(alloc);
    check_status(st);
  }
  try {
    fn(scratch);
  } catch (...) {
    alloc->Free(alloc, scratch);
    ort().ReleaseAllocator(alloc);
    throw;
  }
  alloc->Free(alloc, scratch);
  ort().ReleaseAllocator(alloc);
}

}  // namespace dot4attn
