// The backends' entry points for Dot4Attention. Each takes validated params with a resolved route.
#pragma once
#include <cstddef>
#include <cstdint>

#include "attention/attention_params.h"

struct OrtKernelContext;

namespace dot4attn {

// CPU: routes in prefill/, decode/, split_k/; runs on ORT's intra-op thread pool.
void attention_cpu(const AttentionParams& p, OrtKernelContext* ctx);
int64_t cpu_parallel_units();  // worker threads the CPU routes can count on

#if defined(DOT4ATTN_WITH_GPU)
// GPU (CUDA or HIP from one source): scratch is device memory of attention_gpu_scratch_bytes(p) bytes
// (split-K partials) from ORT's allocator; everything is enqueued on `stream`, no host synchronisation.
size_t attention_gpu_scratch_bytes(const AttentionParams& p);
void attention_gpu(const AttentionParams& p, void* scratch, void* stream);
int64_t gpu_parallel_units(void* stream);  // SMs / CUs of the stream's device (cached)
// split_k's split count on the GPU: SMs x waves (2; DOT4ATTN_SPLIT_WAVES for tuning) of (batch, KV head, split)
// items, at least 128 keys per split.
int64_t gpu_split_count(const AttentionParams& p, void* stream);
#endif

}  // namespace dot4attn
