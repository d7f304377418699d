// GPU backend of Dot4GroupQueryAttention (CUDA or HIP through gpu/vendor.h). Everything is enqueued on the
// stream. A decode step (S = 1) reads every batch row's length (seqlens_k) on the device, so its launches do not
// depend on the lengths and a CUDA graph can replay them; a prompt's lengths come to the host first (cache_op.cc).
//   1. Not shared: the past rows are copied into present (one 2D copy per cache), the rest zeroed.
//   2. prologue_kernel: one group of 32 lanes per row of a new token -- K and V heads are normed / rotated and
//      packed straight into their cache rows (the contract's math: float32, exact division, half-even), Q heads
//      are normed / rotated into the per-batch query scratch [Hq][q_rows(b)][D] of T.
//   3. Attention over each batch row's own valid keys, from the strided cache rows: decode, one launch for every
//      row (planned for total_sequence_length, each row clamped to its own length on the device); a prompt, one
//      launch per run of rows sharing a length (cache_batch_runs), each planned per call. On sm_90 the first
//      tensor-core decode launch is the prologue's programmatic dependent: its blocks start streaming the older key
//      chunks while the prologue runs (AttentionParams::follows_prologue).
//   4. out_kernel: [B][Hq][q_rows][D] -> [B, S, Hq * D] (decode writes its output in place: S = 1 is the same
//      layout), zeros for the padding rows of a first prompt.
#include <algorithm>
#include <vector>

#include "attention/attention_backends.h"
#include "cache/cache_attention.h"
#include "cache/cache_backends.h"
#include "gpu/vendor.h"
#include "pack/v_block_gpu.cuh"

namespace dot4attn {
namespace {

constexpr int kThreads = 256;
constexpr int kGroups = kThreads / 32;  // rows per block
constexpr int kMaxBatch = 128;          // batch rows per prologue launch (their lengths travel as kernel arguments)

struct Prologue {
  const void* q;
  const void* k;
  const void* v;
  const void* cos;
  const void* sin;
  const void* q_norm;
  const void* k_norm;
  void* q_rows;
  uint8_t* k_cache;
  uint8_t* v_cache;
  int64_t S, Hq, Hkv, L, rot_half, b0, nb;
  int64_t n_rows;   // B Hkv L: the token rows of the caches (the tight layout's scale runs start after n_rows payloads)
  CacheRowMap map;  // the rows' widths and where a token's parts go (cache_layout.h)
  int D;
  float q_eps, k_eps;  // the Q and K norms' epsilons
  int half, packed, rotary, interleaved;
  int v_levels;  // V's format: 0 q8_0, 8 q4_0, 32 q6_0 (half its levels)
  int past[kMaxBatch], q_rows_of[kMaxBatch];
  // Decode with device lengths (CacheParams::dev_seqlens): row b's token goes to position seqlens[b] (its length
  // minus one, clamped to [0, total - 1], as the attention clamps it); past[] is then unused.
  const int32_t* seqlens;
  int64_t total;
};

__device__ __forceinline__ int64_t token_start(const Prologue& a, int64_t bl) {
  if (a.seqlens == nullptr) return a.past[bl];
  const int64_t p = a.seqlens[a.b0 + bl];
  return p < 0 ? 0 : p > a.total - 1 ? a.total - 1 : p;
}

__device__ __forceinline__ float load_t(const void* p, int half, int64_t i) {
  return half ? gpu::h2f(static_cast<const uint16_t*>(p)[i]) : static_cast<const float*>(p)[i];
}

__device__ __forceinline__ float group32_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += gpu::shfl_xor(v, o);
  return v;
}

// One value of a rotated pair, as the CPU evaluates it: the pair's first a*c - b*s, its second b*c + a*s (x: this
// value, other: its partner, a = the first of the pair).
__device__ __forceinline__ float rotated(float x, float other, float c, float sn, bool first) {
  return first ? __fsub_rn(__fmul_rn(x, c), __fmul_rn(other, sn)) : __fadd_rn(__fmul_rn(x, c), __fmul_rn(other, sn));
}

// Rotate-half with rot_half = 32 kStep: x[j] and x[j + kStep] are a pair (one cos / sin load for both).
template <int kStep>
__device__ __forceinline__ void rotate_half_step(float (&x)[kMaxHeadDim / 32], const Prologue& a, int64_t pos,
                                                 int lane) {
  const int64_t R = 32 * kStep;
#pragma unroll
  for (int j = 0; j < kStep; ++j) {
    const int64_t k = pos * R + 32 * j + lane;
    const float c = load_t(a.cos, a.half, k), sn = load_t(a.sin, a.half, k);
    const float lo = x[j], hi = x[j + kStep];
    x[j] = rotated(lo, hi, c, sn, true);
    x[j + kStep] = rotated(hi, lo, c, sn, false);
  }
}

// One row (a token's head) per group of 32 lanes, value 32 j + lane in lane `lane`'s x[j]. The pair partner of a
// rotation is in the same lane (rotate-half with rot_half a multiple of 32: x[j +- rot_half / 32]) or the
// neighbouring one (interleaved: lane ^ 1), so the common layouts rotate in registers; another rot_half goes
// through the group's own row of shared memory.
template <bool kInterleaved, bool kInLanes>
__device__ __forceinline__ void rotate_row(float (&x)[kMaxHeadDim / 32], float* row, const Prologue& a, int64_t pos,
                                           int lane) {
  const int nb = a.D / 32;
  const int R = int(a.rot_half);
  if (kInterleaved) {
#pragma unroll
    for (int j = 0; j < kMaxHeadDim / 32; ++j) {
      if (j >= nb) break;
      const float other = gpu::shfl_xor(x[j], 1);  // every lane of the group shuffles
      const int i = 32 * j + lane;
      if (i >= 2 * R) continue;
      const float c = load_t(a.cos, a.half, pos * R + (i >> 1)), sn = load_t(a.sin, a.half, pos * R + (i >> 1));
      x[j] = rotated(x[j], other, c, sn, (lane & 1) == 0);
    }
  } else if (kInLanes) {
    switch (R / 32) {  // the partner of x[j] (j < R / 32) is x[j + R / 32]: a constant step keeps x in registers
      case 1: rotate_half_step<1>(x, a, pos, lane); break;
      case 2: rotate_half_step<2>(x, a, pos, lane); break;
      case 3: rotate_half_step<3>(x, a, pos, lane); break;
      default: rotate_half_step<4>(x, a, pos, lane); break;  // 2 rot_half <= D <= 256
    }
  } else {
    gpu::warp_sync();  // the group's previous row is read
#pragma unroll
    for (int j = 0; j < kMaxHeadDim / 32; ++j)
      if (j < nb) row[32 * j + lane] = x[j];
    gpu::warp_sync();
#pragma unroll
    for (int j = 0; j < kMaxHeadDim / 32; ++j) {
      if (j >= nb) break;
      const int i = 32 * j + lane;
      if (i >= 2 * R) continue;
      const bool first = i < R;
      const int k = first ? i : i - R, partner = first ? i + R : i - R;
      const float c = load_t(a.cos, a.half, pos * R + k), sn = load_t(a.sin, a.half, pos * R + k);
      x[j] = rotated(x[j], row[partner], c, sn, first);
    }
  }
}

// I: the item index type, uint32_t where the launch's items fit (a 64-bit division is a ~70-instruction routine,
// paid per row: with it the index decode, not the row's work or its bytes, set this kernel's pace). Items go
// token fastest, so a block's groups take consecutive tokens of one head: its Q rows and cache rows are one
// contiguous run each. The loop strides by the grid (grid_for caps the blocks): every item is done at any size.
template <typename I, int kRot>  // kRot: 0 none, 1 rotate-half in lanes, 2 interleaved, 3 through shared memory
__global__ void __launch_bounds__(kThreads) prologue_kernel(Prologue a) {
  __shared__ float rows[kGroups][kMaxHeadDim];
  // The decode that follows may start now (AttentionParams::follows_prologue): it streams the older keys while this
  // kernel runs and waits for its completion before reading Q and the new rows.
  gpu::pdl_launch_dependents();
  const int grp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const I per_token = I(a.Hq + 2 * a.Hkv), S = I(a.S), Hkv = I(a.Hkv);
  const I tokens = I(a.nb) * S;
  const I n_items = tokens * per_token;
  const int nb = a.D / 32;
  for (I item = I(blockIdx.x) * kGroups + grp; item < n_items; item += I(gridDim.x) * kGroups) {
    const I slot = item / tokens, token = item - slot * tokens;
    const I bl = token / S, s = token - bl * S;
    const int64_t b = a.b0 + int64_t(bl);
    const int kind = slot < Hkv ? 1 : slot < 2 * Hkv ? 2 : 0;  // 1 K, 2 V, 0 Q
    const int64_t h = kind == 1 ? slot : kind == 2 ? slot - Hkv : slot - 2 * Hkv;
    if (kind == 0 && int64_t(s) >= a.q_rows_of[bl]) continue;  // a padding row's Q: nothing reads it
    const int64_t pos = token_start(a, bl) + int64_t(s);

    float x[kMaxHeadDim / 32];
    const void* src = kind == 0 || a.packed ? a.q : kind == 1 ? a.k : a.v;
    int64_t off;
    if (a.packed) {
      const int64_t first = kind == 0 ? 0 : kind == 1 ? a.Hq : a.Hq + a.Hkv;
      off = ((b * a.S + int64_t(s)) * int64_t(per_token) + first + h) * a.D;
    } else {
      off = ((b * a.S + int64_t(s)) * (kind == 0 ? a.Hq : a.Hkv) + h) * a.D;
    }
#pragma unroll
    for (int j = 0; j < kMaxHeadDim / 32; ++j)
      if (j < nb) x[j] = load_t(src, a.half, off + 32 * j + lane);
    const void* w = kind == 0 ? a.q_norm : kind == 1 ? a.k_norm : nullptr;
    if (w) {
      float ss = 0.f;
#pragma unroll
      for (int j = 0; j < kMaxHeadDim / 32; ++j)
        if (j < nb) ss += x[j] * x[j];
      ss = group32_sum(ss);
      const float inv = 1.f / sqrtf(gpu::div_rn(ss, float(a.D)) + (kind == 0 ? a.q_eps : a.k_eps));
#pragma unroll
      for (int j = 0; j < kMaxHeadDim / 32; ++j)
        if (j < nb) x[j] = __fmul_rn(__fmul_rn(x[j], inv), load_t(w, a.half, 32 * j + lane));
    }
    if (kRot != 0 && kind != 2) rotate_row<kRot == 2, kRot == 1>(x, rows[grp], a, pos, lane);
    if (kind == 0) {
      const int64_t qr = a.q_rows_of[bl];
      const int64_t base = b * a.Hq * a.S * a.D + (h * qr + int64_t(s)) * a.D;
#pragma unroll
      for (int j = 0; j < kMaxHeadDim / 32; ++j) {
        if (j >= nb) break;
        if (a.half) static_cast<uint16_t*>(a.q_rows)[base + 32 * j + lane] = gpu::f2h(x[j]);
        else static_cast<float*>(a.q_rows)[base + 32 * j + lane] = x[j];
      }
      continue;
    }
    const int lv = kind == 2 ? a.v_levels : 0;  // 0: q8_0 (K always)
    const CacheRowMap& m = a.map;
    const int64_t row_bytes = kind == 1 ? m.k_row : m.v_row;
    const int64_t token_row = (b * a.Hkv + h) * a.L + pos;
    // this part's payload (rows / pair: its row's start) and scales where the layout puts them (cache_layout.h):
    // V's after V's payload, K's after K's (rows) or in the V row (pair), each in a run of its own (tight)
    uint8_t* row = kind == 1 ? a.k_cache + m.k_pay_at(token_row) : a.v_cache + m.v_pay_at(token_row);
    uint8_t* scales = kind == 2 ? a.v_cache + m.v_sc_at(token_row, a.n_rows)
                                : (m.k_scales_in_v ? a.v_cache : a.k_cache) + m.k_sc_at(token_row, a.n_rows);
#pragma unroll
    for (int j = 0; j < kMaxHeadDim / 32; ++j) {
      if (j >= nb) break;
      const float amax = gpu::group32_max(gpu::abs_or_inf(x[j]));  // the non-finite policy, as PackK / PackV
      float sc;
      // lv is uniform in the group (kind and a.v_levels are), so every lane reaches signed_block_scale_half's
      // shuffles
      const uint16_t sh = lv ? gpu::signed_block_scale_half(x[j], amax, float(lv), sc)
                             : gpu::block_scale_half(amax, 127.f, sc);
      float q = sc == 0.f ? 0.f : rintf(gpu::div_rn(x[j], sc));
      q = lv ? fminf(fmaxf(q, -float(lv)), float(lv) - 1.f) : fminf(fmaxf(q, -127.f), 127.f);
      if (lv == 8) {
        gpu::store_q4_block(row + 16 * j, lane, int(q) + 8);
      } else if (lv == 32) {
        gpu::store_q6_block(row + 24 * j, lane, int(q) + 32);
      } else {
        row[32 * j + lane] = uint8_t(int8_t(int(q)));
      }
      if (lane == 0) {
        scales[2 * j] = uint8_t(sh & 0xff);
        scales[2 * j + 1] = uint8_t(sh >> 8);
      }
    }
    // zeros past this row's parts (in the pair layout the V row's tail, after K's scales, which the K group
    // writes; the tight layout has none)
    if (!m.split)
      for (int64_t i = (kind == 1 ? m.k_zero_from : m.v_zero_from) + lane; i < row_bytes; i += 32) row[i] = 0;
  }
}

template <typename I>
void launch_prologue(const Prologue& a, unsigned grid, gpuStream_t s) {
  if (!a.rotary) prologue_kernel<I, 0><<<grid, kThreads, 0, s>>>(a);
  else if (a.interleaved) prologue_kernel<I, 2><<<grid, kThreads, 0, s>>>(a);
  else if (a.rot_half > 0 && a.rot_half % 32 == 0) prologue_kernel<I, 1><<<grid, kThreads, 0, s>>>(a);
  else prologue_kernel<I, 3><<<grid, kThreads, 0, s>>>(a);
}

// out[b, s, h * D + d] = rows[b][h][s][d] for s < q_rows(b), else 0. One thread per 16 bytes of a row (8 float16
// or 4 float32 values: D is a multiple of 32), so the index arithmetic is paid once per 16 bytes, not per value.
struct OutArgs {
  const void* rows;
  void* out;
  int64_t S, Hq, pieces, b0, nb;  // pieces: 16-byte pieces of a row of D values
  int q_rows_of[kMaxBatch];
};

__global__ void __launch_bounds__(kThreads) out_kernel(OutArgs a) {
  const int64_t n = a.nb * a.S * a.Hq * a.pieces;
  const uint4* rows = static_cast<const uint4*>(a.rows);
  uint4* out = static_cast<uint4*>(a.out);
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads) {
    // r: the row (bl, h, s), s fastest, so a warp's reads are one run of a head's rows and its writes land Hq x D
    // values apart. Walking the output in order (h fastest) read the heads' rows S x D values apart (8 MB in a 32k
    // chunk of the 7B shape): 1.50 ms for that chunk's 470 MB on an H100, 0.195 ms now.
    const int64_t p = i % a.pieces, r = i / a.pieces;
    const int64_t s = r % a.S, h = (r / a.S) % a.Hq, bl = r / (a.S * a.Hq);
    const int64_t b = a.b0 + bl, qr = a.q_rows_of[bl];
    const int64_t dst = ((b * a.S + s) * a.Hq + h) * a.pieces + p;
    const int64_t src = (b * a.Hq * a.S + h * qr + s) * a.pieces + p;
    out[dst] = s < qr ? rows[src] : make_uint4(0u, 0u, 0u, 0u);
  }
}

unsigned grid_for(int64_t n, int64_t per_block) {
  const int64_t g = (n + per_block - 1) / per_block;
  return unsigned(std::max<int64_t>(1, std::min<int64_t>(g, 1 << 20)));
}

size_t round_up(size_t n) { return (n + 255) / 256 * 256; }

}  // namespace

void cache_seqlens_to_host(const int32_t* dev, int64_t n, int32_t* host, void* stream) {
  if (n <= 0) return;
  auto s = static_cast<gpuStream_t>(stream);
  D4A_GPU_CHECK(gpuMemcpyAsync(host, dev, size_t(n) * sizeof(int32_t), gpuMemcpyDeviceToHost, s));
  D4A_GPU_CHECK(gpuStreamSynchronize(s));
}

CacheGpuWork cache_gpu_plan(const CacheParams& c) {
  CacheGpuWork w;
  const size_t elem = c.half ? 2 : 4;
  w.q_bytes = round_up(size_t(c.B * c.Hq * c.S * c.D) * elem);
  w.out_bytes = c.S == 1 ? 0 : w.q_bytes;  // decode writes the op's output directly
  w.runs = cache_batch_runs(c);
  w.plans.reserve(w.runs.size());
  for (const BatchRun& r : w.runs) {
    w.plans.push_back(attention_gpu_plan(cache_attention_params(c, r, nullptr, nullptr)));
    w.split_bytes = std::max(w.split_bytes, round_up(w.plans.back().scratch_bytes));
  }
  return w;
}

void cache_attention_gpu(const CacheParams& c, const CacheGpuWork& l, void* scratch, void* stream) {
  auto s = static_cast<gpuStream_t>(stream);
  const std::vector<gpu::GpuPlan>& plans = l.plans;
  char* base = static_cast<char*>(scratch);
  void* q_rows = base;
  void* out_rows = c.S == 1 ? c.out : base + l.q_bytes;
  void* split = base + l.q_bytes + l.out_bytes;

  if (!c.shared()) {  // rows and pair (cache_op.cc refuses an unshared tight cache)
    const int64_t rows = c.B * c.Hkv;
    for (int t = 0; t < 2; ++t) {
      const int64_t rb = t == 0 ? c.map.k_row : c.map.v_row;
      uint8_t* dst = t == 0 ? c.present_k : c.present_v;
      const uint8_t* src = t == 0 ? c.past_k : c.past_v;
      if (c.past_rows > 0)
        D4A_GPU_CHECK(gpuMemcpy2DAsync(dst, size_t(c.L * rb), src, size_t(c.past_rows * rb), size_t(c.past_rows * rb),
                                       size_t(rows), gpuMemcpyDeviceToDevice, s));
      if (c.L > c.past_rows)
        D4A_GPU_CHECK(gpuMemset2DAsync(dst + c.past_rows * rb, size_t(c.L * rb), 0, size_t((c.L - c.past_rows) * rb),
                                       size_t(rows), s));
    }
  }

  for (int64_t b0 = 0; b0 < c.B; b0 += kMaxBatch) {
    Prologue a{};
    a.q = c.q; a.k = c.k; a.v = c.v; a.cos = c.cos; a.sin = c.sin; a.q_norm = c.q_norm; a.k_norm = c.k_norm;
    a.q_rows = q_rows; a.k_cache = c.present_k; a.v_cache = c.present_v;
    a.S = c.S; a.Hq = c.Hq; a.Hkv = c.Hkv; a.L = c.L; a.map = c.map; a.rot_half = c.rot_half;
    a.n_rows = c.B * c.Hkv * c.L;
    a.b0 = b0; a.nb = std::min<int64_t>(kMaxBatch, c.B - b0); a.D = c.D;
    a.q_eps = c.q_norm_eps; a.k_eps = c.k_norm_eps;
    a.half = c.half; a.packed = c.packed_qkv; a.rotary = c.rotary; a.interleaved = c.interleaved;
    a.v_levels = c.v_format == VFormat::kQ4_0 ? 8 : c.v_format == VFormat::kQ6_0 ? 32 : 0;
    for (int64_t i = 0; i < a.nb; ++i) {
      a.past[i] = int(c.past[b0 + i]);
      a.q_rows_of[i] = int(c.q_rows(b0 + i));
    }
    a.seqlens = c.dev_seqlens;
    a.total = c.total.empty() ? 0 : c.total[0];  // device lengths: every total[b] is total_sequence_length
    const int64_t items = a.nb * c.S * (c.Hq + 2 * c.Hkv);
    const unsigned grid = grid_for(items, kGroups);
    // uint32_t indices while the items and the grid's stride past them fit
    if (items + int64_t(grid) * kGroups < (int64_t(1) << 32)) launch_prologue<uint32_t>(a, grid, s);
    else launch_prologue<uint64_t>(a, grid, s);
    D4A_GPU_CHECK(gpuGetLastError());
  }

  for (size_t i = 0; i < l.runs.size(); ++i) {
    AttentionParams p = cache_attention_params(c, l.runs[i], q_rows, out_rows);
    p.follows_prologue = i == 0;  // later runs follow the previous run's kernels
    attention_gpu(p, plans[i], split, stream);
  }

  if (c.S == 1) return;
  for (int64_t b0 = 0; b0 < c.B; b0 += kMaxBatch) {
    OutArgs o{};
    o.rows = out_rows; o.out = c.out; o.S = c.S; o.Hq = c.Hq; o.pieces = c.D * (c.half ? 2 : 4) / 16; o.b0 = b0;
    o.nb = std::min<int64_t>(kMaxBatch, c.B - b0);
    for (int64_t i = 0; i < o.nb; ++i) o.q_rows_of[i] = int(c.q_rows(b0 + i));
    out_kernel<<<grid_for(o.nb * c.S * c.Hq * o.pieces, kThreads), kThreads, 0, s>>>(o);
    D4A_GPU_CHECK(gpuGetLastError());
  }
}

}  // namespace dot4attn
