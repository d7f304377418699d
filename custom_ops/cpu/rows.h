// Shared pieces of the three CPU routes: a block of query rows of one (batch, KV head) quantized for dot4,
// its online-softmax state, and writing the normalised result back.
#pragma once
#include <cstdint>
#include <vector>

#include <onnxruntime_c_api.h>

#include "common/attention_params.h"
#include "cpu/isa.h"

namespace dot4attn {

// Rows m = g * (i1 - i0) + (i - i0) for the G query heads g of KV head `hkv` and positions i in [i0, i1).
struct RowBlock {
  int64_t b = 0, hkv = 0, i0 = 0, i1 = 0;
  int M = 0;
  std::vector<int8_t> q;
  std::vector<float> qs, m, l, acc;
  std::vector<int64_t> limit, mask_off;
  bool causal = false;

  AttendRows rows(int D) const;
  AttendState state();
  int64_t key_end(int64_t sk) const;  // one past the last key any row may see
  void reset_state(int D);            // m = -inf, l = 0, acc = 0
};

// Quantizes the rows (exact contract math) and resets their state.
void load_rows(const AttentionParams& p, int64_t b, int64_t hkv, int64_t i0, int64_t i1, RowBlock& rb);
// output = acc / l (0 where no key was visible), cast to T.
void store_rows(const AttentionParams& p, const RowBlock& rb);
AttendKv kv_view(const AttentionParams& p, int64_t b, int64_t hkv);
AttendMask mask_view(const AttentionParams& p);

// The routes (prefill/, decode/, split_k/).
void prefill_cpu(const AttentionParams& p, OrtKernelContext* ctx);
void decode_cpu(const AttentionParams& p, OrtKernelContext* ctx);
void split_k_cpu(const AttentionParams& p, OrtKernelContext* ctx);

}  // namespace dot4attn
