// Internal interface between the launcher (attention/attention_gpu.cu) and the route files that execute plans
// (decode/, split_k/, prefill/). CUDA/HIP translation units only.
#pragma once

#include "common/attention_params.h"
#include "gpu/attention_tile.cuh"
#include "gpu/launch_plan.h"

namespace dot4attn {
namespace gpu {

// Throws the error for a plan whose instance this build did not compile (the plan's JSON in the message).
[[noreturn]] void no_instance(const GpuPlan& plan);

// The kernels' arguments for p as `plan` lays the work out (row chunks, splits, stages, cluster).
TileArgs make_tile_args(const AttentionParams& p, const GpuPlan& plan);

// The facts of the current device (cached per device): what plan_attention needs to know.
DeviceFacts device_facts();
// prefill/prefill_gpu.cu: whether the current device's loaded kernels have wgmma (an sm_90a build).
bool wgmma_in_binary();

// Raises kernel `kern`'s dynamic shared-memory limit to `bytes` (above the 48 KB default) on the current device, once
// per (kernel, device, larger size) instead of a driver call on every launch.
void set_dynamic_smem(const void* kern, int bytes);

// Launches `kern` on the plan's grid: plan.blocks blocks of plan.threads threads, plan.smem_bytes of shared memory.
template <class Kernel, class... Args>
void launch_planned(Kernel kern, const GpuPlan& plan, gpuStream_t s, const Args&... args) {
  set_dynamic_smem(reinterpret_cast<const void*>(kern), plan.smem_bytes);
  kern<<<unsigned(plan.blocks), unsigned(plan.threads), size_t(plan.smem_bytes), s>>>(args...);
  D4A_GPU_CHECK(gpuGetLastError());
}

#if defined(D4A_CUDA)
// launch_planned as the programmatic dependent of the stream's previous kernel (vendor.h, launch_dependent): its blocks
// may launch while that kernel finishes, so the kernel calls pdl_wait before it reads what that kernel wrote or writes
// anything. Only for kernels of sm_90 plans: compiled for an older architecture pdl_wait is empty.
template <class Kernel, class... Args>
void launch_planned_dependent(Kernel kern, const GpuPlan& plan, gpuStream_t s, const Args&... args) {
  set_dynamic_smem(reinterpret_cast<const void*>(kern), plan.smem_bytes);
  launch_dependent(kern, unsigned(plan.blocks), unsigned(plan.threads), size_t(plan.smem_bytes), s, args...);
}
#endif

// decode/decode_gpu.cu (instances: decode/decode_instances.h): a plan of the decode kernels or of the decode /
// split_k tile kernel (split_k stage 1 when a.part_acc is set). False only when the device refused a cluster launch
// (the caller plans again without).
bool run_decode(const GpuPlan& plan, const TileArgs& a, gpuStream_t stream);

// split_k/split_k_gpu.cu: stage 1 over plan.n_splits key splits into `scratch` (plan.scratch_bytes), then the
// log-sum-exp merge.
void run_split_k(const GpuPlan& plan, TileArgs a, void* scratch, gpuStream_t stream);

// prefill/prefill_gpu.cu: a plan of the tensor-core prefill or of the prefill tile kernel (scratch: the V scan's
// flags when plan.v_scan, else unused).
void run_prefill(const GpuPlan& plan, const TileArgs& a, void* scratch, gpuStream_t stream);

}  // namespace gpu
}  // namespace dot4attn
