// Everything a Dot4Attention launch needs, for every backend, after validation (attention_op.cc).
// Tensors are row-major [B, H, S, X] (K/V rows may be strided, see below); offsets are 64-bit.
#pragma once
#include <cstdint>

#include "common/formats.h"

namespace dot4attn {

enum class Route { kAuto, kPrefill, kDecode, kSplitK };
enum class MaskKind { kNone, kBool, kAdditive };

struct AttentionParams {
  int64_t B = 0, Hq = 0, Hkv = 0, Sq = 0, Sk = 0;
  int D = 0;
  float scale = 1.f;       // softmax scale (attribute `scale`, default 1/sqrt(D))
  bool causal = true;      // bottom-right aligned: row i sees key j iff j <= Sk - Sq + i
  bool half = false;       // T = float16 (query, output, float V, additive mask); else float32
  VFormat v_format = VFormat::kFloat;

  const void* q = nullptr;          // T [B, Hq, Sq, D]
  const int8_t* k = nullptr;        // int8 [B, Hkv, Sk, D]
  const uint16_t* k_scales = nullptr;  // fp16 bits [B, Hkv, Sk, D/32]
  const void* v = nullptr;          // T [B,Hkv,Sk,D] | int8 [B,Hkv,Sk,D] | uint8 [B,Hkv,Sk,D/2] (q4_0), 3D/4 (q6_0)
  const uint16_t* v_scales = nullptr;  // fp16 bits [B, Hkv, Sk, D/32] (quantized V only)

  MaskKind mask_kind = MaskKind::kNone;
  const void* mask = nullptr;       // bool (uint8) or T, broadcast to [B, Hq, Sq, Sk] by the strides below
  int64_t mask_stride[4] = {0, 0, 0, 0};  // element strides for b, h, i, j (0 where broadcast)

  void* out = nullptr;              // T [B, Hq, Sq, D]

  // K/V row layout. The defaults (0) mean the dense tensors above. The packed cache of Dot4GroupQueryAttention
  // keeps each token's payload and scales in one row of a [B, Hkv, kv_rows, row_bytes] buffer: K payload at
  // byte 0 of a row, its scales at byte D; the strides below say how far apart consecutive rows are.
  int64_t kv_rows = 0;    // rows per (b, kv head) in storage, >= Sk (the valid keys); 0: Sk
  int64_t k_stride = 0;   // bytes from one K payload row to the next; 0: D
  int64_t ks_stride = 0;  // halves from one K scale row to the next; 0: D/32
  int64_t v_stride = 0;   // elements (bytes for q8_0 / q4_0 / q6_0) from one V row to the next; 0: the dense row
  int64_t vs_stride = 0;  // halves from one V scale row to the next; 0: D/32

  // GPU decode / split_k over strided rows only: batch row b's valid keys are read on the device, dev_seqlens[b] + 1
  // (GroupQueryAttention's seqlens_k), clamped to [1, Sk]; Sk is then the most any row may have and sizes the plan.
  // The host never learns the lengths, so the launch is the same for every step (a CUDA graph can replay it).
  const int32_t* dev_seqlens = nullptr;
  // GPU: enqueued right after a kernel that writes Q and the keys from Sk - Sq on (Dot4GroupQueryAttention's
  // prologue). The tensor-core decode then launches as that kernel's programmatic dependent (sm_90) and starts
  // moving the older keys before it is done.
  bool follows_prologue = false;

  Route route = Route::kAuto;       // resolved (never kAuto) when a backend is called
  int64_t n_splits = 1;             // split_k only: key splits per (b, kv head)

  int64_t group() const { return Hq / Hkv; }
  int64_t head_rows() const { return kv_rows ? kv_rows : Sk; }
  int64_t k_row() const { return k_stride ? k_stride : D; }
  int64_t ks_row() const { return ks_stride ? ks_stride : D / 32; }
  int64_t v_dense_row() const { return payload_bytes(D, v_format); }
  int64_t v_row() const { return v_stride ? v_stride : v_dense_row(); }
  int64_t vs_row() const { return vs_stride ? vs_stride : D / 32; }
  bool dense_kv() const {
    return head_rows() == Sk && k_row() == D && ks_row() == D / 32 && v_row() == v_dense_row() && vs_row() == D / 32;
  }
};

// Picks the route for `auto`: Sq > 8 -> prefill; Sq <= 8 and Sk < split_k_min_keys -> decode; else split_k.
Route choose_route(const AttentionParams& p, int64_t split_k_min_keys);

// FlashDecoding split count: enough (b, kv head, split) work items to fill `parallel_units` x `waves`,
// never splits shorter than `min_keys_per_split` keys. Sized by the valid key length Sk.
int64_t choose_splits(int64_t batch_heads, int64_t sk, int64_t parallel_units, int64_t waves,
                      int64_t min_keys_per_split);

}  // namespace dot4attn
