// Backends of Dot4GroupQueryAttention. Both write the new tokens' packed rows into the present caches (after
// copying the past rows when the runtime did not share the buffers), then attend per batch row.
#pragma once
#include "cache/cache_params.h"

struct OrtKernelContext;

namespace dot4attn {

void cache_attention_cpu(const CacheParams& c, OrtKernelContext* ctx);

#if defined(DOT4ATTN_WITH_GPU)
// Enqueues everything on `stream`. `scratch` is device memory of cache_gpu_scratch_bytes(c) bytes.
size_t cache_gpu_scratch_bytes(const CacheParams& c);
void cache_attention_gpu(const CacheParams& c, void* scratch, void* stream);
#endif

}  // namespace dot4attn
