#include "common/custom_op.h"

#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "common/errors.h"
#include "common/kernel_io.h"
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

namespace {

// True when the getter succeeded (its status released either way).
bool ok(OrtStatus* st) {
  if (!st) return true;
  ort().ReleaseStatus(st);
  return false;
}

enum class AttrKind { kNone, kInt, kFloat, kString, kInts, kFloats, kList };

// The type the node gives attribute `name`: each typed getter is tried (a getter fails for a missing attribute and
// for one of another type alike, and the C API has no other way to ask).
AttrKind attr_kind(const OrtKernelInfo* info, const char* name) {
  int64_t i = 0;
  float f = 0.f;
  size_t n = 0;
  if (ok(ort().KernelInfoGetAttribute_int64(info, name, &i))) return AttrKind::kInt;
  if (ok(ort().KernelInfoGetAttribute_float(info, name, &f))) return AttrKind::kFloat;
  if (ok(ort().KernelInfoGetAttribute_string(info, name, nullptr, &n))) return AttrKind::kString;
  // The array getters' size queries do not check the type (a list of floats reads as an empty list of ints):
  // the list is of the type whose size is not 0.
  size_t ni = 0, nf = 0;
  const bool ints = ok(ort().KernelInfoGetAttributeArray_int64(info, name, nullptr, &ni));
  const bool floats = ok(ort().KernelInfoGetAttributeArray_float(info, name, nullptr, &nf));
  if (ints && ni > 0) return AttrKind::kInts;
  if (floats && nf > 0) return AttrKind::kFloats;
  if (ints || floats) return AttrKind::kList;
  return AttrKind::kNone;
}

const char* kind_name(AttrKind k) {
  switch (k) {
    case AttrKind::kInt: return "an int";
    case AttrKind::kFloat: return "a float";
    case AttrKind::kString: return "a string";
    case AttrKind::kInts: return "a list of ints";
    case AttrKind::kFloats: return "a list of floats";
    case AttrKind::kList: return "a list";
    case AttrKind::kNone: break;
  }
  return "no value";
}

// The typed getter failed: a missing attribute gives the default, one of another type an error.
void refuse_other_type(const OrtKernelInfo* info, const char* op, const char* name, AttrKind want) {
  const AttrKind got = attr_kind(info, name);
  if (got != AttrKind::kNone)
    fail(op, "attribute '", name, "': expected ", kind_name(want), ", got ", kind_name(got), " attribute");
}

}  // namespace

bool has_attr(const OrtKernelInfo* info, const char* name) { return attr_kind(info, name) != AttrKind::kNone; }

namespace {
template <class Count, class Name>
std::vector<std::string> io_names(const OrtKernelInfo* info, Count count, Name name) {
  size_t n = 0;
  check_status((ort().*count)(info, &n));
  std::vector<std::string> names(n);
  for (size_t i = 0; i < n; ++i) {
    size_t size = 0;
    check_status((ort().*name)(info, i, nullptr, &size));
    std::string s(size, '\0');
    check_status((ort().*name)(info, i, s.data(), &size));
    s.resize(size ? size - 1 : 0);
    names[i] = s;
  }
  return names;
}
}  // namespace

std::vector<std::string> node_input_names(const OrtKernelInfo* info) {
  return io_names(info, &OrtApi::KernelInfo_GetInputCount, &OrtApi::KernelInfo_GetInputName);
}

std::vector<std::string> node_output_names(const OrtKernelInfo* info) {
  return io_names(info, &OrtApi::KernelInfo_GetOutputCount, &OrtApi::KernelInfo_GetOutputName);
}

std::string attr_string(const OrtKernelInfo* info, const char* op, const char* name, const std::string& dflt) {
  size_t size = 0;
  if (!ok(ort().KernelInfoGetAttribute_string(info, name, nullptr, &size))) {
    refuse_other_type(info, op, name, AttrKind::kString);
    return dflt;
  }
  std::string s(size, '\0');
  check_status(ort().KernelInfoGetAttribute_string(info, name, s.data(), &size));
  s.resize(size ? size - 1 : 0);
  return s;
}

int64_t attr_int(const OrtKernelInfo* info, const char* op, const char* name, int64_t dflt) {
  int64_t v = dflt;
  if (!ok(ort().KernelInfoGetAttribute_int64(info, name, &v))) {
    refuse_other_type(info, op, name, AttrKind::kInt);
    return dflt;
  }
  return v;
}

float attr_float(const OrtKernelInfo* info, const char* op, const char* name, float dflt) {
  float v = dflt;
  if (!ok(ort().KernelInfoGetAttribute_float(info, name, &v))) {
    refuse_other_type(info, op, name, AttrKind::kFloat);
    return dflt;
  }
  return v;
}

}  // namespace dot4attn
