#include "common/custom_op.h"

#include <exception>
#include <memory>
#include <vector>

#include "common/errors.h"
#include "common/ort_api.h"

namespace dot4attn {

const char* ep_name(Ep ep) {
  switch (ep) {
    case Ep::kCpu: return "CPUExecutionProvider";
    case Ep::kCuda: return "CUDAExecutionProvider";
    case Ep::kRocm: return "ROCMExecutionProvider";
  }
  return "CPUExecutionProvider";
}

namespace {

// The OrtCustomOp must be the first member so ORT's `const OrtCustomOp*` casts back to the adaptor.
struct Adaptor {
  OrtCustomOp op;
  OpSpec spec;
  Ep ep;
};
static_assert(std::is_standard_layout<OrtCustomOp>::value, "OrtCustomOp is a C struct");

const Adaptor& self(const OrtCustomOp* op) { return *reinterpret_cast<const Adaptor*>(op); }

OrtStatusPtr to_status(const std::exception& e, OrtErrorCode code) {
  return ort().CreateStatus(code, e.what());
}

OrtStatusPtr ORT_API_CALL create_kernel(const OrtCustomOp* op, const OrtApi*, const OrtKernelInfo* info,
                                        void** kernel) {
  try {
    *kernel = self(op).spec.create(info, self(op).ep);
    return nullptr;
  } catch (const OpError& e) {
    return to_status(e, ORT_INVALID_ARGUMENT);
  } catch (const std::exception& e) {
    return to_status(e, ORT_FAIL);
  }
}

OrtStatusPtr ORT_API_CALL compute(void* kernel, OrtKernelContext* ctx) {
  try {
    static_cast<Kernel*>(kernel)->compute(ctx);
    return nullptr;
  } catch (const OpError& e) {
    return to_status(e, ORT_INVALID_ARGUMENT);
  } catch (const std::exception& e) {
    return to_status(e, ORT_FAIL);
  }
}

void ORT_API_CALL destroy(void* kernel) { delete static_cast<Kernel*>(kernel); }

OrtStatusPtr ORT_API_CALL infer(const OrtCustomOp* op, OrtShapeInferContext* ctx) {
  try {
    self(op).spec.infer_shapes(ctx);
    return nullptr;
  } catch (const std::exception& e) {
    return to_status(e, ORT_INVALID_ARGUMENT);
  }
}

}  // namespace

OrtCustomOp* make_custom_op(const OpSpec& spec, Ep ep, uint32_t api_version) {
  static std::vector<std::unique_ptr<Adaptor>> all;  // never freed before exit (see header)
  all.push_back(std::make_unique<Adaptor>());
  Adaptor* a = all.back().get();
  a->spec = spec;
  a->ep = ep;
  OrtCustomOp& op = a->op;
  op.version = api_version;
  op.GetName = [](const OrtCustomOp* o) { return self(o).spec.name; };
  op.GetExecutionProviderType = [](const OrtCustomOp* o) { return ep_name(self(o).ep); };
  op.GetInputTypeCount = [](const OrtCustomOp* o) { return self(o).spec.inputs.size(); };
  op.GetInputType = [](const OrtCustomOp* o, size_t i) { return self(o).spec.inputs[i].type; };
  op.GetOutputTypeCount = [](const OrtCustomOp* o) { return self(o).spec.outputs.size(); };
  op.GetOutputType = [](const OrtCustomOp* o, size_t i) { return self(o).spec.outputs[i].type; };
  op.GetInputCharacteristic = [](const OrtCustomOp* o, size_t i) {
    return self(o).spec.inputs[i].optional ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
  };
  op.GetOutputCharacteristic = [](const OrtCustomOp* o, size_t i) {
    return self(o).spec.outputs[i].optional ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
  };
  op.GetInputMemoryType = [](const OrtCustomOp* o, size_t i) {
    return self(o).ep != Ep::kCpu && self(o).spec.inputs[i].host ? OrtMemTypeCPUInput : OrtMemTypeDefault;
  };
  op.GetVariadicInputMinArity = [](const OrtCustomOp*) { return 1; };
  op.GetVariadicInputHomogeneity = [](const OrtCustomOp*) { return 1; };
  op.GetVariadicOutputMinArity = [](const OrtCustomOp*) { return 1; };
  op.GetVariadicOutputHomogeneity = [](const OrtCustomOp*) { return 1; };
  op.CreateKernelV2 = create_kernel;
  op.KernelComputeV2 = compute;
  op.KernelDestroy = destroy;
  op.InferOutputShapeFn = spec.infer_shapes ? infer : nullptr;
  op.GetStartVersion = [](const OrtCustomOp*) { return 1; };
  op.GetEndVersion = [](const OrtCustomOp*) { return 2147483647; };
  return &a->op;
}

std::string attr_string(const OrtKernelInfo* info, const char* name, const std::string& dflt) {
  size_t size = 0;
  if (OrtStatus* st = ort().KernelInfoGetAttribute_string(info, name, nullptr, &size)) {
    ort().ReleaseStatus(st);
    return dflt;
  }
  std::string s(size, '\0');
  if (OrtStatus* st = ort().KernelInfoGetAttribute_string(info, name, s.data(), &size)) {
    ort().ReleaseStatus(st);
    return dflt;
  }
  s.resize(size ? size - 1 : 0);
  return s;
}

int64_t attr_int(const OrtKernelInfo* info, const char* name, int64_t dflt) {
  int64_t v = dflt;
  if (OrtStatus* st = ort().KernelInfoGetAttribute_int64(info, name, &v)) {
    ort().ReleaseStatus(st);
    return dflt;
  }
  return v;
}

float attr_float(const OrtKernelInfo* info, const char* name, float dflt) {
  float v = dflt;
  if (OrtStatus* st = ort().KernelInfoGetAttribute_float(info, name, &v)) {
    ort().ReleaseStatus(st);
    return dflt;
  }
  return v;
}

}  // namespace dot4attn
