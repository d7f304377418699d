// Internal interface between the GPU route files (decode/, split_k/, prefill/) and the launcher
// (attention/attention_gpu.cu). CUDA/HIP translation units only.
#pragma once

#include "attention/attention_params.h"
#include "gpu/attention_tile.cuh"

namespace dot4attn {
namespace gpu {

// TileArgs for p with one split covering every key and the final output as destination.
TileArgs make_tile_args(const AttentionParams& p);

// decode/decode_gpu.cu: one block per (batch, KV head[, split]) holding all g x Sq rows (chunks of 16 beyond).
// With a.part_acc set it writes split partials (split_k stage 1).
void launch_decode_tiles(const TileArgs& a, gpuStream_t stream);
void run_decode(const AttentionParams& p, gpuStream_t stream);

// split_k/split_k_gpu.cu: FlashDecoding over p.n_splits key splits, then the log-sum-exp merge.
size_t split_k_scratch_bytes(const AttentionParams& p);
void run_split_k(const AttentionParams& p, void* scratch, gpuStream_t stream);

// prefill/prefill_gpu.cu: 64-row tiles, causal prefix tiles unmasked.
void run_prefill(const AttentionParams& p, gpuStream_t stream);

}  // namespace gpu
}  // namespace dot4attn
