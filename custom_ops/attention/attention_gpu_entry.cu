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
  int32_t v_format;        // 0 float (T), 1 q8_0, 2 q4_0, 3 q6_0
  int32_t causal;
  int32_t route;           // 0 auto, 1 prefill, 2 decode, 3 split_k
  int32_t mask_kind;       // 0 none, 1 bool, 2 additive T
  float scale;             // <= 0: 1 / sqrt(D)
  int64_t kv_rows;         // rows per (b, kv head) in storage, >= Sk; 0: Sk
  int64_t k_stride;        // bytes between K payload rows (a multiple of 16); 0: D
  int64_t ks_stride;       // halves between K scale rows; 0: D/32
  int64_t v_stride;        // elements of T (float V) or bytes (q8_0 / q4_0 / q6_0) between V rows; 0: the dense row
  int64_t vs_stride;       // halves between V scale rows; 0: D/32
  // A described AMD device ("hip,cus=304,warp=64,smem=65536", launch_plan.h): the call runs that device's plan on
  // this GPU (the same kernel, row and key tiles, threads, stages, splits and shared-memory cap; a SIMT decode block of
  // 64-wide waves runs as twice the 32-wide warps), so its plans are tested where no AMD GPU is. Null: this GPU's plan.
  const char* run_as;
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
  if (c.v_format < 0 || c.v_format > 3) fail(kEntry, "v_format: expected 0, 1, 2 or 3, got ", c.v_format);
  if (c.route < 0 || c.route > 3) fail(kEntry, "route: expected 0..3, got ", c.route);
  if (c.mask_kind < 0 || c.mask_kind > 2) fail(kEntry, "mask_kind: expected 0, 1 or 2, got ", c.mask_kind);
  AttentionParams p;
  p.B = c.B; p.Hq = c.Hq; p.Hkv = c.Hkv; p.Sq = c.Sq; p.Sk = c.Sk; p.D = c.D;
  p.scale = c.scale > 0.f ? c.scale : 1.f / std::sqrt(float(c.D));
  p.causal = c.causal != 0;
  p.half = c.half != 0;
  const VFormat codes[] = {VFormat::kFloat, VFormat::kQ8_0, VFormat::kQ4_0, VFormat::kQ6_0};
  p.v_format = codes[c.v_format];
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

// The facts a call is planned with: the described device (`described`: only planned, never run), else the call's
// run_as device as this GPU runs it (its warp width: DeviceFacts::run_warp), else this GPU.
gpu::DeviceFacts facts_of(const Dot4AttnGpuCall& c, const char* described) {
  const bool run_as = c.run_as != nullptr && *c.run_as != 0;
  if (described != nullptr && run_as) fail(kEntry, "a described device and run_as: give one of them");
  if (described != nullptr) return gpu::parse_device_facts(described);
  if (!run_as) return gpu::device_facts();
  gpu::DeviceFacts d = gpu::parse_device_facts(c.run_as);
  const gpu::DeviceFacts here = gpu::device_facts();
  // The portable kernels only: a CUDA description's tensor-core plans would need this GPU's own features.
  if (!d.hip)
    fail(kEntry, "run_as: expected a described AMD device (hip,cus=N,warp=32|64,smem=N), got '", c.run_as, "'");
  if (d.warp_size < here.warp_size || d.max_smem > here.max_smem)
    fail(kEntry, "run_as: this GPU (warp ", here.warp_size, ", ", here.max_smem, " bytes of shared memory) cannot ",
         "run the plans of '", c.run_as, "'");
  if (d.run_warp != 0 && d.run_warp != here.warp_size)
    fail(kEntry, "run_as: run_warp=", d.run_warp, ", but this GPU's warps are ", here.warp_size, " wide");
  d.run_warp = here.warp_size;
  return d;
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

// The launch plan of a call as JSON (and its scratch bytes), for the current device (device_facts null; with the
// call's run_as, the plan dot4attn_gpu_attention runs) or for the device the facts describe
// ("sm=90a,sms=132,smem=232448": launch_plan.h), so plans can be asked without a GPU. Pointers in c only count for
// their alignment (null: aligned).
extern "C" __attribute__((visibility("default"))) int dot4attn_gpu_plan(const Dot4AttnGpuCall* c,
                                                                     const char* device_facts, char* plan_json,
                                                                     size_t plan_len, size_t* scratch_bytes,
                                                                     char* err, size_t err_len) {
  return guarded(err, err_len, [&] {
    const AttentionParams p = params_of(*c);
    const gpu::PlanOverrides ov = gpu::parse_plan_overrides(c->overrides);
    const gpu::GpuPlan plan = gpu::plan_attention(p, facts_of(*c, device_facts), ov);
    if (scratch_bytes) *scratch_bytes = plan.scratch_bytes;
    copy_out(gpu::plan_json(plan), plan_json, plan_len);
  });
}

// Plans the call on the current device (or as c->run_as) and enqueues it on c->stream (c->scratch: the plan's
// scratch_bytes, from dot4attn_gpu_plan). plan_json (optional) receives the plan that ran.
extern "C" __attribute__((visibility("default"))) int dot4attn_gpu_attention(const Dot4AttnGpuCall* c,
                                                                          char* plan_json, size_t plan_len,
                                                                          char* err, size_t err_len) {
  return guarded(err, err_len, [&] {
    const AttentionParams p = params_of(*c);
    const gpu::PlanOverrides ov = gpu::parse_plan_overrides(c->overrides);
    const gpu::GpuPlan plan = c->run_as ? gpu::plan_attention(p, facts_of(*c, nullptr), ov) : attention_gpu_plan(p, ov);
    if (plan_json) copy_out(gpu::plan_json(plan), plan_json, plan_len);  // not on timed calls: host time
    attention_gpu(p, plan, c->scratch, c->stream);
  });
}
