// Dot4GroupQueryAttention: the op struct. It takes com.microsoft.GroupQueryAttention's inputs and attributes at
// GroupQueryAttention's positions and names (ONNX Runtime 1.32's schema), with the float caches replaced by packed
// ones (cache_layout.h), validates them, and hands CacheParams to a backend. What GroupQueryAttention has and this
// op does not compute (sliding windows, softcap, sinks, biases, ORT's quantized caches, ...) is refused by name
// when the session is created, never ignored: a GroupQueryAttention node whose domain / op_type was changed either
// computes GroupQueryAttention's numbers (up to the cache's quantization) or does not load.
#include "cache/cache_op.h"

#include <cmath>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "cache/cache_backends.h"
#include "cache/cache_layout.h"
#include "common/custom_op.h"
#include "common/errors.h"
#include "common/kernel_io.h"
#include "common/ort_api.h"

namespace dot4attn {
namespace {

constexpr const char* kOp = "Dot4GroupQueryAttention";

// GroupQueryAttention's inputs, by position and name.
enum Input {
  kQuery, kKey, kValue, kPastK, kPastV, kSeqlens, kTotal, kCos, kSin, kPositionIds, kAttnBias, kHeadSink, kKScale,
  kVScale, kQNorm, kKNorm, kQuerySeqlens, kNumInputs
};
const char* const kInputNames[kNumInputs] = {
    "query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length", "cos_cache",
    "sin_cache", "position_ids", "attention_bias", "head_sink", "k_scale", "v_scale", "q_norm_weight",
    "k_norm_weight", "query_seqlens"};
constexpr int kNumOutputs = 4;  // output, present_key, present_value, output_qk (refused)
const char* const kOutputNames[kNumOutputs] = {"output", "present_key", "present_value", "output_qk"};

// GroupQueryAttention inputs the op does not implement, and what each would have asked for.
struct Unsupported {
  int input;
  const char* what;
};
constexpr const char* kOrtQuantized =
    "ONNX Runtime's quantized caches: this op's caches are its own packed rows, their scales inside (v_format)";
constexpr Unsupported kUnsupportedInputs[] = {
    {kPositionIds, "explicit positions: the op takes them from seqlens_k and total_sequence_length. A model "
                   "rewritten by an older dot4attn has its q_norm_weight here, now input 14: rewrite it again"},
    {kAttnBias, "an additive attention bias or mask: the op attends causally over each row's valid keys"},
    {kHeadSink, "attention sinks"},
    {kKScale, kOrtQuantized},
    {kVScale, kOrtQuantized},
    {kQuerySeqlens, "right-padded query chunks"},
};

struct Attrs {
  int64_t num_heads = 0, kv_num_heads = 0;
  float scale = 0.f;  // 0: 1/sqrt(D), as GroupQueryAttention
  bool rotary = false, interleaved = false;
  VFormat v_format = VFormat::kQ8_0;
  CacheLayout layout = CacheLayout::kRows;
  float q_norm_eps = 1e-6f, k_norm_eps = 1e-6f;
  int64_t split_k_min_keys = 2048;
};

const char* layout_note(CacheLayout l) {
  return l == CacheLayout::kPair    ? ", cache_layout 'pair': both caches D bytes wide"
         : l == CacheLayout::kTight ? ", cache_layout 'tight': rows without padding"
                                    : "";
}

template <class... A>
[[noreturn]] void bad_input(int i, const A&... a) {
  fail(kOp, "input '", kInputNames[i], "' (", i, "): ", a...);
}

[[noreturn]] void unsupported_input(const Unsupported& u) { bad_input(u.input, "not supported (", u.what, ")"); }

void expect_dtype(int i, const TensorIn& t, ONNXTensorElementDataType want) {
  if (t.type != want) bad_input(i, "expected dtype ", dtype_name(want), ", got ", dtype_name(t.type));
}

class CacheKernel : public Kernel {
 public:
  CacheKernel(const Attrs& a, Ep ep) : a_(a), ep_(ep) {}

  void compute(OrtKernelContext* ctx) override {
    TensorIn in[kNumInputs];
    const size_t n = input_count(ctx);
    for (size_t i = 0; i < kNumInputs && i < n; ++i) in[i] = get_input(ctx, i);
    // create_cache_kernel refused these already from the node; kept for a runtime that would not tell it.
    for (const Unsupported& u : kUnsupportedInputs)
      if (in[u.input].present) unsupported_input(u);
    CacheParams c;
    validate(ctx, in, &c);
    const std::vector<int64_t> cache_shape{c.B, c.Hkv, c.L, c.map.k_row};
    c.out = get_output(ctx, 0, {c.B, c.S, c.Hq * c.D});
    c.present_k = static_cast<uint8_t*>(get_output(ctx, 1, cache_shape));
    [[maybe_unused]] OrtValue* pv = nullptr;
    c.present_v = static_cast<uint8_t*>(get_output(ctx, 2, {c.B, c.Hkv, c.L, c.map.v_row}, &pv));
    if ((c.present_k == c.past_k) != (c.present_v == c.past_v))
      fail(kOp, "outputs 'present_key' and 'present_value': either both share their past input's buffer or "
                "neither does");
    if (c.map.split && !c.shared())
      fail(kOp, "cache_layout 'tight' needs outputs 'present_key' / 'present_value' that share their past input's "
                "buffer (onnxruntime-genai's past_present_share_buffer): its tokens' bytes are not in their rows, "
                "so a runtime's row or batch copies of an unshared cache (rewind, beam reorder) would mix them; got "
                "present buffers of their own (use cache_layout 'rows' or 'pair' there)");
    if (c.B == 0 || c.S == 0) return;
    if (ep_ == Ep::kCpu) {
      cache_attention_cpu(c, ctx);
      return;
    }
#if defined(DOT4ATTN_WITH_GPU)
    run_gpu(ctx, c, pv);
#else
    fail(kOp, "this build of dot4attn has no GPU kernels");
#endif
  }

 private:
  void validate(OrtKernelContext* ctx, const TensorIn* in, CacheParams* c) const {
    for (int i : {kQuery, kPastK, kPastV, kSeqlens, kTotal})
      if (!in[i].present) bad_input(i, "is required but missing");
    const TensorIn &q = in[kQuery], &k = in[kKey], &v = in[kValue];
    if (q.type != F32 && q.type != F16) bad_input(kQuery, "expected dtype float32 or float16, got ", dtype_name(q.type));
    if (q.shape.size() != 3) bad_input(kQuery, "expected rank 3 [B, S, hidden], got shape ", shape_str(q.shape));
    const int64_t Hq = a_.num_heads, Hkv = a_.kv_num_heads;
    const int64_t B = q.shape[0], S = q.shape[1];
    c->packed_qkv = !k.present;
    if (k.present != v.present)
      fail(kOp, "inputs 'key' (1) and 'value' (2): give both (separate Q, K, V) or neither (packed QKV in query)");
    const int64_t heads = c->packed_qkv ? Hq + 2 * Hkv : Hq;
    if (q.shape[2] % heads != 0)
      bad_input(kQuery, "last dim ", q.shape[2], " is not a multiple of ", heads,
                c->packed_qkv ? " heads (num_heads + 2 * kv_num_heads, packed QKV)" : " heads (num_heads)");
    const int64_t D = q.shape[2] / heads;
    if (!head_dim_ok(D)) bad_input(kQuery, "head dim D = ", D, " must be a multiple of 32 in [32, 256]");
    if (!c->packed_qkv) {
      for (int i : {kKey, kValue}) {
        expect_dtype(i, in[i], q.type);
        if (in[i].shape != std::vector<int64_t>{B, S, Hkv * D})
          bad_input(i, "expected shape [B, S, kv_num_heads * D] = ", shape_str({B, S, Hkv * D}), ", got ",
                    shape_str(in[i].shape));
      }
    }
    c->B = B; c->S = S; c->Hq = Hq; c->Hkv = Hkv; c->D = int(D);
    c->half = q.type == F16;
    c->v_format = a_.v_format;
    c->scale = a_.scale > 0.f ? a_.scale : 1.f / std::sqrt(float(D));
    c->q = q.data;
    c->k = k.present ? k.data : nullptr;
    c->v = v.present ? v.data : nullptr;
    c->map = cache_row_map(D, a_.v_format, a_.layout);
    const char* what_k = a_.layout == CacheLayout::kPair ? "K payloads of D = " : "packed K rows of D = ";

    const TensorIn &pk = in[kPastK], &pv = in[kPastV];
    expect_dtype(kPastK, pk, U8);
    expect_dtype(kPastV, pv, U8);
    if (pk.shape.size() != 4 || pk.shape[0] != B || pk.shape[1] != Hkv || pk.shape[3] != c->map.k_row)
      bad_input(kPastK, "expected shape [B, kv_num_heads, rows, ", c->map.k_row, "] with B = ", B, ", kv_num_heads = ",
                Hkv, " (", what_k, D, layout_note(a_.layout), "), got ", shape_str(pk.shape));
    if (pv.shape != std::vector<int64_t>{B, Hkv, pk.shape[2], c->map.v_row})
      bad_input(kPastV, "expected shape ", shape_str({B, Hkv, pk.shape[2], c->map.v_row}), " (packed ",
                vformat_name(a_.v_format), " V rows of D = ", D, layout_note(a_.layout),
                "), got ", shape_str(pv.shape));
    c->past_k = static_cast<const uint8_t*>(pk.data);
    c->past_v = static_cast<const uint8_t*>(pv.data);
    c->past_rows = pk.shape[2];

    const TensorIn &sl = in[kSeqlens], &tl = in[kTotal];
    expect_dtype(kSeqlens, sl, I32);
    if (sl.shape != std::vector<int64_t>{B}) bad_input(kSeqlens, "expected shape [B] = [", B, "], got ", shape_str(sl.shape));
    expect_dtype(kTotal, tl, I32);
    if (tl.numel() != 1) bad_input(kTotal, "expected one value, got shape ", shape_str(tl.shape));
    const int64_t total_len = *static_cast<const int32_t*>(tl.data);
    if (total_len < S) bad_input(kTotal, "total_sequence_length ", total_len, " is below the ", S, " new tokens");
    c->first_prompt = S == total_len;
    c->L = std::max(c->past_rows, total_len);
    c->total.resize(B);
    c->past.resize(B);
    // seqlens_k lives where the EP computes it (on a GPU: the device). A GPU decode step (S = 1) leaves it there:
    // the kernels read each row's length, the host plans for total_sequence_length (the longest row), and the
    // launches are the same at every step, which a CUDA graph needs. Prompts (S > 1) need the lengths on the host
    // (per-row query rows and positions), a few bytes copied with one stream synchronisation.
    std::vector<int32_t> host_lens;
    const int32_t* lens = static_cast<const int32_t*>(sl.data);
    if (ep_ != Ep::kCpu) {
      if (S == 1) {
        lens = nullptr;
        c->dev_seqlens = static_cast<const int32_t*>(sl.data);
      } else {
#if defined(DOT4ATTN_WITH_GPU)
        host_lens.resize(size_t(B));
        cache_seqlens_to_host(static_cast<const int32_t*>(sl.data), B, host_lens.data(), gpu_stream(ctx));
        lens = host_lens.data();
#else
        (void)ctx;
#endif
      }
    }
    for (int64_t b = 0; b < B; ++b) {
      if (lens == nullptr) {  // device lengths: bounds for the host (the kernels clamp seqlens_k[b] + 1 to them)
        c->total[b] = total_len;
        c->past[b] = total_len - 1;
        continue;
      }
      const int64_t t = int64_t(lens[b]) + 1;
      if (t < 1 || t > total_len || (!c->first_prompt && t < S))
        bad_input(kSeqlens, "seqlens_k[", b, "] + 1 = ", t, " must lie in [", c->first_prompt ? 1 : S, ", ",
                  total_len, "] (total_sequence_length ", total_len, ", ", S, " new tokens)");
      c->total[b] = t;
      c->past[b] = c->first_prompt ? 0 : t - S;  // so past[b] + S <= total_len <= L: every new row fits
    }

    c->rotary = a_.rotary;
    c->interleaved = a_.interleaved;
    if (a_.rotary) {
      for (int i : {kCos, kSin}) {
        if (!in[i].present) bad_input(i, "is required when do_rotary = 1");
        expect_dtype(i, in[i], q.type);
        if (in[i].shape.size() != 2 || in[i].shape != in[kCos].shape || in[i].shape[1] < 1 ||
            2 * in[i].shape[1] > D)
          bad_input(i, "expected shape [max_position, rotary_dim / 2] with rotary_dim <= D = ", D,
                    " (and cos, sin alike), got ", shape_str(in[i].shape));
      }
      c->cos = in[kCos].data;
      c->sin = in[kSin].data;
      c->max_pos = in[kCos].shape[0];
      c->rot_half = in[kCos].shape[1];
      int64_t last = 0;
      for (int64_t b = 0; b < B; ++b) last = std::max(last, c->past[b] + S - 1);
      if (last >= c->max_pos)
        bad_input(kCos, "position ", last, " needs more rows than its ", c->max_pos, " (the model's maximum length)");
    }
    for (int i : {kQNorm, kKNorm}) {
      if (!in[i].present) continue;
      expect_dtype(i, in[i], q.type);
      if (in[i].shape != std::vector<int64_t>{D}) bad_input(i, "expected shape [D] = [", D, "], got ", shape_str(in[i].shape));
    }
    c->q_norm = in[kQNorm].present ? in[kQNorm].data : nullptr;
    c->k_norm = in[kKNorm].present ? in[kKNorm].data : nullptr;
    c->q_norm_eps = a_.q_norm_eps;
    c->k_norm_eps = a_.k_norm_eps;
    c->split_k_min_keys = a_.split_k_min_keys;
  }

#if defined(DOT4ATTN_WITH_GPU)
  void run_gpu(OrtKernelContext* ctx, const CacheParams& c, const OrtValue* out) const {
    const CacheGpuWork work = cache_gpu_plan(c);
    with_device_scratch(ctx, out, work.scratch_bytes(),
                        [&](void* scratch) { cache_attention_gpu(c, work, scratch, gpu_stream(ctx)); });
  }
#endif

  Attrs a_;
  Ep ep_;
};

// An attribute of GroupQueryAttention the op does not implement: accepted at the values that switch it off (ONNX
// Runtime 1.32's default first), refused at any other with what it would have asked for.
void int_attr_off(const OrtKernelInfo* info, const char* name, std::initializer_list<int64_t> off, const char* what,
                  const char* supported) {
  const int64_t v = attr_int(info, kOp, name, *off.begin());
  for (int64_t o : off)
    if (v == o) return;
  fail(kOp, "attribute '", name, "' = ", v, ": not supported (", what, "); the op supports ", supported);
}

// ONNX Runtime 1.32's defaults: causal 1, local_window_size -1, softcap 0, smooth_softmax -1, qk_output 0,
// k_quant_type / v_quant_type "NONE", kv_cache_bit_width unset, sliding_window_cache 0.
void check_unimplemented_attrs(const OrtKernelInfo* info) {
  int_attr_off(info, "causal", {1}, "bidirectional attention", "1 (the default: causal)");
  int_attr_off(info, "local_window_size", {-1}, "sliding-window attention", "-1 (the default: no window)");
  const float softcap = attr_float(info, kOp, "softcap", 0.f);
  if (softcap != 0.f)
    fail(kOp, "attribute 'softcap' = ", softcap, ": not supported (softcapped logits); the op supports 0 (the "
              "default: none)");
  int_attr_off(info, "smooth_softmax", {-1, 0}, "smooth softmax",
               "-1 (the default) or 0: a plain softmax");
  int_attr_off(info, "qk_output", {0}, "the attention scores as output 'output_qk'", "0 (the default: none)");
  for (const char* q : {"k_quant_type", "v_quant_type"}) {
    const std::string v = attr_string(info, kOp, q, "NONE");
    if (v != "NONE")
      fail(kOp, "attribute '", q, "' = '", v, "': not supported (", kOrtQuantized, "); the op supports 'NONE' (the "
                "default)");
  }
  int_attr_off(info, "kv_cache_bit_width", {0}, kOrtQuantized, "0 or no attribute (the default)");
  int_attr_off(info, "sliding_window_cache", {0}, "window-sized caches",
               "0 (the default: caches hold the whole sequence)");
}

// The node's optional inputs and outputs the op does not implement, by name: an omitted optional one has an empty
// name (and trailing ones are simply not there). Checked here so that such a model fails when its session is
// created, not at its first run.
void check_node_io(const OrtKernelInfo* info) {
  const std::vector<std::string> in = node_input_names(info), out = node_output_names(info);
  for (const Unsupported& u : kUnsupportedInputs)
    if (size_t(u.input) < in.size() && !in[size_t(u.input)].empty()) unsupported_input(u);
  if (out.size() > 3 && !out[3].empty())
    fail(kOp, "output '", kOutputNames[3], "' (3): not supported (the attention scores; the op has outputs ",
         kOutputNames[0], ", ", kOutputNames[1], " and ", kOutputNames[2], " only)");
}

float norm_epsilon(const OrtKernelInfo* info, const char* name, float fallback) {
  if (!has_attr(info, name)) return fallback;
  const float eps = attr_float(info, kOp, name, fallback);
  if (!(std::isfinite(eps) && eps > 0.f))
    fail(kOp, "attribute '", name, "': expected a finite float > 0, got ", eps);
  return eps;
}

Kernel* create_cache_kernel(const OrtKernelInfo* info, Ep ep) {
  Attrs a;
  a.num_heads = attr_int(info, kOp, "num_heads", 0);
  a.kv_num_heads = attr_int(info, kOp, "kv_num_heads", 0);
  if (a.num_heads < 1 || a.kv_num_heads < 1 || a.num_heads % a.kv_num_heads != 0)
    fail(kOp, "attributes 'num_heads' and 'kv_num_heads': expected positive with num_heads a multiple of "
              "kv_num_heads, got ", a.num_heads, " and ", a.kv_num_heads);
  a.scale = attr_float(info, kOp, "scale", 0.f);
  if (!(std::isfinite(a.scale) && a.scale >= 0.f))
    fail(kOp, "attribute 'scale': expected a finite float >= 0 (0: 1/sqrt(D)), got ", a.scale);
  const int64_t rot = attr_int(info, kOp, "do_rotary", 0), inter = attr_int(info, kOp, "rotary_interleaved", 0);
  if ((rot != 0 && rot != 1) || (inter != 0 && inter != 1))
    fail(kOp, "attributes 'do_rotary' / 'rotary_interleaved': expected 0 or 1, got ", rot, " / ", inter);
  a.rotary = rot == 1;
  a.interleaved = inter == 1;
  const std::string vf = attr_string(info, kOp, "v_format", "q8_0");
  if (!parse_vformat(vf, &a.v_format) || a.v_format == VFormat::kFloat)
    fail(kOp, "attribute 'v_format': expected 'q8_0', 'q4_0' or 'q6_0', got '", vf, "'");
  const std::string lay = attr_string(info, kOp, "cache_layout", "rows");
  if (lay == "rows") a.layout = CacheLayout::kRows;
  else if (lay == "pair") a.layout = CacheLayout::kPair;
  else if (lay == "tight") a.layout = CacheLayout::kTight;
  else fail(kOp, "attribute 'cache_layout': expected 'rows', 'pair' or 'tight', got '", lay, "'");
  if (a.layout == CacheLayout::kPair && !pair_takes_vformat(a.v_format))
    fail(kOp, "attribute 'cache_layout' = 'pair' needs v_format 'q4_0' or 'q6_0' (K and q4_0 / q6_0 V in two rows of "
              "D bytes), got v_format '", vf, "': a q8_0 V cache has K's row width in the 'rows' layout already");
  // qk_norm_epsilon for both norms; q_norm_epsilon / k_norm_epsilon, where given, override it for Q / K (as in
  // ONNX Runtime 1.32's GroupQueryAttention).
  const float qk_eps = attr_float(info, kOp, "qk_norm_epsilon", 1e-6f);
  if (!(std::isfinite(qk_eps) && qk_eps >= 0.f))
    fail(kOp, "attribute 'qk_norm_epsilon': expected a finite float >= 0, got ", qk_eps);
  a.q_norm_eps = norm_epsilon(info, "q_norm_epsilon", qk_eps);
  a.k_norm_eps = norm_epsilon(info, "k_norm_epsilon", qk_eps);
  a.split_k_min_keys = attr_int(info, kOp, "split_k_min_keys", 2048);
  if (a.split_k_min_keys < 1) fail(kOp, "attribute 'split_k_min_keys': expected >= 1, got ", a.split_k_min_keys);
  check_unimplemented_attrs(info);
  check_node_io(info);
  return new CacheKernel(a, ep);
}

}  // namespace

std::vector<OpSpec> cache_op_specs() {
  std::vector<OpSpec> specs;
  for (auto t : {F32, F16}) {
    // query selects T; everything else is checked in compute (our messages, not a bare schema mismatch).
    // total_sequence_length is read on the host (on a GPU EP, ORT copies it: 4 bytes); seqlens_k stays on the
    // device (validate() says why). All of GroupQueryAttention's inputs and outputs are declared, the ones the op
    // does not implement as optional of any type, so that a node carrying one reaches check_node_io's refusal by
    // name instead of a bare "input count" schema error.
    std::vector<IoSpec> in{{t}, {ANY, true}, {ANY, true}, {ANY}, {ANY}, {ANY}, {ANY, false, true}};
    while (in.size() < size_t(kNumInputs)) in.push_back({ANY, true});
    // output_qk is T, as in GroupQueryAttention: declared of any type, ONNX Runtime's type inference gave it int32
    // and failed a node's float output_qk in the graph check, before the op could refuse it by name.
    OpSpec s{kOp, in, {{t}, {U8}, {U8}, {t, true}}, create_cache_kernel, nullptr};
    specs.push_back(s);
  }
  return specs;
}

}  // namespace dot4attn
