// The one Dot4Attention tile kernel, shared by the prefill, decode and split_k routes (CUDA and HIP through
// gpu/vendor.h). A block owns RB "rows" of one (batch, KV head): rows are (grouped query head, query row) pairs
// in that order, so decode puts every grouped head and every query row (g x Sq <= RB) in one block and reads
// each K/V row once for all of them, and prefill takes RB consecutive rows of the same row space. The block
// walks a key range (all keys, or one split for FlashDecoding) in tiles of KT keys (64; 32 where a 64-key tile does
// not fit the device's shared memory, e.g. AMD's 64 KB LDS):
//
//   1. K payload / V payload tiles stream global -> shared through an ST-stage cp.async pipeline (a plain copy
//      where cp.async does not exist); the fp16 scales of the next tile are prefetched into registers.
//   2. logits: one thread per (key, row group); int8 Q (quantized on the fly, float32 scale per 32-block) times
//      int8 K by 4-way dot products (dp4a / sudot4 / sdot4): sum_blocks (sq * sk) * dot, times scale * log2 e.
//      Prefix tiles that every row sees skip all masking; only the causal tail, partial tiles and explicit masks
//      pay for per-element checks.
//   3. online softmax in the log2 domain: TPR threads per row, row max / sum by shuffles inside aligned lane
//      groups (valid on wave32 and wave64).
//   4. P.V in float32: each thread owns RPT rows x 2 columns x one key subset, dequantizes V once per (key,
//      column) and reuses it for its rows; key subsets are summed once at the end.
//   Non-finite V (vendor.h, "The V side"): every tile is checked for V-poisoned keys (a block flag); only tiles that
//   hold one pay for finding them, NaN-ing their logits after masking and zeroing their V in shared memory.
//
// Output: the normalised row in T (decode, prefill), or the unnormalised float32 accumulator with its running
// max / sum (split_k stage 1, merged by split_k_gpu.cu). 64-bit offsets throughout; no host synchronisation.
#pragma once

#include <cstdint>

#include "gpu/vendor.h"

namespace dot4attn {
namespace gpu {

enum VKind : int { kVF32 = 0, kVF16 = 1, kVQ8 = 2, kVQ4 = 3, kVQ6 = 4 };

// q8_0 / q4_0 / q6_0: V rows of integer levels with one float16 scale per 32-block.
__host__ __device__ constexpr bool v_quantized(int vk) { return vk == kVQ8 || vk == kVQ4 || vk == kVQ6; }

constexpr int kThreads = 256;
constexpr int kTileKeys = 64;   // keys per tile (KT), the default; split lengths are multiples of it
constexpr float kLog2e = 1.4426950408889634f;

struct TileArgs {
  int64_t B, Hq, Hkv, Sq, Sk, g;
  int D, nb;
  int vk;            // VKind of `v` (the kernel's VK template argument)
  float scale;       // softmax scale
  float scale_log2;  // scale * log2(e)
  int half;          // T = float16 (query, output, additive mask)
  int causal;
  const void* q;
  const int8_t* k;
  const uint16_t* ks;
  const void* v;
  const uint16_t* vs;
  int mask_kind;  // 0 none, 1 bool, 2 additive (T)
  const void* mask;
  int64_t ms0, ms1, ms2, ms3;
  void* out;
  float* part_acc;  // split_k: [n_splits][B*Hq*Sq][D]; null: write the final output
  float* part_ml;   // split_k: [n_splits][B*Hq*Sq][2] (running max in log2 units, running sum)
  int64_t n_splits, split_len, n_chunks;
  int reverse_chunks;  // causal prefill: heaviest row chunks first
  int nst;             // pipeline stages in use (1 .. ST), chosen from the device's shared memory
  int cluster;         // tensor-core decode (sm_90), nonzero: the n_splits key splits of a (row chunk, batch, KV
                       // head) run as one cluster of n_splits blocks and merge through distributed shared memory
  int64_t split_chunks;  // tensor-core decode's split_k: > 0: even splits of these many 32-key chunks (decode_mma)
  // K / V row layout (AttentionParams; dense: kv_rows = Sk, strides = the row widths). Key j of (b, kv head) bh is
  // row bh * kv_rows + j of every tensor; only keys < Sk are ever read.
  int64_t kv_rows;    // rows per (b, kv head)
  int64_t k_stride;   // bytes between K payload rows (a multiple of 16)
  int64_t ks_stride;  // halves between K scale rows
  int64_t v_stride;   // bytes between V rows, every format (a multiple of 16)
  int64_t vs_stride;  // halves between V scale rows
  // Tensor-core prefill with float16 V (v_scan.cuh): per (b, kv head), nonzero where its V rows may hold a NaN / Inf,
  // from one scan before the prefill; null: every tile checks its V itself.
  const int* v_flags;
  // Valid keys per batch row read on the device (AttentionParams::dev_seqlens: seqlens[b] + 1, clamped to [1, Sk]);
  // null: Sk for every row. Sk, n_splits and split_len are then the plan's, made for the longest row.
  const int32_t* seqlens;
  // Tensor-core decode launched as a programmatic dependent of the kernel that writes Q and keys Sk - Sq .. Sk - 1
  // (AttentionParams::follows_prologue): it waits for that kernel before reading them.
  int pdl;
  // Tensor-core prefill with Q.K on f16 wgmma (k_dequant.cuh): k is then K's float16 copy, and per (b, kv head) a
  // nonzero flag says that head's copy holds K times 2^-8 (its logits are multiplied back by 2^8).
  const int* k_flags;
};

// Keys of batch row b (row_keys) and the length of its key splits (split_keys). With device lengths the host
// planned n_splits for Sk, the most any row has; each row cuts its own keys into that many splits of whole 64-key
// units (a row shorter than the plan leaves trailing splits empty: they write (-inf, 0) partials), so a short row
// is not walked by a few blocks sized for the longest one. The launch is the same for every length (a CUDA graph
// replays it).
__device__ __forceinline__ int64_t row_keys(const TileArgs& a, int64_t b) {
  if (a.seqlens == nullptr) return a.Sk;
  const int64_t t = int64_t(a.seqlens[b]) + 1;
  return t < 1 ? 1 : t > a.Sk ? a.Sk : t;
}

__device__ __forceinline__ int64_t split_keys(const TileArgs& a, int64_t sk) {
  if (a.seqlens == nullptr || sk == a.Sk) return a.split_len;  // the plan's own splits: the same sums as without
  return ((sk + 63) / 64 + a.n_splits - 1) / a.n_splits * 64;
}

__host__ __device__ constexpr int v_row_bytes(int vk, int d) {
  return vk == kVF32 ? 4 * d : vk == kVF16 ? 2 * d : vk == kVQ8 ? d : vk == kVQ6 ? 3 * d / 4 : d / 2;
}

// Shared-memory layout (bytes) of a block with rb rows, rpt rows per P.V thread, st stages of kt-key tiles, identical
// on host (sizing) and device (carving).
struct SmemLayout {
  int kpad, stage_k, stage_v, stage_ks, stage_vs, stage_bytes;
  int off_q, off_qsc, off_kmax, off_mrow, off_alpha, off_rowm, off_rowl, off_s, off_p, off_stages, total;
  int nks, red_bytes;
  __host__ __device__ static int up16(int x) { return (x + 15) & ~15; }
  __host__ __device__ SmemLayout(int vk, int d, int rb, int rpt, int st, int kt) {
    const int nb = d / 32;
    kpad = d + 16;
    stage_k = up16(kt * kpad);
    stage_v = up16(kt * v_row_bytes(vk, d));
    stage_ks = up16(kt * nb * 2);
    stage_vs = v_quantized(vk) ? up16(kt * nb * 2) : 0;
    stage_bytes = stage_k + stage_v + stage_ks + stage_vs;
    int o = 0;
    off_q = o; o += up16(rb * d);
    off_qsc = o; o += up16(rb * nb * 4);
    off_kmax = o; o += up16(rb * 8);
    off_mrow = o; o += up16(rb * 8);
    off_alpha = o; o += up16(rb * 4);
    off_rowm = o; o += up16(rb * 4);
    off_rowl = o; o += up16(rb * 4);
    off_s = o; o += up16(rb * (kt + 4) * 4);
    off_p = o; o += up16(kt * (rb + 4) * 4);
    off_stages = o;
    const int nrg = rb / rpt, ncp = d / 2;
    nks = kThreads / (nrg * ncp);
    if (nks < 1) nks = 1;
    red_bytes = nks * rb * d * 4;
    const int body = st * stage_bytes > red_bytes ? st * stage_bytes : red_bytes;
    total = o + body;
  }
};

template <int VK>
__device__ __forceinline__ void load_v2(const uint8_t* vt, const uint16_t* vst, int j, int cp, int d, int nb,
                                        float& v0, float& v1) {
  if constexpr (VK == kVF32) {
    const float2 w = *reinterpret_cast<const float2*>(vt + int64_t(j) * 4 * d + cp * 8);
    v0 = w.x;
    v1 = w.y;
  } else if constexpr (VK == kVF16) {
    h2x2f(*reinterpret_cast<const uint32_t*>(vt + j * 2 * d + cp * 4), v0, v1);
  } else if constexpr (VK == kVQ8) {
    const uint16_t w = *reinterpret_cast<const uint16_t*>(vt + j * d + cp * 2);
    const float s = h2f(vst[j * nb + (cp >> 4)]);
    v0 = float(int8_t(w & 0xff)) * s;
    v1 = float(int8_t(w >> 8)) * s;
  } else if constexpr (VK == kVQ6) {
    // columns 2 cp, 2 cp + 1 of block cp / 16: low nibbles in byte (cp % 16), high bits in bytes 16 + (2 cp % 8)
    // and the next, at bit 2 ((2 cp % 32) / 8) (common/formats.h)
    const uint8_t* blk = vt + j * (3 * d / 4) + (cp >> 4) * 24;
    const int e = (2 * cp) & 31, sh = 2 * (e >> 3);
    const uint8_t w = blk[cp & 15];
    const float s = h2f(vst[j * nb + (cp >> 4)]);
    v0 = float(int((w & 15) | (((blk[16 + (e & 7)] >> sh) & 3) << 4)) - 32) * s;
    v1 = float(int((w >> 4) | (((blk[17 + (e & 7)] >> sh) & 3) << 4)) - 32) * s;
  } else {
    const uint8_t w = vt[j * (d / 2) + cp];
    const float s = h2f(vst[j * nb + (cp >> 4)]);
    v0 = float(int(w & 15) - 8) * s;
    v1 = float(int(w >> 4) - 8) * s;
  }
}

__device__ __forceinline__ float load_t(const void* p, int64_t i, int half) {
  return half ? h2f(static_cast<const uint16_t*>(p)[i]) : static_cast<const float*>(p)[i];
}

// V-poisoned keys of float V (vendor.h, "The V side"): nf accumulates 0 x every value of 16-byte V pieces (one
// float32, or a float16 pair for float16 V): it stays +-0 while they are finite and turns NaN for good at a NaN /
// +-Inf (0 x Inf = NaN). One FMA per float32 value or float16 pair, where exponent tests take three integer
// operations per 32-bit word (no fast math here: x * 0 is not folded).
template <int VK>
__device__ __forceinline__ uint32_t v_nonfinite_acc(uint32_t nf, const uint4 u) {
  static_assert(VK == kVF32 || VK == kVF16, "float V");
  if constexpr (VK == kVF32) {
    float a = __uint_as_float(nf);
    a = fmaf(__uint_as_float(u.x), 0.f, a);
    a = fmaf(__uint_as_float(u.y), 0.f, a);
    a = fmaf(__uint_as_float(u.z), 0.f, a);
    a = fmaf(__uint_as_float(u.w), 0.f, a);
    return __float_as_uint(a);
  } else {
#if defined(D4A_HIP)
    typedef _Float16 h2_t __attribute__((ext_vector_type(2)));
    const h2_t zero = {_Float16(0), _Float16(0)};
    h2_t a, x;
    __builtin_memcpy(&a, &nf, 4);
    __builtin_memcpy(&x, &u.x, 4); a = x * zero + a;  // v_pk_fma_f16
    __builtin_memcpy(&x, &u.y, 4); a = x * zero + a;
    __builtin_memcpy(&x, &u.z, 4); a = x * zero + a;
    __builtin_memcpy(&x, &u.w, 4); a = x * zero + a;
    __builtin_memcpy(&nf, &a, 4);
    return nf;
#else
    const __half2 zero = __float2half2_rn(0.f);
    __half2 a = *reinterpret_cast<const __half2*>(&nf);
    a = __hfma2(*reinterpret_cast<const __half2*>(&u.x), zero, a);
    a = __hfma2(*reinterpret_cast<const __half2*>(&u.y), zero, a);
    a = __hfma2(*reinterpret_cast<const __half2*>(&u.z), zero, a);
    a = __hfma2(*reinterpret_cast<const __half2*>(&u.w), zero, a);
    return *reinterpret_cast<const uint32_t*>(&a);
#endif
  }
}
// Whether an accumulator of v_nonfinite_acc (started at 0) met a NaN / +-Inf: any bit but the sign bits (+-0).
__device__ __forceinline__ bool v_nonfinite(uint32_t nf) { return (nf & 0x7fff7fffu) != 0u; }

// VK: V storage; DMAX: largest head dim of the class (D <= DMAX, D runtime); RB rows per block; RPT rows per
// thread in P.V; ST the most pipeline stages (a.nst <= ST are used); KT keys per tile (64, or 32: half the stage, logit
// and probability buffers, for devices whose shared memory does not hold a 64-key block: launch_plan.cu, plan_tile).
template <int VK, int DMAX, int RB, int RPT, int ST, int KT = kTileKeys>
__global__ void __launch_bounds__(kThreads) attn_tile_kernel(const TileArgs a) {
  constexpr int NBMAX = DMAX / 32;
  constexpr int RPL = RB / (kThreads / KT);          // logit rows per thread (row groups of kThreads/KT)
  constexpr int TPR = (kThreads / RB) < 32 ? (kThreads / RB) : 32;  // softmax threads per row
  constexpr int KPT = KT / TPR;                      // softmax keys per thread
  constexpr int NRG = RB / RPT;
  constexpr int IMAX = (NRG * (DMAX / 2) + kThreads - 1) / kThreads;  // P.V units per thread
  static_assert((KT == 64 || KT == 32) && RB % (kThreads / KT) == 0 && RB % RPT == 0 && RPT % 4 == 0 && KPT >= 1,
                "tile shape");

  extern __shared__ __align__(16) uint8_t smem[];
  const int D = a.D, nb = a.nb;
  const int nst = a.nst;
  const SmemLayout L(VK, D, RB, RPT, nst, KT);
  int8_t* qs = reinterpret_cast<int8_t*>(smem + L.off_q);
  float* qsc = reinterpret_cast<float*>(smem + L.off_qsc);
  int64_t* kmax = reinterpret_cast<int64_t*>(smem + L.off_kmax);
  int64_t* mrow = reinterpret_cast<int64_t*>(smem + L.off_mrow);
  float* alpha_s = reinterpret_cast<float*>(smem + L.off_alpha);
  float* rowm = reinterpret_cast<float*>(smem + L.off_rowm);
  float* rowl = reinterpret_cast<float*>(smem + L.off_rowl);
  float* S = reinterpret_cast<float*>(smem + L.off_s);   // [RB][KT+4] logits (log2 units)
  float* P = reinterpret_cast<float*>(smem + L.off_p);   // [KT][RB+4] probabilities
  // The last tile (its number + 1) found holding a V-poisoned key: one int in S's padding (column KT of row 0, never
  // a logit); a tile number needs no reset between tiles.
  int* vflag = reinterpret_cast<int*>(S + KT);
  uint8_t* stages = smem + L.off_stages;
  constexpr int SP = KT + 4, PP = RB + 4;

  const int t = threadIdx.x;
  // ---- which (batch, kv head, split, row chunk) -------------------------------------------------------------
  const int64_t bid = int64_t(blockIdx.x);
  int64_t chunk = bid % a.n_chunks;
  const int64_t rest = bid / a.n_chunks;
  const int64_t split = rest % a.n_splits;
  const int64_t bh = rest / a.n_splits;
  if (bh >= a.B * a.Hkv) return;
  if (a.reverse_chunks) chunk = a.n_chunks - 1 - chunk;
  const int64_t b = bh / a.Hkv, hkv = bh % a.Hkv;
  const int64_t sk = row_keys(a, b), slen = split_keys(a, sk);
  const int64_t rows_here = a.g * a.Sq;          // rows of this (b, hkv)
  const int64_t row0 = chunk * RB;
  const int nrows = int(rows_here - row0 < RB ? rows_here - row0 : RB);

  // ---- Q: quantize on the fly (float32 scale per 32-block), row facts -------------------------------------
  for (int it = t; it < RB * nb; it += kThreads) {
    const int r = it / nb, blk = it % nb;
    int8_t* dst = qs + r * D + blk * 32;
    float sc = 0.f;
    if (r < nrows) {
      const int64_t rr = row0 + r, hq = hkv * a.g + rr / a.Sq, i = rr % a.Sq;
      const int64_t base = ((b * a.Hq + hq) * a.Sq + i) * D + blk * 32;
      float x[32];
      float amax = 0.f;
#pragma unroll
      for (int e = 0; e < 32; ++e) {
        x[e] = load_t(a.q, base + e, a.half);
        amax = fmaxf(amax, abs_or_inf(x[e]));
      }
      float dv;
      sc = q_block_scale(amax, dv);  // NaN for a NaN / Inf block (dv = 0: q = 0)
#pragma unroll
      for (int e = 0; e < 32; e += 4) {
        int w = 0;
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          float qv = dv == 0.f ? 0.f : rintf(div_rn(x[e + u], dv));
          qv = fminf(fmaxf(qv, -127.f), 127.f);
          w |= (int(qv) & 0xff) << (8 * u);
        }
        *reinterpret_cast<int*>(dst + e) = w;
      }
    } else {
#pragma unroll
      for (int e = 0; e < 32; e += 4) *reinterpret_cast<int*>(dst + e) = 0;
    }
    qsc[r * nb + blk] = sc;
  }
  for (int r = t; r < RB; r += kThreads) {
    int64_t km = -1, mo = 0;
    if (r < nrows) {
      const int64_t rr = row0 + r, hq = hkv * a.g + rr / a.Sq, i = rr % a.Sq;
      km = a.causal ? sk - a.Sq + i : sk - 1;
      if (km > sk - 1) km = sk - 1;
      mo = b * a.ms0 + hq * a.ms1 + i * a.ms2;
    }
    kmax[r] = km;
    mrow[r] = mo;
  }
  if (t == 0) *vflag = 0;
  __syncthreads();
  int64_t kmin_all = INT64_MAX, kmax_all = -1;
  for (int r = 0; r < nrows; ++r) {
    kmin_all = kmax[r] < kmin_all ? kmax[r] : kmin_all;
    kmax_all = kmax[r] > kmax_all ? kmax[r] : kmax_all;
  }

  // ---- key range of this block -------------------------------------------------------------------------------
  const int64_t kbeg = split * slen;
  int64_t kend = kbeg + slen < sk ? kbeg + slen : sk;
  if (kend > kmax_all + 1) kend = kmax_all + 1;
  const int64_t nkt = kend > kbeg ? (kend - kbeg + KT - 1) / KT : 0;

  const int64_t head_row = bh * a.kv_rows;  // first K/V row of this (b, hkv)
  const int vrow = v_row_bytes(VK, D);
  const int kchunks = D / 16, vchunks = vrow / 16;  // 16-byte pieces per row
  const int8_t* kh = a.k + head_row * a.k_stride;
  const uint8_t* vh = static_cast<const uint8_t*>(a.v) + head_row * a.v_stride;

  // fp16 scale rows are nb halves, a.ks_stride / a.vs_stride apart. Contiguous rows (dense tensors) make a tile's
  // scales one run, copied in 4-byte pieces (cp.async zero-fills what lies past the key range) when that run is
  // 4-byte aligned; rows of even nb at 4-byte aligned starts (strided caches) go row by row in 4-byte pieces;
  // anything else element by element.
  constexpr bool kVq = v_quantized(VK);
  const bool sc_ptr4 = (reinterpret_cast<uintptr_t>(a.ks) & 3) == 0 && (reinterpret_cast<uintptr_t>(a.vs) & 3) == 0;
  const bool sc_run = a.ks_stride == nb && (!kVq || a.vs_stride == nb);
  const int sc_mode = sc_run && sc_ptr4 && ((head_row + kbeg) * nb) % 2 == 0                        ? 0
                      : nb % 2 == 0 && sc_ptr4 && a.ks_stride % 2 == 0 && (!kVq || a.vs_stride % 2 == 0) ? 1
                                                                                                         : 2;
  auto issue_tile = [&](int64_t tile) {
    if (tile < nkt) {
      uint8_t* st = stages + int(tile % nst) * L.stage_bytes;
      const int64_t j0 = kbeg + tile * KT;
      for (int c = t; c < KT * kchunks; c += kThreads) {
        const int j = c / kchunks, part = c % kchunks;
        const bool ok = j0 + j < kend;
        const int8_t* src = kh + (ok ? j0 + j : kbeg) * a.k_stride + part * 16;
        cp_async16(st + j * L.kpad + part * 16, src, ok);
      }
      for (int c = t; c < KT * vchunks; c += kThreads) {
        const int j = c / vchunks, part = c % vchunks;
        const bool ok = j0 + j < kend;
        const uint8_t* src = vh + (ok ? j0 + j : kbeg) * a.v_stride + part * 16;
        cp_async16(st + L.stage_k + j * vrow + part * 16, src, ok);
      }
      const int nvalid = int(kend - j0 < KT ? kend - j0 : KT);  // keys inside the range
      const int valid = nvalid * nb;                             // scale elements inside the range
      uint16_t* kst = reinterpret_cast<uint16_t*>(st + L.stage_k + L.stage_v);
      uint16_t* vst = reinterpret_cast<uint16_t*>(st + L.stage_k + L.stage_v + L.stage_ks);
      if (sc_mode == 0) {
        const int64_t g0 = (head_row + j0) * nb;
        for (int c = t; c < KT * nb / 2; c += kThreads) {
          const int e = 2 * c;
          const int bytes = e + 1 < valid ? 4 : e < valid ? 2 : 0;
          cp_async4(kst + e, a.ks + (bytes ? g0 + e : 0), bytes);
          if constexpr (kVq) cp_async4(vst + e, a.vs + (bytes ? g0 + e : 0), bytes);
        }
      } else if (sc_mode == 1) {
        for (int c = t; c < KT * nb / 2; c += kThreads) {
          const int e = 2 * c, j = e / nb, w = e - j * nb;
          const bool ok = j < nvalid;
          const int64_t row = head_row + j0 + j;
          cp_async4(kst + e, a.ks + (ok ? row * a.ks_stride + w : 0), ok ? 4 : 0);
          if constexpr (kVq) cp_async4(vst + e, a.vs + (ok ? row * a.vs_stride + w : 0), ok ? 4 : 0);
        }
      } else {
        for (int c = t; c < KT * nb; c += kThreads) {
          const int j = c / nb, w = c - j * nb;
          const int64_t row = head_row + j0 + j;
          kst[c] = j < nvalid ? a.ks[row * a.ks_stride + w] : uint16_t(0);
          if constexpr (kVq) vst[c] = j < nvalid ? a.vs[row * a.vs_stride + w] : uint16_t(0);
        }
      }
    }
    cp_async_commit();
  };

  // ---- per-thread state ----------------------------------------------------------------------------------------
  // softmax: row sm_r, lane group of TPR threads
  const int sm_r = t / TPR, sm_sub = t % TPR;
  const bool sm_active = sm_r < RB;
  float m_run = -INFINITY, l_run = 0.f;
  // P.V units
  const int ncp = D / 2;
  const int nks = L.nks;
  const int per_ks = NRG * ncp;
  int u_ks[IMAX], u_rg[IMAX], u_cp[IMAX];
  bool u_ok[IMAX];
  float acc[IMAX][RPT][2];
#pragma unroll
  for (int m = 0; m < IMAX; ++m) {
    const int u = t + m * kThreads;
    u_ks[m] = u / per_ks;
    u_rg[m] = (u % per_ks) / ncp;
    u_cp[m] = u % ncp;
    u_ok[m] = u_ks[m] < nks;
#pragma unroll
    for (int r = 0; r < RPT; ++r) acc[m][r][0] = acc[m][r][1] = 0.f;
  }
  // logits: key lj, rows lr0 + (kThreads/KT) * i
  const int lj = t % KT, lr0 = t / KT;

  // ---- pipeline prologue ---------------------------------------------------------------------------------------
  for (int s = 0; s < nst - 1; ++s) issue_tile(s);

  for (int64_t tile = 0; tile < nkt; ++tile) {
    issue_tile(tile + nst - 1);
    cp_async_wait_stages<ST>(nst);

    uint8_t* st = stages + int(tile % nst) * L.stage_bytes;
    const int8_t* kt = reinterpret_cast<const int8_t*>(st);
    uint8_t* vt = st + L.stage_k;
    const uint16_t* kst = reinterpret_cast<const uint16_t*>(st + L.stage_k + L.stage_v);
    uint16_t* vst = reinterpret_cast<uint16_t*>(st + L.stage_k + L.stage_v + L.stage_ks);
    // ---- V-poisoned keys (vendor.h, "The V side"), step 1: does the tile hold one? Each thread checks the pieces
    // issue_tile gave it (its own copies are complete and visible to it after the wait; zero-filled past the key
    // range), float V pieces or q8_0 / q4_0 scale pieces, and marks the tile before the barrier publishes the stage.
    {
      bool bad = false;
      if constexpr (kVq) {
        if (sc_mode == 2) {  // halves t + kThreads i
#pragma unroll
          for (int i = 0; i < (KT * NBMAX + kThreads - 1) / kThreads; ++i)
            if (t + kThreads * i < KT * nb) bad |= half_nonfinite(vst[t + kThreads * i]);
        } else {  // half pairs t + kThreads i
#pragma unroll
          for (int i = 0; i < (KT * NBMAX / 2 + kThreads - 1) / kThreads; ++i)
            if (t + kThreads * i < KT * nb / 2)
              bad |= halves_nonfinite(reinterpret_cast<const uint32_t*>(vst)[t + kThreads * i]) != 0u;
        }
      } else {  // 16-byte pieces t + kThreads i
        uint32_t nf = 0;
#pragma unroll
        for (int i = 0; i < (KT * v_row_bytes(VK, DMAX) / 16 + kThreads - 1) / kThreads; ++i)
          if (t + kThreads * i < KT * vchunks)
            nf = v_nonfinite_acc<VK>(nf, reinterpret_cast<const uint4*>(vt)[t + kThreads * i]);
        bad = v_nonfinite(nf);
      }
      if (bad) *vflag = int(tile) + 1;
    }
    __syncthreads();
    const bool vpoison = *vflag == int(tile) + 1;  // block-uniform; rare
    const int64_t j0 = kbeg + tile * KT;
    const int tlen = int(kend - j0 < KT ? kend - j0 : KT);
    const bool check = a.mask_kind != 0 || tlen < KT || j0 + KT - 1 > kmin_all;

    // ---- logits ----
    {
      float lg[RPL];
#pragma unroll
      for (int i = 0; i < RPL; ++i) lg[i] = 0.f;
      const int8_t* krow = kt + lj * L.kpad;
#pragma unroll
      for (int blk = 0; blk < NBMAX; ++blk) {
        if (blk < nb) {
          const int4 k0 = *reinterpret_cast<const int4*>(krow + blk * 32);
          const int4 k1 = *reinterpret_cast<const int4*>(krow + blk * 32 + 16);
          const float ksf = h2f(kst[lj * nb + blk]);
#pragma unroll
          for (int i = 0; i < RPL; ++i) {
            const int r = lr0 + (kThreads / KT) * i;
            if (r < nrows) {
              const int4 q0 = *reinterpret_cast<const int4*>(qs + r * D + blk * 32);
              const int4 q1 = *reinterpret_cast<const int4*>(qs + r * D + blk * 32 + 16);
              int dot = 0;
              dot = dot4(k0.x, q0.x, dot); dot = dot4(k0.y, q0.y, dot);
              dot = dot4(k0.z, q0.z, dot); dot = dot4(k0.w, q0.w, dot);
              dot = dot4(k1.x, q1.x, dot); dot = dot4(k1.y, q1.y, dot);
              dot = dot4(k1.z, q1.z, dot); dot = dot4(k1.w, q1.w, dot);
              lg[i] += (qsc[r * nb + blk] * ksf) * float(dot);
            }
          }
        }
      }
#pragma unroll
      for (int i = 0; i < RPL; ++i) {
        const int r = lr0 + (kThreads / KT) * i;
        float x = -INFINITY;
        if (r < nrows) {
          x = lg[i] * a.scale_log2;
          if (check) {
            const int64_t jg = j0 + lj;
            bool vis = lj < tlen && jg <= kmax[r];
            if (vis && a.mask_kind != 0) {
              const int64_t mo = mrow[r] + jg * a.ms3;
              if (a.mask_kind == 1) {
                vis = static_cast<const uint8_t*>(a.mask)[mo] != 0;
              } else {
                // additive: (scale * dot + mask) in log2 units; -inf hides the key (even a NaN logit)
                const float mv = load_t(a.mask, mo, a.half);
                vis = mv != -INFINITY;
                x = (lg[i] * a.scale + mv) * kLog2e;
              }
            }
            if (!vis) x = -INFINITY;
          }
        }
        S[r * SP + lj] = x;
      }
    }
    __syncthreads();
    // ---- V-poisoned keys, step 2, only on tiles that hold one (rare; apart from the logit loop, which keeps its
    // registers): one thread per key checks its V row (zeros past the key range: never bad). A bad key's logits
    // become NaN where a row sees it (S holds the masked logits, hidden keys -inf: fold_v_poison), so those rows
    // turn NaN through l as for a poisoned K; its V enters P.V as zeros (q8_0 / q4_0: zero scales), so the rows it
    // is hidden from (p = 0) stay finite. Every detection read of the stage is behind the barrier above.
    if (vpoison) {
      if (t < KT) {
        bool bad = false;
        if constexpr (kVq) {
          for (int blk = 0; blk < nb; ++blk) bad |= half_nonfinite(vst[t * nb + blk]);
          if (bad) {
            for (int blk = 0; blk < nb; ++blk) vst[t * nb + blk] = 0;
          }
        } else {
          uint4* row = reinterpret_cast<uint4*>(vt + t * vrow);
          uint32_t nf = 0;
          for (int c = 0; c < vchunks; ++c) nf = v_nonfinite_acc<VK>(nf, row[c]);
          bad = v_nonfinite(nf);
          if (bad) {
            for (int c = 0; c < vchunks; ++c) row[c] = make_uint4(0u, 0u, 0u, 0u);
          }
        }
        if (bad) {  // (not unrolled: RB loads in flight would cost registers in the whole kernel)
#pragma unroll 1
          for (int r = 0; r < RB; ++r) S[r * SP + t] = fold_v_poison(S[r * SP + t], true);
        }
      }
      __syncthreads();  // the folded logits before the softmax, the zeroed V before P.V
    }

    // ---- online softmax ----
    if (sm_active) {
      float x[KPT];
      float mx = -INFINITY;
#pragma unroll
      for (int e = 0; e < KPT; ++e) {
        x[e] = S[sm_r * SP + sm_sub + TPR * e];
        mx = fmaxf(mx, x[e]);
      }
#pragma unroll
      for (int o = TPR / 2; o > 0; o >>= 1) mx = fmaxf(mx, shfl_xor(mx, o));
      const float m_new = fmaxf(m_run, mx);
      const float m_use = m_new == -INFINITY ? 0.f : m_new;
      const float alpha = exp2f(m_run - m_use);
      float sum = 0.f;
#pragma unroll
      for (int e = 0; e < KPT; ++e) {
        const float p = exp2f(x[e] - m_use);
        P[(sm_sub + TPR * e) * PP + sm_r] = p;
        sum += p;
      }
#pragma unroll
      for (int o = TPR / 2; o > 0; o >>= 1) sum += shfl_xor(sum, o);
      l_run = l_run * alpha + sum;
      m_run = m_new;
      if (sm_sub == 0) alpha_s[sm_r] = alpha;
    }
    __syncthreads();

    // ---- P.V ----
#pragma unroll
    for (int m = 0; m < IMAX; ++m) {
      if (!u_ok[m]) continue;
      const int rb0 = u_rg[m] * RPT, cp = u_cp[m];
#pragma unroll
      for (int r = 0; r < RPT; r += 4) {
        const float4 al = *reinterpret_cast<const float4*>(alpha_s + rb0 + r);
        acc[m][r][0] *= al.x; acc[m][r][1] *= al.x;
        acc[m][r + 1][0] *= al.y; acc[m][r + 1][1] *= al.y;
        acc[m][r + 2][0] *= al.z; acc[m][r + 2][1] *= al.z;
        acc[m][r + 3][0] *= al.w; acc[m][r + 3][1] *= al.w;
      }
      for (int j = u_ks[m]; j < tlen; j += nks) {
        float v0, v1;
        load_v2<VK>(vt, vst, j, cp, D, nb, v0, v1);
#pragma unroll
        for (int r = 0; r < RPT; r += 4) {
          const float4 p = *reinterpret_cast<const float4*>(P + j * PP + rb0 + r);
          acc[m][r][0] += p.x * v0; acc[m][r][1] += p.x * v1;
          acc[m][r + 1][0] += p.y * v0; acc[m][r + 1][1] += p.y * v1;
          acc[m][r + 2][0] += p.z * v0; acc[m][r + 2][1] += p.z * v1;
          acc[m][r + 3][0] += p.w * v0; acc[m][r + 3][1] += p.w * v1;
        }
      }
    }
    __syncthreads();
  }
  cp_async_wait<0>();

  // ---- epilogue: sum key subsets, normalise (or write split partials) -------------------------------------
  if (sm_active && sm_sub == 0) {
    rowm[sm_r] = m_run;
    rowl[sm_r] = l_run;
  }
  __syncthreads();  // every thread is past its last read of the stages: reuse them
  float* red = reinterpret_cast<float*>(stages);  // [nks][RB][D]
#pragma unroll
  for (int m = 0; m < IMAX; ++m) {
    if (!u_ok[m]) continue;
    const int rb0 = u_rg[m] * RPT, cp = u_cp[m];
#pragma unroll
    for (int r = 0; r < RPT; ++r)
      *reinterpret_cast<float2*>(red + (int64_t(u_ks[m]) * RB + rb0 + r) * D + 2 * cp) =
          make_float2(acc[m][r][0], acc[m][r][1]);
  }
  __syncthreads();
  for (int e = t; e < nrows * D; e += kThreads) {
    const int r = e / D, c = e % D;
    float o = 0.f;
    for (int k = 0; k < nks; ++k) o += red[(k * RB + r) * D + c];
    const int64_t rr = row0 + r, hq = hkv * a.g + rr / a.Sq, i = rr % a.Sq;
    const int64_t grow = (b * a.Hq + hq) * a.Sq + i;
    if (a.part_acc) {
      const int64_t prow = split * (a.B * a.Hq * a.Sq) + grow;
      a.part_acc[prow * D + c] = o;
      if (c == 0) {
        a.part_ml[prow * 2] = rowm[r];
        a.part_ml[prow * 2 + 1] = rowl[r];
      }
    } else {
      const float l = rowl[r];
      const float y = normalise(o, l);
      if (a.half) static_cast<uint16_t*>(a.out)[grow * D + c] = f2h_out(y);
      else static_cast<float*>(a.out)[grow * D + c] = y;
    }
  }
}

}  // namespace gpu
}  // namespace dot4attn
