// Backends of Dot4GroupQueryAttention. Both write the new tokens' packed rows into the present caches (after
// copying the past rows when the runtime did not share the buffers), then attend per batch row.
#pragma once
#include <vector>

#include "cache/cache_attention.h"
#include "cache/cache_params.h"
#if defined(DOT4ATTN_WITH_GPU)
#include "gpu/launch_plan.h"
#endif

struct OrtKernelContext;

namespace dot4attn {

void cache_attention_cpu(const CacheParams& c, OrtKernelContext* ctx);

#if defined(DOT4ATTN_WITH_GPU)
// The GPU work of one call, planned once on the host: the attention's launch plan per run of batch rows
// (cache_batch_runs) and the scratch it all needs (query and output rows, split-K partials).
struct CacheGpuWork {
  std::vector<BatchRun> runs;
  std::vector<gpu::GpuPlan> plans;
  size_t q_bytes = 0, out_bytes = 0, split_bytes = 0;
  size_t scratch_bytes() const { return q_bytes + out_bytes + split_bytes; }
};
CacheGpuWork cache_gpu_plan(const CacheParams& c);
// seqlens_k [n] from the device to the host (one synchronisation of `stream`): the lengths of a prompt's rows.
void cache_seqlens_to_host(const int32_t* dev, int64_t n, int32_t* host, void* stream);
// Enqueues everything on `stream`. `scratch` is device memory of work.scratch_bytes() bytes.
void cache_attention_gpu(const CacheParams& c, const CacheGpuWork& work, void* scratch, void* stream);
#endif

}  // namespace dot4attn
