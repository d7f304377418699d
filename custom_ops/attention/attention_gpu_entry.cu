// C entries of the GPU backend for the benchmark, the kernel tests and `dot4attn info --plan` (through ctypes:
// python/dot4attn/gpu_entry.py declares the same argument block). They bypass ONNX Runtime: device pointers and a
// stream the caller owns, so kernel time can be measured with CUDA events, and plan overrides (launch_plan.h) can
// force any kernel configuration. Both return 0 on success, 1 on error with the message in err (up to err_len bytes).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "attention/attention_backends.h"
#include "common/fail.h"
#include "common/formats.h"
#include "gpu/attention_gpu_internal.h"

extern "C" {

// One call of Dot4Attention. Layouts as the op's inputs (docs/ops.md); mask_strides are element strides for
// (b, h, i, j), 0 where broadcast. The K / V row layout fields (AttentionParams) come last so that the fields
// before them keep their offsets; all 0: dense [B, Hkv, Sk, X] tensors. Key j of (b, kv head h) is row
// (b Hkv + h) kv_rows + j of K, V and their scales.
struct Dot4AttnGpuCall {
  int64_t B, Hq, Hkv, Sq, Sk;
  int64_t split_k_min_keys;  // the route attribute's threshold (route 0)
  int64_t mask_strides[4];
  const void* q;
  const void* k;
  const void* k_scales;
  const void* v;
  const void* v_scales;
  const void* mask;
  void* out;
  void* scratch;           // split_k partials: at least the plan's scratch_bytes
  void* stream;
  const char* overrides;   // plan overrides ("kernel=simt,warps=4"), null or "" for none
  int32_t D;
  int32_t half;            // T = float16, else float32
  int32_t v_format;        // 0 float (T), 1 q8_0, 2 q4_0
  int32_t causal;
  int32_t route;           // 0 auto, 1 prefill, 2 decode, 3 split_k
  int32_t mask_kind;       // 0 none, 1 bool, 2 additive T
  float scale;             // <= 0: 1 / sqrt(D)
  int64_t kv_rows;         // rows per (b, kv head) in storage, >= Sk; 0: Sk
  int64_t k_stride;        // bytes between K payload rows (a multiple of 16); 0: D
  int64_t ks_stride;       // halves between K scale rows; 0: D/32
  int64_t v_stride;        // elements of T (float V) or bytes (q8_0 / q4_0) between V rows; 0: the dense row
  int64_t vs_stride;       // halves between V scale rows; 0: D/32
};

}  // extern "C"

namespace {

using namespace dot4attn;
constexpr const char* kEntry = "dot4attn_gpu";

AttentionParams params_of(const Dot4AttnGpuCall& c) {
  if (c.B < 0 || c.Hq < 1 || c.Hkv < 1 || c.Sq < 0 || c.Sk < 0 || c.Hq % c.Hkv != 0)
    fail(kEntry, "expected B, Sq, Sk >= 0 and Hq a multiple of Hkv >= 1, got B=", c.B, " Hq=", c.Hq, " Hkv=", c.Hkv,
         " Sq=", c.Sq, " Sk=", c.Sk);
  if (!head_dim_ok(c.D)) fail(kEntry, "D: expected a multiple of 32 in [32, 256], got ", c.D);
  if (c.v_format < 0 || c.v_format > 2) fail(kEntry, "v_format: expected 0, 1 or 2, got ", c.v_format);
  if (c.route < 0 || c.route > 3) fail(kEntry, "route: expected 0..3, got ", c.route);
  if (c.mask_kind < 0 || c.mask_kind > 2) fail(kEntry, "mask_kind: expected 0, 1 or 2, got ", c.mask_kind);
  AttentionParams p;
  p.B = c.B; p.Hq = c.Hq; p.Hkv = c.Hkv; p.Sq = c.Sq; p.Sk = c.Sk; p.D = c.D;
  p.scale = c.scale > 0.f ? c.scale : 1.f / std::sqrt(float(c.D));
  p.causal = c.causal != 0;
  p.half = c.half != 0;
  p.v_format = c.v_format == 1 ? VFormat::kQ8_0 : c.v_format == 2 ? VFormat::kQ4_0 : VFormat::kFloat;
  p.q = c.q; p.k = static_cast<const int8_t*>(c.k); p.k_scales = static_cast<const uint16_t*>(c.k_scales);
  p.v = c.v; p.v_scales = static_cast<const uint16_t*>(c.v_scales); p.out = c.out;
  p.kv_rows = c.kv_rows; p.k_stride = c.k_stride; p.ks_stride = c.ks_stride; p.v_stride = c.v_stride;
  p.vs_stride = c.vs_stride;  // checked by the planner
  if (c.mask_kind != 0 && c.mask != nullptr) {
    p.mask_kind = c.mask_kind == 1 ? MaskKind::kBool : MaskKind::kAdditive;
    p.mask = c.mask;
    for (int i = 0; i < 4; ++i) p.mask_stride[i] = c.mask_strides[i];
  }
  const Route routes[] = {Route::kAuto, Route::kPrefill, Route::kDecode, Route::kSplitK};
  p.route = c.route == 0 ? choose_route(p, c.split_k_min_keys > 0 ? c.split_k_min_keys : 2048) : routes[c.route];
  if (p.route != Route::kPrefill && p.Sq > 8)
    fail(kEntry, "the decode and split_k routes take Sq <= 8, got Sq=", p.Sq);
  return p;
}

void copy_out(const std::string& s, char* dst, size_t len) {
  if (!dst || !len) return;
  const size_t n = std::min(s.size(), len - 1);
  std::memcpy(dst, s.data(), n);
  dst[n] = 0;
}

template <class F>
int guarded(char* err, size_t err_len, F&& f) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    copy_out(e.what(), err, err_len);
    return 1;
  }
}

}  // namespace

// The launch plan of a call as JSON (and its scratch bytes), for the current device (device_facts null) or for the
// device the facts describe ("sm=90a,sms=132,smem=232448": launch_plan.h), so plans can be asked without a GPU.
// Pointers in c only count for their alignment (null: aligned).
extern "C" __attribute__((visibility("default"))) int dot4attn_gpu_plan(const Dot4AttnGpuCall* c,
                                                                     const char* device_facts, char* plan_json,
                                                                     size_t plan_len, size_t* scratch_bytes,
                                                                     char* err, size_t err_len) {
  return guarded(err, err_len, [&] {
    const AttentionParams p = params_of(*c);
    const gpu::DeviceFacts dev = device_facts ? gpu::parse_device_facts(device_facts) : gpu::device_facts();
    const gpu::GpuPlan plan = gpu::plan_attention(p, dev, gpu::parse_plan_overrides(c->overrides));
    if (scratch_bytes) *scratch_bytes = plan.scratch_bytes;
    copy_out(gpu::plan_json(plan), plan_json, plan_len);
  });
}

// Plans the call on the current device and enqueues it on c->stream (c->scratch: the plan's scratch_bytes, from
// dot4attn_gpu_plan). plan_json (optional) receives the plan that ran.
extern "C" __attribute__((visibility("default"))) int dot4attn_gpu_attention(const Dot4AttnGpuCall* c,
                                                                          char* plan_json, size_t plan_len,
                                                                          char* err, size_t err_len) {
  return guarded(err, err_len, [&] {
    const AttentionParams p = params_of(*c);
    const gpu::GpuPlan plan = attention_gpu_plan(p, gpu::parse_plan_overrides(c->overrides));
    if (plan_json) copy_out(gpu::plan_json(plan), plan_json, plan_len);  // not on timed calls: host time
    attention_gpu(p, plan, c->scratch, c->stream);
  });
}
