// A thin OrtCustomOp adaptor: one instance per (op name, execution provider, type variant).
//
// ONNX Runtime merges all OrtCustomOps that share a name into one schema and picks the kernel by EP and input
// types, so the same kernel class serves CPU, CUDA and ROCm. We fill the struct by hand (not Ort::CustomOpBase)
// to set `version` to the *negotiated* API version: the runtime only reads the fields that version has.
#pragma once
#include <onnxruntime_c_api.h>

#include <string>
#include <vector>

#include "common/formats.h"

namespace dot4attn {

// Execution providers we register kernels for.
enum class Ep { kCpu, kCuda, kRocm };
const char* ep_name(Ep ep);  // ORT's EP type string ("CPUExecutionProvider", ...)

class Kernel {
 public:
  virtual ~Kernel() = default;
  virtual void compute(OrtKernelContext* ctx) = 0;  // throws OpError (-> ORT_INVALID_ARGUMENT) on bad input
};

struct IoSpec {
  ONNXTensorElementDataType type;  // ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED: any type, checked in compute
  bool optional = false;
  bool host = false;  // read on the host: on a GPU EP, ORT hands the kernel a CPU copy (OrtMemTypeCPUInput)
};

struct OpSpec {
  const char* name;
  std::vector<IoSpec> inputs;
  std::vector<IoSpec> outputs;
  // Creates the kernel; reads and validates attributes (throws OpError).
  Kernel* (*create)(const OrtKernelInfo* info, Ep ep) = nullptr;
  // Optional output shape inference (only for ops without optional inputs: ORT 1.17-1.22 dereference them).
  void (*infer_shapes)(OrtShapeInferContext* ctx) = nullptr;
};

// Builds the OrtCustomOp for one spec on one EP. It lives for the whole process: OrtSessions made from the
// registering SessionOptions may outlive any scope we could tie it to.
OrtCustomOp* make_custom_op(const OpSpec& spec, Ep ep, uint32_t api_version);

// Reads a string/int/float attribute, or returns the default when the node does not have it. An attribute the
// node has with another type is an error naming `op` (OpError): ONNX Runtime's typed getters fail alike for a
// missing and for a wrongly typed attribute, so `local_window_size=128.0` would otherwise read as the default.
std::string attr_string(const OrtKernelInfo* info, const char* op, const char* name, const std::string& dflt);
int64_t attr_int(const OrtKernelInfo* info, const char* op, const char* name, int64_t dflt);
float attr_float(const OrtKernelInfo* info, const char* op, const char* name, float dflt);
// Whether the node has the attribute, of any type these readers or the array getters know.
bool has_attr(const OrtKernelInfo* info, const char* name);

// The names of the node's inputs / outputs at kernel creation (OrtApi 14+): an omitted optional one in the middle is
// "", trailing omitted ones are not listed.
std::vector<std::string> node_input_names(const OrtKernelInfo* info);
std::vector<std::string> node_output_names(const OrtKernelInfo* info);

}  // namespace dot4attn
