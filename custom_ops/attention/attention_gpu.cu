// Dot4Attention on the GPU: the launcher. Turns validated AttentionParams into the kernels' arguments, sizes
// the split-K scratch, and dispatches the resolved route (decode / split_k / prefill). Everything is enqueued
// on the EP's stream; no host synchronisation and no device allocation happen here.
#include <cmath>
#include <cstdlib>
#include <map>
#include <mutex>

#include "attention/attention_backends.h"
#include "gpu/attention_gpu_internal.h"

namespace dot4attn {

namespace gpu {

TileArgs make_tile_args(const AttentionParams& p) {
  TileArgs a{};
  a.B = p.B; a.Hq = p.Hq; a.Hkv = p.Hkv; a.Sq = p.Sq; a.Sk = p.Sk; a.g = p.group();
  a.D = p.D; a.nb = p.D / 32;
  a.vk = p.v_format == VFormat::kQ8_0 ? kVQ8 : p.v_format == VFormat::kQ4_0 ? kVQ4 : p.half ? kVF16 : kVF32;
  a.scale = p.scale;
  a.scale_log2 = p.scale * kLog2e;
  a.half = p.half ? 1 : 0;
  a.causal = p.causal ? 1 : 0;
  a.q = p.q; a.k = p.k; a.ks = p.k_scales; a.v = p.v; a.vs = p.v_scales;
  a.mask_kind = p.mask_kind == MaskKind::kBool ? 1 : p.mask_kind == MaskKind::kAdditive ? 2 : 0;
  a.mask = p.mask;
  a.ms0 = p.mask_stride[0]; a.ms1 = p.mask_stride[1]; a.ms2 = p.mask_stride[2]; a.ms3 = p.mask_stride[3];
  a.out = p.out;
  a.part_acc = nullptr; a.part_ml = nullptr;
  a.n_splits = 1;
  a.split_len = p.Sk > 0 ? p.Sk : 1;
  a.n_chunks = 1;
  a.reverse_chunks = 0;
  a.nst = 1;
  a.cluster = 0;
  a.pool = nullptr;
  a.pool_beg = 0;
  a.split_chunks = 0;
  return a;
}

// Device attributes are asked on every launch and cost microseconds: cache them per (device, attribute).
int device_attribute(gpuDeviceAttr_t attr, int fallback) {
  static std::mutex mu;
  static std::map<std::pair<int, int>, int> cache;
  int dev = 0;
  if (gpuGetDevice(&dev) != gpuSuccess || dev < 0) return fallback;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(dev, int(attr));
  const auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  int v = 0;
  if (gpuDeviceGetAttribute(&v, attr, dev) != gpuSuccess || v <= 0) v = fallback;
  cache[key] = v;
  return v;
}

int max_shared_bytes() { return device_attribute(gpuDevAttrMaxSharedMemoryPerBlockOptin, 48 * 1024); }

void set_dynamic_smem(const void* kern, int bytes) {
  if (bytes <= 48 * 1024) return;  // the default limit
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, int> done;  // (kernel, device) -> the limit set
  int dev = 0;
  D4A_GPU_CHECK(gpuGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  int& have = done[std::make_pair(kern, dev)];
  if (bytes <= have) return;
  D4A_GPU_CHECK(gpuFuncSetAttribute(kern, gpuFuncAttributeMaxDynamicSharedMemorySize, bytes));
  have = bytes;
}

}  // namespace gpu

size_t attention_gpu_scratch_bytes(const AttentionParams& p) {
  if (p.route != Route::kSplitK || p.Sk == 0) return 0;
  return gpu::split_k_scratch_bytes(p);
}

void attention_gpu(const AttentionParams& p, void* scratch, void* stream) {
  auto s = static_cast<gpuStream_t>(stream);
  const int64_t out_elems = p.B * p.Hq * p.Sq * p.D;
  if (out_elems == 0) return;
  if (p.Sk == 0) {  // no key at all: every row outputs zeros
    D4A_GPU_CHECK(gpuMemsetAsync(p.out, 0, size_t(out_elems) * (p.half ? 2 : 4), s));
    return;
  }
  switch (p.route) {
    case Route::kPrefill: gpu::run_prefill(p, s); break;
    case Route::kDecode: gpu::run_decode(p, s); break;
    case Route::kSplitK:
      if (scratch == nullptr) gpu::run_decode(p, s);  // no scratch: one split
      else gpu::run_split_k(p, scratch, s);
      break;
    case Route::kAuto: throw std::runtime_error("Dot4Attention GPU: unresolved route");
  }
}

int64_t gpu_parallel_units(void* stream) {
  (void)stream;  // ORT makes the stream's device current before Compute
  return gpu::device_attribute(gpuDevAttrMultiProcessorCount, 1);
}

int64_t gpu_split_count(const AttentionParams& p, void* stream) {
  // Two waves of (batch, KV head, split) items per multiprocessor. One full wave sized from the tensor-core decode
  // kernel's occupancy (49 splits instead of 33 for (32, 8, 128) q4_0) measured no faster on the H200.
  static const int64_t waves = [] {
    const char* v = std::getenv("DOT4ATTN_SPLIT_WAVES");  // tuning
    const int64_t w = v ? std::atoll(v) : 0;
    return w > 0 ? w : int64_t(2);
  }();
  return choose_splits(p.B * p.Hkv, p.Sk, gpu_parallel_units(stream), waves, /*min keys=*/128);
}

}  // namespace dot4attn

// ---- C entry points for the CUDA benchmark and the kernel checks (python/dot4attn/bench_cuda.py,
// tools/gpu_check_decode.py, through ctypes) ----------------------------------------------------------------------
// Runs Dot4Attention on device pointers and a stream the caller owns, bypassing ONNX Runtime, so kernel time
// can be measured with CUDA events. route: 0 auto, 1 prefill, 2 decode, 3 split_k; v_format: 0 float, 1 q8_0,
// 2 q4_0. With scratch == nullptr it only reports the scratch bytes (and n_splits) it needs and returns 0.
// Returns 0 on success, 1 on error (message in err, up to err_len bytes). The _masked variant adds the optional
// mask (mask_kind 0 none, 1 bool, 2 additive T; element strides for b, h, i, j, 0 where broadcast).
extern "C" __attribute__((visibility("default"))) int dot4attn_gpu_attention_masked(
    int64_t B, int64_t Hq, int64_t Hkv, int64_t Sq, int64_t Sk, int D, int half, int v_format, int causal,
    int route, float scale, int64_t split_k_min_keys, const void* q, const void* k, const void* k_scales,
    const void* v, const void* v_scales, void* out, void* scratch, size_t* scratch_bytes, int64_t* n_splits,
    void* stream, char* err, size_t err_len, int mask_kind, const void* mask, const int64_t* mask_strides) {
  using namespace dot4attn;
  try {
    AttentionParams p;
    p.B = B; p.Hq = Hq; p.Hkv = Hkv; p.Sq = Sq; p.Sk = Sk; p.D = D;
    p.scale = scale > 0.f ? scale : 1.f / sqrtf(float(D));
    p.causal = causal != 0;
    p.half = half != 0;
    p.v_format = v_format == 1 ? VFormat::kQ8_0 : v_format == 2 ? VFormat::kQ4_0 : VFormat::kFloat;
    p.q = q; p.k = static_cast<const int8_t*>(k); p.k_scales = static_cast<const uint16_t*>(k_scales);
    p.v = v; p.v_scales = static_cast<const uint16_t*>(v_scales); p.out = out;
    if (mask_kind != 0 && mask != nullptr) {
      p.mask_kind = mask_kind == 1 ? MaskKind::kBool : MaskKind::kAdditive;
      p.mask = mask;
      for (int i = 0; i < 4; ++i) p.mask_stride[i] = mask_strides ? mask_strides[i] : 0;
    }
    p.route = route == 1 ? Route::kPrefill : route == 2 ? Route::kDecode : route == 3 ? Route::kSplitK
                                                                                        : choose_route(p, split_k_min_keys);
    if (p.route == Route::kSplitK)
      p.n_splits = gpu_split_count(p, stream);
    const size_t need = attention_gpu_scratch_bytes(p);
    if (scratch_bytes) *scratch_bytes = need;
    if (n_splits) *n_splits = p.n_splits;
    if (scratch == nullptr && need > 0) return 0;
    attention_gpu(p, scratch, stream);
    return 0;
  } catch (const std::exception& e) {
    if (err && err_len) {
      size_t n = 0;
      for (const char* s = e.what(); *s && n + 1 < err_len; ++s) err[n++] = *s;
      err[n] = 0;
    }
    return 1;
  }
}

extern "C" __attribute__((visibility("default"))) int dot4attn_gpu_attention(
    int64_t B, int64_t Hq, int64_t Hkv, int64_t Sq, int64_t Sk, int D, int half, int v_format, int causal,
    int route, float scale, int64_t split_k_min_keys, const void* q, const void* k, const void* k_scales,
    const void* v, const void* v_scales, void* out, void* scratch, size_t* scratch_bytes, int64_t* n_splits,
    void* stream, char* err, size_t err_len) {
  return dot4attn_gpu_attention_masked(B, Hq, Hkv, Sq, Sk, D, half, v_format, causal, route, scale,
                                       split_k_min_keys, q, k, k_scales, v, v_scales, out, scratch, scratch_bytes,
                                       n_splits, stream, err, err_len, 0, nullptr, nullptr);
}
