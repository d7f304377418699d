// Dot4Attention on the GPU: the launcher. Plans a validated call on the current device (gpu/launch_plan.h), then
// executes the plan on the EP's stream: no host synchronisation and no device allocation happen here (split_k's
// partials and the prefill's V flags come from the caller: plan.scratch_bytes of scratch).
#include <map>
#include <mutex>

#include "attention/attention_backends.h"
#include "gpu/attention_gpu_internal.h"

#if defined(D4A_CUDA)
#include "gpu/tma.cuh"
#endif

namespace dot4attn {

namespace gpu {

TileArgs make_tile_args(const AttentionParams& p, const GpuPlan& plan) {
  TileArgs a{};
  a.B = p.B; a.Hq = p.Hq; a.Hkv = p.Hkv; a.Sq = p.Sq; a.Sk = p.Sk; a.g = p.group();
  a.D = p.D; a.nb = p.D / 32;
  a.vk = plan.vk;
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
  a.n_splits = plan.n_splits;
  a.split_len = plan.split_len;
  a.n_chunks = plan.n_chunks;
  a.reverse_chunks = plan.reverse_chunks;
  a.nst = plan.stages;
  a.cluster = plan.cluster > 0 ? 1 : 0;
  a.split_chunks = plan.split_chunks;
  a.kv_rows = p.head_rows();
  a.k_stride = p.k_row();
  a.ks_stride = p.ks_row();
  a.v_stride = v_stride_bytes(p);
  a.vs_stride = p.vs_row();
  a.v_flags = nullptr;  // the prefill's V scan sets it (run_prefill)
  a.k_flags = nullptr;  // the prefill's K copy sets it (run_prefill)
  a.seqlens = p.dev_seqlens;
  a.pdl = p.follows_prologue && plan.kernel == KernelKind::kDecodeMma && plan.cluster == 0 &&
                  device_facts().cc_major >= 9 ? 1 : 0;
  return a;
}

namespace {

int attribute(gpuDeviceAttr_t attr, int dev, int fallback) {
  int v = 0;
  return gpuDeviceGetAttribute(&v, attr, dev) == gpuSuccess && v > 0 ? v : fallback;
}

DeviceFacts query_device(int dev) {
  DeviceFacts d;
#if defined(D4A_CUDA)
  d.cc_major = attribute(cudaDevAttrComputeCapabilityMajor, dev, 0);
  d.cc_minor = attribute(cudaDevAttrComputeCapabilityMinor, dev, 0);
  d.tma = tma_encoder() != nullptr;
  d.wgmma = wgmma_in_binary();
#else
  d.hip = true;
#endif
  d.sms = attribute(gpuDevAttrMultiProcessorCount, dev, 1);
  d.warp_size = attribute(gpuDevAttrWarpSize, dev, 32);
  d.max_smem = attribute(gpuDevAttrMaxSharedMemoryPerBlockOptin, dev, 48 * 1024);
  return d;
}

}  // namespace

// Device attributes cost microseconds per query: asked once per device.
DeviceFacts device_facts() {
  static std::mutex mu;
  static std::map<int, DeviceFacts> cache;
  int dev = 0;
  D4A_GPU_CHECK(gpuGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  const auto it = cache.find(dev);
  if (it != cache.end()) return it->second;
  return cache[dev] = query_device(dev);
}

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

gpu::GpuPlan attention_gpu_plan(const AttentionParams& p, const gpu::PlanOverrides& ov) {
  return gpu::plan_attention(p, gpu::device_facts(), ov);
}

void attention_gpu(const AttentionParams& p, const gpu::GpuPlan& plan, void* scratch, void* stream) {
  using namespace gpu;
  auto s = static_cast<gpuStream_t>(stream);
  const int64_t out_elems = p.B * p.Hq * p.Sq * p.D;
  if (out_elems == 0) return;
  if (p.Sk == 0) {  // no key at all: every row outputs zeros
    D4A_GPU_CHECK(gpuMemsetAsync(p.out, 0, size_t(out_elems) * (p.half ? 2 : 4), s));
    return;
  }
  if (plan.scratch_bytes > 0 && scratch == nullptr)
    throw std::runtime_error("Dot4Attention GPU: the plan needs " + std::to_string(plan.scratch_bytes) +
                             " bytes of scratch (split_k partials or the prefill's V flags), none given");
  const TileArgs a = make_tile_args(p, plan);
  switch (plan.route) {
    case Route::kPrefill: run_prefill(plan, a, scratch, s); return;
    case Route::kSplitK: run_split_k(plan, a, scratch, s); return;
    case Route::kDecode:
      if (run_decode(plan, a, s)) return;
      {  // the device refused the planned cluster launch: the same call without a cluster
        PlanOverrides ov = plan.overrides;
        ov.cluster = 1;
        const GpuPlan again = plan_attention(p, device_facts(), ov);
        if (!run_decode(again, make_tile_args(p, again), s))
          throw std::runtime_error("Dot4Attention GPU: the decode launch was refused");
      }
      return;
    case Route::kAuto: break;
  }
  throw std::runtime_error("Dot4Attention GPU: unresolved route");
}

}  // namespace dot4attn
