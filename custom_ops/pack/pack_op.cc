// PackK / PackV: the op structs (validation, output allocation, dispatch to the CPU or GPU launcher).
#include "pack/pack_op.h"

#include <atomic>
#include <string>

#include "common/errors.h"
#include "common/kernel_io.h"
#include "common/ort_api.h"
#include "pack/pack_params.h"

namespace dot4attn {
namespace {

VFormat vformat_of(QFormat f) {
  return f == QFormat::kQ4_0 ? VFormat::kQ4_0 : f == QFormat::kQ6_0 ? VFormat::kQ6_0 : VFormat::kQ8_0;
}

class PackKernel : public Kernel {
 public:
  PackKernel(const char* op, QFormat format, Ep ep) : op_(op), format_(format), ep_(ep) {}

  void compute(OrtKernelContext* ctx) override {
    const TensorIn x = get_input(ctx, 0);
    if (x.type != F32 && x.type != F16)
      fail(op_, "input 'X' (0): expected dtype float32 or float16, got ", dtype_name(x.type));
    if (x.shape.size() != 4)
      fail(op_, "input 'X' (0): expected rank 4 [B, H, S, D], got shape ", shape_str(x.shape));
    const int64_t d = x.shape[3];
    if (!head_dim_ok(d))
      fail(op_, "input 'X' (0): head dim D must be a multiple of 32 in [32, 256], got ", d, " (shape ",
           shape_str(x.shape), ")");
    std::vector<int64_t> payload_shape = x.shape, scales_shape = x.shape;
    payload_shape[3] = payload_bytes(d, vformat_of(format_));
    scales_shape[3] = d / kBlock;
    PackParams p;
    p.x = x.data;
    p.x_is_f16 = x.type == F16;
    p.rows = x.numel() / d;
    p.d = int(d);
    p.format = format_;
    p.payload = get_output(ctx, 0, payload_shape);
    p.scales = static_cast<uint16_t*>(get_output(ctx, 1, scales_shape));
    if (p.rows == 0) return;
    if (ep_ == Ep::kCpu) {
      pack_cpu(p, ctx);
    } else {
#if defined(DOT4ATTN_WITH_GPU)
      pack_gpu(p, gpu_stream(ctx));
#else
      fail(op_, "this build of dot4attn has no GPU kernels");
#endif
    }
  }

 private:
  const char* op_;
  QFormat format_;
  Ep ep_;
};

Kernel* create_pack_k(const OrtKernelInfo*, Ep ep) { return new PackKernel("PackK", QFormat::kQ8_0, ep); }

Kernel* create_pack_v(const OrtKernelInfo* info, Ep ep) {
  const std::string f = attr_string(info, "PackV", "format", "q8_0");
  QFormat format;
  if (f == "q8_0") {
    format = QFormat::kQ8_0;
  } else if (f == "q4_0") {
    format = QFormat::kQ4_0;
  } else if (f == "q6_0") {
    format = QFormat::kQ6_0;
  } else {
    fail("PackV", "attribute 'format': expected 'q8_0', 'q4_0' or 'q6_0', got '", f, "'");
  }
  return new PackKernel("PackV", format, ep);
}

// Output shapes: payload [B, H, S, D] (D/2 for q4_0, 3D/4 for q6_0), scales [B, H, S, D/32].
void infer_pack(OrtShapeInferContext* ctx, bool is_v) {
  OrtTensorTypeAndShapeInfo* in = nullptr;
  check_status(ort().ShapeInferContext_GetInputTypeShape(ctx, 0, &in));
  size_t rank = 0;
  check_status(ort().GetDimensionsCount(in, &rank));
  if (rank != 4) return;  // the kernel reports the error with the real shape
  std::vector<int64_t> dims(rank);
  std::vector<const char*> sym(rank);
  check_status(ort().GetDimensions(in, dims.data(), rank));
  check_status(ort().GetSymbolicDimensions(in, sym.data(), rank));
  std::string fmt = "q8_0";
  if (is_v) {
    const OrtOpAttr* attr = nullptr;
    if (OrtStatus* st = ort().ShapeInferContext_GetAttribute(ctx, "format", &attr)) {
      ort().ReleaseStatus(st);
    } else {
      char buf[16] = {0};
      size_t len = 0;
      if (OrtStatus* st2 = ort().ReadOpAttr(attr, ORT_OP_ATTR_STRING, buf, sizeof(buf) - 1, &len)) {
        ort().ReleaseStatus(st2);
      }
      fmt = buf;
    }
  }
  // The element type must be set even when D is symbolic: PackV's payload is declared as any type, and
  // nothing downstream (Dot4Attention takes any type for `value`) would pin it to uint8 otherwise.
  // An unknown input dim (no value, no name) reads as -1 with an empty name here, and writing that back would
  // declare the value -1. Give each such dim a fresh name instead, so it stays unknown (and unequal to others).
  static std::atomic<uint64_t> counter{0};
  std::string fresh[4];
  for (size_t i = 0; i < rank; ++i) {
    if (dims[i] < 0 && !(sym[i] && *sym[i])) {
      fresh[i] = "dot4attn_unk_" + std::to_string(counter++);
      sym[i] = fresh[i].c_str();
    }
  }
  const std::string d_name = sym[3] && *sym[3] ? std::string(sym[3]) : std::string("D");
  std::string derived[2];
  for (int out = 0; out < 2; ++out) {
    std::vector<int64_t> od = dims;
    std::vector<const char*> os = sym;
    // The last dim is D * mul / div: scales D/32, payload D (q8_0), D/2 (q4_0) or 3D/4 (q6_0).
    const int64_t mul = out == 0 && fmt == "q6_0" ? 3 : 1;
    const int64_t div = out == 1 ? kBlock : fmt == "q4_0" ? 2 : fmt == "q6_0" ? 4 : 1;
    if (div != 1) {
      if (dims[3] > 0) {
        os[3] = "";
        od[3] = dims[3] * mul / div;
      } else {  // symbolic head dim: name the derived dim after it (e.g. "D/32", "D*3/4")
        derived[out] = d_name + (mul != 1 ? "*" + std::to_string(mul) : "") + "/" + std::to_string(div);
        os[3] = derived[out].c_str();
        od[3] = -1;
      }
    }
    OrtTensorTypeAndShapeInfo* info = nullptr;
    check_status(ort().CreateTensorTypeAndShapeInfo(&info));
    check_status(ort().SetTensorElementType(info, out == 0 ? (fmt == "q4_0" || fmt == "q6_0" ? U8 : I8) : F16));
    check_status(ort().SetDimensions(info, od.data(), od.size()));
    check_status(ort().SetSymbolicDimensions(info, os.data(), os.size()));
    OrtStatus* st = ort().ShapeInferContext_SetOutputTypeShape(ctx, out, info);
    ort().ReleaseTensorTypeAndShapeInfo(info);
    check_status(st);
  }
}

}  // namespace

std::vector<OpSpec> pack_op_specs() {
  std::vector<OpSpec> specs;
  for (auto t : {F32, F16}) {
    specs.push_back({"PackK", {{t}}, {{I8}, {F16}}, create_pack_k,
                     [](OrtShapeInferContext* c) { infer_pack(c, false); }});
    // PackV's payload dtype follows the `format` attribute (int8 for q8_0, uint8 for q4_0 / q6_0), so it is declared
    // as any type; optional keeps ORT from tying it to the input's type.
    specs.push_back({"PackV", {{t}}, {{ANY, true}, {F16}}, create_pack_v,
                     [](OrtShapeInferContext* c) { infer_pack(c, true); }});
  }
  return specs;
}

}  // namespace dot4attn
