// Dot4Attention: the op struct. Reads attributes, validates every input against the contract
// (docs/ops.md), resolves the route and hands AttentionParams to the CPU or GPU backend.
#include "attention/attention_op.h"

#include <cmath>
#include <cstring>
#include <string>

#include "attention/attention_backends.h"
#include "common/attention_params.h"
#include "common/errors.h"
#include "common/kernel_io.h"
#include "common/ort_api.h"

namespace dot4attn {
namespace {

constexpr const char* kOp = "Dot4Attention";

const char* const kInputNames[] = {"query", "k_payload", "k_scales", "value", "v_scales", "attn_mask"};

const char* route_name(Route r) {
  switch (r) {
    case Route::kAuto: return "auto";
    case Route::kPrefill: return "prefill";
    case Route::kDecode: return "decode";
    case Route::kSplitK: return "split_k";
  }
  return "?";
}

void expect_dtype(size_t i, const TensorIn& t, ONNXTensorElementDataType want, const char* why = "") {
  if (t.type != want)
    fail(kOp, "input '", kInputNames[i], "' (", i, "): expected dtype ", dtype_name(want), why, ", got ",
         dtype_name(t.type));
}

void expect_shape(size_t i, const TensorIn& t, const std::vector<int64_t>& want, const char* layout) {
  if (t.shape != want)
    fail(kOp, "input '", kInputNames[i], "' (", i, "): expected shape ", layout, " = ", shape_str(want),
         ", got ", shape_str(t.shape));
}

struct Attrs {
  float scale = NAN;  // NaN: 1/sqrt(D)
  bool causal = true;
  VFormat v_format = VFormat::kFloat;
  Route route = Route::kAuto;
  int64_t split_k_min_keys = 2048;
};

class AttentionKernel : public Kernel {
 public:
  AttentionKernel(const Attrs& a, Ep ep) : a_(a), ep_(ep) {}

  void compute(OrtKernelContext* ctx) override {
    AttentionParams p;
    const TensorIn in[6] = {get_input(ctx, 0), get_input(ctx, 1), get_input(ctx, 2),
                            get_input(ctx, 3), get_input(ctx, 4), get_input(ctx, 5)};
    validate(in, &p);
    [[maybe_unused]] OrtValue* out_value = nullptr;
    p.out = get_output(ctx, 0, in[0].shape, &out_value);
    if (p.B == 0 || p.Hq == 0 || p.Sq == 0) return;  // empty output
    p.route = a_.route == Route::kAuto ? choose_route(p, a_.split_k_min_keys) : a_.route;
    if (ep_ == Ep::kCpu) {
      if (p.route == Route::kSplitK)
        p.n_splits = cpu_split_count(p);
      attention_cpu(p, ctx);
      return;
    }
#if defined(DOT4ATTN_WITH_GPU)
    run_gpu(ctx, p, attention_gpu_plan(p), out_value, gpu_stream(ctx));
#else
    fail(kOp, "this build of dot4attn has no GPU kernels");
#endif
  }

 private:
  void validate(const TensorIn* in, AttentionParams* p) const {
    const TensorIn &q = in[0], &kp = in[1], &ks = in[2], &v = in[3], &vs = in[4], &mask = in[5];
    for (size_t i = 0; i < 4; ++i)
      if (!in[i].present) fail(kOp, "input '", kInputNames[i], "' (", i, ") is required but missing");
    if (q.type != F32 && q.type != F16)
      fail(kOp, "input 'query' (0): expected dtype float32 or float16, got ", dtype_name(q.type));
    if (q.shape.size() != 4)
      fail(kOp, "input 'query' (0): expected rank 4 [B, Hq, Sq, D], got shape ", shape_str(q.shape));
    const int64_t B = q.shape[0], Hq = q.shape[1], Sq = q.shape[2], D = q.shape[3];
    if (!head_dim_ok(D))
      fail(kOp, "input 'query' (0): head dim D must be a multiple of 32 in [32, 256], got ", D);
    expect_dtype(1, kp, I8);
    if (kp.shape.size() != 4)
      fail(kOp, "input 'k_payload' (1): expected rank 4 [B, Hkv, Sk, D], got shape ", shape_str(kp.shape));
    const int64_t Hkv = kp.shape[1], Sk = kp.shape[2];
    expect_shape(1, kp, {B, Hkv, Sk, D}, "[B, Hkv, Sk, D]");
    if (Hkv == 0 ? Hq != 0 : Hq % Hkv != 0)
      fail(kOp, "query heads Hq must be a multiple of KV heads Hkv: got Hq=", Hq, " (query ",
           shape_str(q.shape), ") and Hkv=", Hkv, " (k_payload ", shape_str(kp.shape), ")");
    expect_dtype(2, ks, F16);
    expect_shape(2, ks, {B, Hkv, Sk, D / kBlock}, "[B, Hkv, Sk, D/32]");

    const bool half = q.type == F16;
    switch (a_.v_format) {
      case VFormat::kFloat:
        expect_dtype(3, v, q.type, " (same as query) for v_format 'float'");
        expect_shape(3, v, {B, Hkv, Sk, D}, "[B, Hkv, Sk, D]");
        if (vs.present)
          fail(kOp, "input 'v_scales' (4): unexpected for v_format 'float' (V is not quantized); "
                    "pass no v_scales or set v_format to 'q8_0'/'q4_0'/'q6_0'");
        break;
      case VFormat::kQ8_0:
      case VFormat::kQ4_0:
      case VFormat::kQ6_0: {
        const bool q8 = a_.v_format == VFormat::kQ8_0;
        const std::string why = std::string(" for v_format '") + vformat_name(a_.v_format) + "'";
        expect_dtype(3, v, q8 ? I8 : U8, why.c_str());
        const char* layout = q8                              ? "[B, Hkv, Sk, D]"
                             : a_.v_format == VFormat::kQ4_0 ? "[B, Hkv, Sk, D/2]"
                                                             : "[B, Hkv, Sk, 3D/4]";
        expect_shape(3, v, {B, Hkv, Sk, payload_bytes(D, a_.v_format)}, layout);
        if (!vs.present)
          fail(kOp, "input 'v_scales' (4): required for v_format '", vformat_name(a_.v_format),
               "' but missing");
        expect_dtype(4, vs, F16);
        expect_shape(4, vs, {B, Hkv, Sk, D / kBlock}, "[B, Hkv, Sk, D/32]");
        break;
      }
    }

    p->B = B; p->Hq = Hq; p->Hkv = Hkv; p->Sq = Sq; p->Sk = Sk; p->D = int(D);
    p->half = half;
    p->scale = std::isnan(a_.scale) ? 1.f / std::sqrt(float(D)) : a_.scale;
    p->causal = a_.causal;
    p->v_format = a_.v_format;
    p->q = q.data;
    p->k = static_cast<const int8_t*>(kp.data);
    p->k_scales = static_cast<const uint16_t*>(ks.data);
    p->v = v.data;
    p->v_scales = vs.present ? static_cast<const uint16_t*>(vs.data) : nullptr;

    if (mask.present) {
      if (mask.type == BOOL) {
        p->mask_kind = MaskKind::kBool;
      } else if (mask.type == q.type) {
        p->mask_kind = MaskKind::kAdditive;
      } else {
        fail(kOp, "input 'attn_mask' (5): expected dtype bool or ", dtype_name(q.type),
             " (same as query), got ", dtype_name(mask.type));
      }
      const int64_t target[4] = {B, Hq, Sq, Sk};
      const size_t r = mask.shape.size();
      if (r > 4)
        fail(kOp, "input 'attn_mask' (5): expected rank <= 4, broadcastable to [B, Hq, Sq, Sk] = ",
             shape_str({B, Hq, Sq, Sk}), ", got shape ", shape_str(mask.shape));
      int64_t stride = 1;
      for (int dim = 3; dim >= 0; --dim) {
        const int md = int(r) - 4 + dim;  // right-aligned broadcast
        const int64_t n = md >= 0 ? mask.shape[md] : 1;
        if (n != target[dim] && n != 1)
          fail(kOp, "input 'attn_mask' (5): shape ", shape_str(mask.shape),
               " does not broadcast to [B, Hq, Sq, Sk] = ", shape_str({B, Hq, Sq, Sk}));
        p->mask_stride[dim] = n == 1 ? 0 : stride;
        stride *= n;
      }
      p->mask = mask.data;
    }

    if ((a_.route == Route::kDecode || a_.route == Route::kSplitK) && Sq > 8)
      fail(kOp, "attribute route='", route_name(a_.route),
           "' cannot take this shape: it needs Sq <= 8 query rows, got Sq=", Sq, " (query ",
           shape_str(q.shape), "); use route 'prefill' or 'auto'");
  }

#if defined(DOT4ATTN_WITH_GPU)
  void run_gpu(OrtKernelContext* ctx, const AttentionParams& p, const gpu::GpuPlan& plan, const OrtValue* out,
               void* stream) const {
    // Split-K partials come from ORT's allocator for the output's device.
    with_device_scratch(ctx, out, plan.scratch_bytes, [&](void* scratch) { attention_gpu(p, plan, scratch, stream); });
  }
#endif

  Attrs a_;
  Ep ep_;
};

Kernel* create_attention(const OrtKernelInfo* info, Ep ep) {
  Attrs a;
  a.scale = attr_float(info, kOp, "scale", NAN);
  if (!std::isnan(a.scale) && !(std::isfinite(a.scale) && a.scale > 0.f))
    fail(kOp, "attribute 'scale': expected a finite positive float, got ", a.scale);
  const int64_t causal = attr_int(info, kOp, "causal", 1);
  if (causal != 0 && causal != 1) fail(kOp, "attribute 'causal': expected 0 or 1, got ", causal);
  a.causal = causal == 1;
  const std::string vf = attr_string(info, kOp, "v_format", "float");
  if (!parse_vformat(vf, &a.v_format))
    fail(kOp, "attribute 'v_format': expected 'float', 'q8_0', 'q4_0' or 'q6_0', got '", vf, "'");
  const std::string route = attr_string(info, kOp, "route", "auto");
  if (route == "auto") a.route = Route::kAuto;
  else if (route == "prefill") a.route = Route::kPrefill;
  else if (route == "decode") a.route = Route::kDecode;
  else if (route == "split_k") a.route = Route::kSplitK;
  else fail(kOp, "attribute 'route': expected 'auto', 'prefill', 'decode' or 'split_k', got '", route, "'");
  a.split_k_min_keys = attr_int(info, kOp, "split_k_min_keys", 2048);
  if (a.split_k_min_keys < 1)
    fail(kOp, "attribute 'split_k_min_keys': expected >= 1, got ", a.split_k_min_keys);
  return new AttentionKernel(a, ep);
}

}  // namespace

std::vector<OpSpec> attention_op_specs() {
  std::vector<OpSpec> specs;
  for (auto t : {F32, F16}) {
    // Only `query` is typed: it selects T (and so the output type). Every other input is declared as any
    // type and checked in compute, so a wrong dtype gets our message (op, input, expected vs got) instead of
    // a bare schema mismatch. No shape-inference hook: ORT 1.17-1.22 dereference omitted optional inputs there.
    specs.push_back({kOp, {{t}, {ANY}, {ANY}, {ANY}, {ANY, true}, {ANY, true}}, {{t}}, create_attention, nullptr});
  }
  return specs;
}

}  // namespace dot4attn
