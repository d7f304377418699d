// The backends' entry points for Dot4Attention. Each takes validated params with a resolved route.
#pragma once
#include <cstddef>
#include <cstdint>

#include "common/attention_params.h"
#include "gpu/launch_plan.h"

struct OrtKernelContext;

namespace dot4attn {

// CPU: routes in prefill/, decode/, split_k/; runs on ORT's intra-op thread pool.
void attention_cpu(const AttentionParams& p, OrtKernelContext* ctx);
int64_t cpu_parallel_units();  // worker threads the CPU routes can count on
// split_k's split count on the CPU (choose_splits over the worker threads, two waves, splits of >= 256 keys).
int64_t cpu_split_count(const AttentionParams& p);

#if defined(DOT4ATTN_WITH_GPU)
// GPU (CUDA or HIP from one source): plan on the current device, then run. scratch is device memory of
// plan.scratch_bytes bytes (split-K partials) from ORT's allocator; everything is enqueued on `stream`, no host
// synchronisation.
gpu::GpuPlan attention_gpu_plan(const AttentionParams& p, const gpu::PlanOverrides& ov = {});
void attention_gpu(const AttentionParams& p, const gpu::GpuPlan& plan, void* scratch, void* stream);
#endif

}  // namespace dot4attn
