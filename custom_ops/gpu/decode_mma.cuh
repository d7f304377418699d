// Dot4Attention decode on NVIDIA tensor cores (sm_80+, float16 T; decode route and split_k stage 1). CUDA only:
// HIP builds, float32 T and head dims other than 64 / 128 / 256 keep the SIMT decode kernel (decode_kernel.cuh).
//
// Why: the SIMT kernel spends ~75% of its instructions on P.V (one FMA per (key, column, row)). Here both
// products run on tensor cores and a warp needs ~710 SASS instructions per 32 keys (q4_0, D = 128, TMA staging;
// lop3_imm and the A quads below save ~90 of them), most of them the dequantization of V (once per value) and the
// Q.K scaling. At (32, 8, 128), 128k keys, q4_0 this takes ~40 % less time than the SIMT kernel
// (docs/performance.md has this kernel's measurements and where its time goes).
//
// Same block structure as the SIMT kernel: one block per (batch, KV head, key split, chunk of 8 rows); every warp
// streams its own 32-key chunks through its own nst-stage pipeline (cp.async, or TMA on sm_90) or through registers
// (StageMode below); warps combine once at the end. On sm_90 the decode route's short key ranges split over a
// cluster of blocks that combine through distributed shared memory (decode_cluster, rows_finish_cluster).
// Rows (grouped heads x query rows, 8 per block) are the mma's 8-wide dimension, padded with zero Q rows.
//
//  * Q.K: mma.m16n8k32 s8 with M = query rows (rows 8..15 and rows past nrows are zero), N = 8 keys, K = one
//    32-block, so each block's int32 dot gets its own scales: the accumulator starts at kMagicI and two FFMAs
//    give logit2 += fma(c, sq, -M sq) * sk = (sq * scale * log2e * dot) * sk, exactly as the tensor-core prefill
//    (sq from q_scale23, mma_primitives.cuh). K fragments come from the int8 rows by ldmatrix (rows padded to D + 16
//    bytes); the K scales of a chunk are spread once by the warp into one float4 per (block, 16-key step, quad
//    lane). D = 256 keeps logit2 += sq * fma(c, sk, -M sk) with (sk, -M sk) pairs (Layout::kQBias: registers).
//  * softmax: the Q.K accumulator gives thread (g, t) row g and keys 8j + 2t, 8j + 2t + 1 (j = 0..3); the row max
//    is a quad reduction, the row sum stays per thread until the end.
//  * P.V: O^T = V^T P^T, mma.m16n8k16 f16 with M = 16 V columns, N = the 8 rows, K = 16 keys, float32
//    accumulation. The Q.K accumulator layout IS the B fragment of P^T (keys 2t, 2t+1, 2t+8, 2t+9 of row g), so
//    P goes from registers to the mma with one f16 pack per two values. A = V^T:
//      - float16 V: ldmatrix.trans straight from the V rows (M tile m = columns 16m .. 16m+15);
//      - q8_0 / q4_0: thread g owns the D/8 consecutive columns [g*D/8, (g+1)*D/8) of every key (one 32-block,
//        so one V scale per key), loaded as whole words; M tile m row g is column g*D/8 + 2m, row g + 8 is
//        column g*D/8 + 2m + 1 (one byte pair / one nibble pair). A byte (or nibble) pair of two keys becomes
//        the f16 pair 1024 + level (0x64 / 0x54 exponent trick, exact), minus the bias, times the two keys' V
//        scales: value * scale with one f16 rounding, the same dequantization as the tensor-core prefill.
//    Accuracy as the tensor-core prefill: f16 P and f16 V add ~2^-12 relative error per term (NMSE ~1e-7).
//  * the end: the warps' (m, l, acc) meet in shared memory and rows_finish writes the rows or the partials.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "gpu/decode_kernel.cuh"
#include "gpu/launch_plan.h"
#include "gpu/mma_primitives.cuh"
#include "gpu/tma.cuh"

#if defined(D4A_CUDA)
#define D4A_HAS_DECODE_MMA 1

namespace dot4attn {
namespace gpu {
namespace dmma {

constexpr int kKC = 32;   // keys per warp chunk
constexpr int kRB = 8;    // rows per block (the mma's N)
constexpr int kMaxThreads = 256;  // 8 warps (D = 256 needs ~190 registers)
constexpr int kMaxCluster = 8;    // decode route's cluster (the portable cluster size limit)

__host__ __device__ constexpr int up16(int x) { return (x + 15) & ~15; }

// Shared memory (bytes), identical on host and device. Block part: int8 Q [8][D], float Q scales [8][NB], last
// visible key and mask row offset per row, the block's merged (m, l) [2][8] (clusters), warps' (m, l) [nw][8]
// (TMA, bulk: and the warps' stage mbarriers); then per warp its K scale table and nst stages. After the key loop
// the warp areas become the [nw][8][D] float32 combine buffer (it fits: a warp's area holds at least the 32 x D K
// bytes of one stage).
// A stage: K rows, K scale rows (2 NB bytes per key), V rows, V scale rows (q8_0 / q4_0). cp.async / register
// staging pads the rows by 16 bytes (conflict-free ldmatrix); TMA writes dense 32-key slabs with the hardware's
// XOR swizzle instead (tma_row_byte: conflict-free the same way), so its stages and warp areas are 1024-byte
// aligned (the swizzle's period) and the block asks for 1024 bytes of slack to align its base.
template <int VK, int D, bool TMA = false, bool BARS = TMA>
struct Layout {
  static constexpr int NB = D / 32;
  static constexpr bool kVq = v_quantized(VK);
  static constexpr int KSTR = D + 16;                 // padded K row bytes
  static constexpr int VROW = v_row_bytes(VK, D);
  static constexpr int VSTR = VROW + 16;              // padded V row bytes
  static constexpr int ST_KS = kKC * NB * 2;           // the chunk's K scale rows
  static constexpr int ST_VS = kVq ? ST_KS : 0;
  static constexpr int OFF_KS = TMA ? kKC * (D + VROW) : kKC * KSTR;  // stage offsets
  static constexpr int OFF_V = TMA ? kKC * D : OFF_KS + ST_KS;
  static constexpr int OFF_VS = TMA ? OFF_KS + ST_KS : OFF_V + kKC * VSTR;
  static constexpr int STAGE = TMA ? up1024(OFF_VS + ST_VS) : OFF_VS + ST_VS;
  // K scale table (kQBias): float4 of 4 key scales per (block, 16-key step, quad lane); D = 256: float4
  // (sk0, sk1, -M sk0, -M sk1) per (block, key pair)
  static constexpr bool kQBias = D <= 128;
  static constexpr int KSF = kQBias ? NB * 8 * 16 : NB * 16 * 16;
  static constexpr int KSF_AREA = TMA ? up1024(KSF) : KSF;
  static constexpr int OFF_QS = 0;
  static constexpr int OFF_QSC = up16(kRB * D);
  static constexpr int OFF_KMAX = OFF_QSC + up16(kRB * NB * 4);
  static constexpr int OFF_MROW = OFF_KMAX + kRB * 8;
  static constexpr int OFF_BML = OFF_MROW + kRB * 8;  // cluster: the block's merged (M, l) [2][kRB]
  static constexpr int OFF_WM = OFF_BML + 2 * kRB * 4;
  __host__ __device__ static int off_wl(int nw) { return OFF_WM + up16(nw * kRB * 4); }
  __host__ __device__ static int off_bar(int nw) { return off_wl(nw) + up16(nw * kRB * 4); }  // [nw][kDecodeMaxStages]
  __host__ __device__ static int off_warps(int nw) {
    return TMA ? up1024(off_bar(nw) + nw * kDecodeMaxStages * 8) : BARS ? up16(off_bar(nw) + nw * kDecodeMaxStages * 8) : off_bar(nw);
  }
  __host__ __device__ static int warp_bytes(int nst) { return KSF_AREA + nst * STAGE; }
  __host__ __device__ static int total(int nw, int nst) { return off_warps(nw) + nw * warp_bytes(nst) + (TMA ? 1024 : 0); }
  static_assert(KSF + STAGE >= kRB * D * 4, "a warp's area must hold its combine rows");
};

// Byte b of key row r in a stage's K (ROW = D) or V (ROW = VROW) rows: padded rows STR bytes apart, or the TMA's
// swizzled slabs.
template <int ROW, int STR, bool TMA>
__device__ __forceinline__ int row_byte(int r, int b) {
  if constexpr (TMA) return tma_row_byte<ROW, kKC>(r, b);
  else return r * STR + b;
}

// f16 pair (key a, key b) of local column lc of a thread's q8_0 / q4_0 words: the exact levels, biased (see top).
// The mask-and-merge is one LOP3 holding a constant in a register (lop3_imm; 64 LOP3s fewer per q4_0 chunk at
// D = 128), except at D = 256 (LOP3 = false), whose register-staged q4_0 kernel spills more with the extra register.
template <int VK, bool LOP3 = true>
__device__ __forceinline__ uint32_t level_pair(const uint32_t* wa, const uint32_t* wb, int lc) {
  if constexpr (VK == kVQ8) {
    const int e = lc & 3;
    const uint32_t x = __byte_perm(wa[lc >> 2], wb[lc >> 2], e | (e << 4) | ((4 + e) << 8) | ((4 + e) << 12));
    const uint32_t y = LOP3 ? lop3_imm<0x00FF00FFu, 0x64806480u, 0x6A>(x) : (x & 0x00FF00FFu) ^ 0x64806480u;
    return hsub2_u(y, 0x64806480u);  // (1024 + q + 128) - 1152
  } else {
    const int by = lc >> 1, e = by & 3;
    const uint32_t x = __byte_perm(wa[by >> 2], wb[by >> 2], e | (e << 4) | ((4 + e) << 8) | ((4 + e) << 12));
    if (lc & 1) {
      const uint32_t y = LOP3 ? lop3_imm<0x00F000F0u, 0x54005400u, 0xEA>(x) : (x & 0x00F000F0u) | 0x54005400u;
      return hsub2_u(y, 0x54805480u);  // (64 + n) - 72
    }
    const uint32_t y = LOP3 ? lop3_imm<0x000F000Fu, 0x64006400u, 0xEA>(x) : (x & 0x000F000Fu) | 0x64006400u;
    return hsub2_u(y, 0x64086408u);  // (1024 + n) - 1032
  }
}

// The V scales of 32-block bt for a P.V step's four keys: keys k0, k0 + 1 as the f16 pair h01, k0 + 8, k0 + 9 as
// h89, from the stage's scale rows (STEP halves apart).
template <int STEP>
__device__ __forceinline__ void v_scale_pairs(const uint16_t* vss, int k0, int bt, __half2& h01, __half2& h89) {
  const uint32_t s01 = __byte_perm(vss[k0 * STEP + bt], vss[(k0 + 1) * STEP + bt], 0x5410);
  const uint32_t s89 = __byte_perm(vss[(k0 + 8) * STEP + bt], vss[(k0 + 9) * STEP + bt], 0x5410);
  h01 = *reinterpret_cast<const __half2*>(&s01);
  h89 = *reinterpret_cast<const __half2*>(&s89);
}

// The f16 pair (key a, key b) of local column lc of a thread's q6_0 words (one 32-block's part, decode_mma_kernel's
// P.V): low nibbles in wla / wlb as q4_0's, high 2-bit pairs in wha / whb (the block's bytes 16..23, shifted right
// by the thread's first column / 8 pairs already), so column lc takes high byte lc % 8 at bit 2 (lc / 8). Even lc:
// exponent 0x64 (1024, ulp 1), the level's 6 bits at mantissa bits 0..5; odd lc: exponent 0x54 (64, ulp 1/16), the
// low nibble at bits 4..7, the high pair at 8..9. Exact, biased as level_pair (1024 + 32 / 64 + 32).
__device__ __forceinline__ uint32_t level_pair_q6(const uint32_t* wla, const uint32_t* wlb, const uint32_t* wha,
                                                  const uint32_t* whb, int lc) {
  const int by = lc >> 1, e = by & 3, hb = lc & 7, he = hb & 3, sh = 2 * (lc >> 3);
  const uint32_t x = __byte_perm(wla[by >> 2], wlb[by >> 2], e | (e << 4) | ((4 + e) << 8) | ((4 + e) << 12));
  const uint32_t h = __byte_perm(wha[hb >> 2], whb[hb >> 2], he | (he << 4) | ((4 + he) << 8) | ((4 + he) << 12));
  if (lc & 1) {
    const uint32_t hi = (sh <= 8 ? h << (8 - sh) : h >> (sh - 8)) & 0x03000300u;
    return hsub2_u((x & 0x00F000F0u) | hi | 0x54005400u, 0x56005600u);  // (64 + u) - 96
  }
  const uint32_t hi = (sh <= 4 ? h << (4 - sh) : h >> (sh - 4)) & 0x00300030u;
  return hsub2_u((x & 0x000F000Fu) | hi | 0x64006400u, 0x64206420u);  // (1024 + u) - 1056
}

// c = bias + A(16x32 s8: a[0] row g, a[2] row g cols +16; a[1] = a[3] = 0, rows g+8 zero) x B(32x8 s8),
// bias = kMagicI.
__device__ __forceinline__ void mma_s8_rows8(int (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%10,%10,%10};\n"
      : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(kMagicI));
}

// ---- the block's Q rows and its end ---------------------------------------------------------------------------
// Q rows, one warp per row (rows w, w + nw, ...): lane l holds the E = D / 32 elements [l E, l E + E), so a 32-block
// is 32 / E lanes and its amax takes log2(32 / E) shuffles. The math is the contract's, as decode_rows_prologue,
// whose 32-lane group per (row, block) costs ~1,300 instructions per warp at 4 warps: half of a split block's
// profiler samples when it has one chunk per warp (short walks such as 4k keys).
template <int D>
struct QRow {
  static constexpr int E = D / 32, W = E / 2;  // elements / 32-bit words per lane
  uint32_t h[W];
};

// Row r's lane words (zeros past nrows).
template <int D>
__device__ __forceinline__ QRow<D> q_load(const TileArgs& a, int b, int hkv, int row0, int nrows, int r, int lane) {
  constexpr int W = QRow<D>::W;
  QRow<D> q;
#pragma unroll
  for (int j = 0; j < W; ++j) q.h[j] = 0u;
  if (r < nrows) {
    const int rr = row0 + r, i = rr % int(a.Sq);
    const int64_t hq = int64_t(hkv) * a.g + rr / int(a.Sq);
    const uint32_t* src = reinterpret_cast<const uint32_t*>(static_cast<const uint16_t*>(a.q) +
                                                            ((int64_t(b) * a.Hq + hq) * a.Sq + i) * D) + lane * W;
    if constexpr (W == 4) {
      const uint4 u = *reinterpret_cast<const uint4*>(src);
      q.h[0] = u.x; q.h[1] = u.y; q.h[2] = u.z; q.h[3] = u.w;
    } else if constexpr (W == 2) {
      const uint2 u = *reinterpret_cast<const uint2*>(src);
      q.h[0] = u.x; q.h[1] = u.y;
    } else {
      q.h[0] = src[0];
    }
  }
  return q;
}

// Row r as int8 Q [r][D] and float32 scales [r][D/32] in shared memory; the caller's barrier publishes them.
template <int D>
__device__ __forceinline__ void q_quantize(const QRow<D>& q, int r, int lane, int8_t* qs, float* qsc) {
  constexpr int E = QRow<D>::E, W = QRow<D>::W, LPB = 32 / E, NB = D / 32;
  float x[E];
#pragma unroll
  for (int j = 0; j < W; ++j) h2x2f(q.h[j], x[2 * j], x[2 * j + 1]);
  float am = abs_or_inf(x[0]);  // +inf for a NaN / Inf block
#pragma unroll
  for (int e = 1; e < E; ++e) am = fmaxf(am, abs_or_inf(x[e]));
#pragma unroll
  for (int o = 1; o < LPB; o <<= 1) am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, o));
  float dv;
  const float sc = q_block_scale(am, dv);  // NaN for a non-finite block (dv = 0: q = 0)
  uint32_t pk[(E + 3) / 4] = {};
#pragma unroll
  for (int e = 0; e < E; ++e) {
    float qv = dv == 0.f ? 0.f : rintf(div_rn(x[e], dv));
    qv = fminf(fmaxf(qv, -127.f), 127.f);
    pk[e / 4] |= (uint32_t(int(qv)) & 0xffu) << (8 * (e % 4));
  }
  int8_t* dst = qs + r * D + lane * E;
  if constexpr (E == 8) *reinterpret_cast<uint2*>(dst) = make_uint2(pk[0], pk[1]);
  else if constexpr (E == 4) *reinterpret_cast<uint32_t*>(dst) = pk[0];
  else *reinterpret_cast<uint16_t*>(dst) = uint16_t(pk[0]);
  if (lane % LPB == 0) qsc[r * NB + lane / LPB] = sc;
}

// Row r past the block's rows: the zeros q_quantize writes for a zero row, without its math.
template <int D>
__device__ __forceinline__ void q_zero(int r, int lane, int8_t* qs, float* qsc) {
  constexpr int E = QRow<D>::E, LPB = 32 / E, NB = D / 32;
  int8_t* dst = qs + r * D + lane * E;
  if constexpr (E == 8) *reinterpret_cast<uint2*>(dst) = make_uint2(0u, 0u);
  else if constexpr (E == 4) *reinterpret_cast<uint32_t*>(dst) = 0u;
  else *reinterpret_cast<uint16_t*>(dst) = uint16_t(0);
  if (lane % LPB == 0) qsc[r * NB + lane / LPB] = 0.f;
}

// One output item (row r, columns 4 c4 .. 4 c4 + 3) from its running max M (log2 units), sum l and unnormalised
// accumulator o: split_k's partials, or the normalised float16 row.
template <int D>
__device__ __forceinline__ void row_store(const TileArgs& a, int r, int c4, float M, float l, float4 o, int row0,
                                          int split, int b, int hkv) {
  const int rr = row0 + r, i = rr % int(a.Sq);
  const int64_t grow = (int64_t(b) * a.Hq + int64_t(hkv) * a.g + rr / int(a.Sq)) * a.Sq + i;
  if (a.part_acc) {
    const int64_t prow = int64_t(split) * (a.B * a.Hq * a.Sq) + grow;
    reinterpret_cast<float4*>(a.part_acc + prow * D)[c4] = o;
    if (c4 == 0) {
      a.part_ml[prow * 2] = M;
      a.part_ml[prow * 2 + 1] = l;
    }
  } else {
    o = make_float4(normalise(o.x, l), normalise(o.y, l), normalise(o.z, l), normalise(o.w, l));
    const uint2 u = make_uint2(uint32_t(f2h_out(o.x)) | (uint32_t(f2h_out(o.y)) << 16),
                               uint32_t(f2h_out(o.z)) | (uint32_t(f2h_out(o.w)) << 16));
    reinterpret_cast<uint2*>(static_cast<uint16_t*>(a.out) + grow * D)[c4] = u;
  }
}

// The combine buffer red [nw][kRB][D] (float32): float4 c4 of row r sits at float4 c4 ^ red_swz(r) of its row, so
// the accumulator stores after the key loop spread over 4x more banks (q8_0 / q4_0 V: 16-way -> 4-way conflicts,
// float16 V: 4-way -> 2-way; each thread stores rows 2 tq, 2 tq + 1, whose red_swz is tq).
__device__ __forceinline__ int red_swz(int r) { return (r >> 1) & 3; }

// The block's warps' (m, l) [nw][kRB] and float32 accumulators red [nw][kRB][D] merged for item (r, c4): M, l, o.
// Every thread recomputes its row's warp weights 2^(m_w - M) (nw <= 8 exp2) instead of a second barrier. Same sums
// in the same order as decode_rows_finish (the SIMT kernel's).
template <int D>
__device__ __forceinline__ void warps_merge(const float* wm, const float* wl, const float* red, int nw, int r, int c4,
                                            float& M, float& l, float4& o) {
  M = -INFINITY;
  for (int k = 0; k < nw; ++k) M = fmaxf(M, wm[k * kRB + r]);
  const float Mu = M == -INFINITY ? 0.f : M;
  l = 0.f;
  o = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int k = 0; k < nw; ++k) {
    const float f = exp2f(wm[k * kRB + r] - Mu);
    l += f * wl[k * kRB + r];
    const float4 x = reinterpret_cast<const float4*>(red + (k * kRB + r) * D)[c4 ^ red_swz(r)];
    o.x += f * x.x; o.y += f * x.y; o.z += f * x.z; o.w += f * x.w;
  }
}

// After the key loop (its barrier passed): the block's rows (decode) or split partials (split_k), four columns per
// thread and step. KEEP (a cluster's first level): the block's merged (M, l) into bml [2][kRB] and o in place of
// warp 0's rows of red instead (each item's thread is the only one touching them).
template <int D, bool KEEP = false>
__device__ __forceinline__ void rows_finish(const TileArgs& a, const float* wm, const float* wl, float* red, int nw,
                                            int nrows, int row0, int split, int b, int hkv, float* bml = nullptr) {
  constexpr int C4 = D / 4;
  for (int idx = int(threadIdx.x); idx < nrows * C4; idx += int(blockDim.x)) {
    const int r = idx / C4, c4 = idx % C4;
    float M, l;
    float4 o;
    warps_merge<D>(wm, wl, red, nw, r, c4, M, l, o);
    if constexpr (KEEP) {
      reinterpret_cast<float4*>(red + r * D)[c4 ^ red_swz(r)] = o;
      if (c4 == 0) {
        bml[r] = M;
        bml[kRB + r] = l;
      }
    } else {
      row_store<D>(a, r, c4, M, l, o, row0, split, b, hkv);
    }
  }
}

#if __CUDA_ARCH__ >= 900
// The same for a cluster of `ranks` blocks (this one `rank`; the key splits of one row chunk, kMaxCluster at most),
// in two levels so that no thread walks a chain of remote reads: each block merges its own warps (rows_finish
// with KEEP); after the cluster barrier each block takes a share of the items and merges the ranks' partials,
// read through distributed shared memory (loops unrolled over kMaxCluster: independent loads, about one remote
// round trip; holding all ranks' float4 in arrays instead makes ptxas spill the D = 256 kernels). The caller's
// second cluster barrier keeps every block's shared memory alive until the others are done reading it.
template <int D>
__device__ __forceinline__ void rows_finish_cluster(const TileArgs& a, const float* wm, const float* wl, float* red,
                                                    float* bml, int nw, int nrows, int row0, int b, int hkv,
                                                    int ranks, int rank) {
  constexpr int C4 = D / 4;
  rows_finish<D, true>(a, wm, wl, red, nw, nrows, row0, 0, b, hkv, bml);
  __cluster_barrier_arrive();  // release: the block partials are visible to the cluster after the wait
  __cluster_barrier_wait();
  for (int idx = rank * int(blockDim.x) + int(threadIdx.x); idx < nrows * C4; idx += ranks * int(blockDim.x)) {
    const int r = idx / C4, c4 = idx % C4;
    float mk[kMaxCluster];
    float M = -INFINITY;
#pragma unroll
    for (int k = 0; k < kMaxCluster; ++k) {
      mk[k] = k < ranks ? static_cast<const float*>(__cluster_map_shared_rank(bml, unsigned(k)))[r] : -INFINITY;
      M = fmaxf(M, mk[k]);
    }
    const float Mu = M == -INFINITY ? 0.f : M;
    float l = 0.f;
    float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int k = 0; k < kMaxCluster; ++k) {
      if (k < ranks) {
        const float* rb = static_cast<const float*>(__cluster_map_shared_rank(bml, unsigned(k)));
        const float* rr = static_cast<const float*>(__cluster_map_shared_rank(red, unsigned(k)));
        const float4 x = reinterpret_cast<const float4*>(rr + r * D)[c4 ^ red_swz(r)];
        const float f = exp2f(mk[k] - Mu);
        l += f * rb[kRB + r];
        o.x += f * x.x; o.y += f * x.y; o.z += f * x.z; o.w += f * x.w;
      }
    }
    row_store<D>(a, r, c4, M, l, o, row0, 0, b, hkv);
  }
}
#endif

// How a warp's chunks reach shared memory (StageMode, picked per launch in launch()):
//  * kStageCpAsync: the nst-stage cp.async pipeline (copies issued nst - 1 chunks ahead).
//  * kStageRegs: lane l loads its 16-byte pieces of the next chunk (and key l's scale rows) into registers with
//    evict-first (.cs) loads while the warp computes the current chunk, and stores them into the warp's single
//    stage afterwards. It streams faster because read-once data then leaves L2 first instead of pushing other
//    (also dirty) lines out; cp.async cannot take that policy here: CUDA 13.0's ptxas miscompiles
//    cp.async.L2::cache_hint (illegal instruction: the policy lands in a uniform register it never sets). A
//    copy-only kernel with split_k's access pattern streams a 128k-key q4_0 cache ~7 % faster this way than by
//    plain cp.async.
//    Costs a register per 4 staged bytes (q4_0 D = 128: 147 -> 255 registers, no spill).
//  * kStageRegsV: only V (and its scales) through registers, K by cp.async (q8_0: staging both spills).
//  * kStageTma (sm_90): the nst-stage pipeline with the K / V rows moved by TMA tensor copies carrying the
//    evict-first policy (lane 0 issues one copy per 32-key x 128-byte slab and arms the stage's mbarrier; the
//    scale rows stay on cp.async), written as swizzled dense slabs (Layout). No registers held, no per-lane copy
//    instructions. Keys of a partial chunk past the range are zeroed by the warp (float16 V could hold NaN there).
//  * kStageBulk (sm_90, strided rows that carry their scales, q8_0 / q4_0 V): a packed cache's rows are
//    [payload | scales | padding], D + 16 (K) and VROW + 16 (V) bytes apart, which is exactly the padded stage
//    layout above, scales in the padding's place. So a chunk's 32 K rows are one contiguous run of 32 (D + 16) bytes
//    in global and in shared memory, and lane 0 moves it, and the V run, with one bulk copy each (cp.async.bulk,
//    evict-first, completing the stage's mbarrier): no registers held, no per-lane copies, nst stages deep. The
//    scales are read where they landed, in their rows. Keys past a partial chunk are not copied (never past the
//    valid length): the warp zeroes those rows once the copy has landed.
// (StageMode: gpu/launch_plan.h.) Without TMA a (VK, D) stages q4_0 in registers, q8_0 at D = 128 its V, the rest
// by cp.async: the instance the planner names "auto" for it.
__host__ __device__ constexpr int auto_staging(int vk, int d) {
  return vk == kVQ4 ? kStageRegs : vk == kVQ8 && d == 128 ? kStageRegsV : kStageCpAsync;
}

template <int N>
struct ScaleRow;  // one key's scale row (2 * D / 32 bytes) as a register value
template <> struct ScaleRow<4> { using T = uint32_t; };
template <> struct ScaleRow<8> { using T = uint2; };
template <> struct ScaleRow<16> { using T = uint4; };

__device__ __forceinline__ uint32_t ld_stream(const uint32_t* p) { return __ldcs(p); }
__device__ __forceinline__ uint2 ld_stream(const uint2* p) { return __ldcs(p); }
__device__ __forceinline__ uint4 ld_stream(const uint4* p) { return __ldcs(p); }
template <class T> __device__ __forceinline__ T zero_of();
template <> __device__ __forceinline__ uint32_t zero_of<uint32_t>() { return 0u; }
template <> __device__ __forceinline__ uint2 zero_of<uint2>() { return make_uint2(0u, 0u); }
template <> __device__ __forceinline__ uint4 zero_of<uint4>() { return make_uint4(0u, 0u, 0u, 0u); }

// SR (strided rows): K / V rows and their scale rows are the launch's strides apart and kv_rows rows per head (a
// packed or preallocated cache); else the tensors are dense (widths constants here, Sk rows per head) and the kernel
// is today's dense one: one base address per lane, constant offsets, no further live kernel argument.
template <int VK, int D, int SM, bool CL = false, bool SR = false>
__global__ void __launch_bounds__(kMaxThreads) decode_mma_kernel(const TileArgs a, const __grid_constant__ TmaMaps tm) {
  constexpr bool kTma = SM == kStageTma, kBulk = SM == kStageBulk, kBars = kTma || kBulk;
  constexpr bool kRegK = SM == kStageRegs, kRegV = SM == kStageRegs || SM == kStageRegsV;  // through registers
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using L = Layout<VK, D, kTma, kBars>;
  constexpr int NB = L::NB, KSTR = L::KSTR, VROW = L::VROW, VSTR = L::VSTR;
  constexpr int MT = D / 16;  // P.V M tiles
  constexpr int NPK = D / 16;          // 16-byte K pieces per lane per chunk
  constexpr int NPV = VROW / 16;       // 16-byte V pieces per lane per chunk
  constexpr bool kVq = L::kVq;
  static_assert(!kBulk || (SR && kVq), "bulk staging: strided rows with their scales, q8_0 / q4_0 / q6_0 V");
  static_assert(VK != kVQ6 || (SM != kStageTma && SM != kStageRegs && SM != kStageRegsV),
                "q6_0 V: cp.async or bulk staging");
  // Where key r's scale rows are in a stage, in halves from the stage: a row of their own (2 NB bytes per key) or,
  // bulk staging, in the key's K / V row after its payload.
  constexpr int KS_OFF = kBulk ? D / 2 : L::OFF_KS / 2, KS_STEP = kBulk ? KSTR / 2 : NB;
  constexpr int VS_OFF = kBulk ? (L::OFF_V + VROW) / 2 : L::OFF_VS / 2, VS_STEP = kBulk ? VSTR / 2 : NB;
  static_assert(VK != kVF32 && (D == 64 || D == 128 || D == 256), "decode_mma: float16 T, D 64 / 128 / 256");

  extern __shared__ __align__(16) uint8_t smem_raw[];
  uint8_t* smem = smem_raw;  // TMA: moved up to the swizzle period (the launcher adds the slack)
  if constexpr (kTma) smem += smem_pad1024(smem_raw);
  const int nw = int(blockDim.x) >> 5, nst = a.nst;
  const int t = threadIdx.x, lane = t & 31, w = t >> 5, g = lane >> 2, tq = lane & 3;
  int8_t* qs = reinterpret_cast<int8_t*>(smem + L::OFF_QS);
  float* qsc = reinterpret_cast<float*>(smem + L::OFF_QSC);
  int64_t* kmax_s = reinterpret_cast<int64_t*>(smem + L::OFF_KMAX);
  int64_t* mrow_s = reinterpret_cast<int64_t*>(smem + L::OFF_MROW);
  float* wm = reinterpret_cast<float*>(smem + L::OFF_WM);
  float* wl = reinterpret_cast<float*>(smem + L::off_wl(nw));
  uint8_t* wbase = smem + L::off_warps(nw) + w * L::warp_bytes(nst);
  float4* ksf = reinterpret_cast<float4*>(wbase);
  uint8_t* stages = wbase + L::KSF_AREA;
  const uint32_t bars = smem_u32(smem + L::off_bar(nw)) + 8 * kDecodeMaxStages * w;  // TMA: the warp's stage barriers
  uint64_t l2_first = 0;
  if constexpr (kBars) {
    if (lane == 0) {
#pragma unroll 1
      for (int s = 0; s < nst; ++s) mbar_init(bars + 8 * s, 1);
      mbar_init_fence();
      l2_first = l2_evict_first_policy();
    }
    __syncwarp();
  }

  // ---- which (row chunk, split, batch, kv head) ------------------------------------------------------------
  // Row chunks vary fastest (they share K / V through L2); a cluster's blocks are its splits (consecutive ids).
  const int bid = int(blockIdx.x);  // below 2^31 (launcher): 32-bit division, see decode_row_bounds
  const int sc = CL ? int(a.n_splits) : int(a.n_chunks), oc = CL ? int(a.n_chunks) : int(a.n_splits);
  const int i0 = bid % sc, rest = bid / sc, i1 = rest % oc, bh = rest / oc;
  const int chunk = CL ? i1 : i0, split = CL ? i0 : i1;
  const int b = bh / int(a.Hkv), hkv = bh % int(a.Hkv);
  const int64_t row0 = chunk * kRB;
  const int nrows = int(a.g * a.Sq - row0 < kRB ? a.g * a.Sq - row0 : kRB);
  // sk: the batch row's keys (row_keys; dense rows never come with device lengths, see dense_rows)
  const int64_t sk = SR ? row_keys(a, b) : a.Sk;
  int64_t kmin_all, kmax_all;
  decode_row_bounds<kRB>(a, sk, row0, nrows, kmin_all, kmax_all);
  // split_k: splits of a.split_len keys, or (split_chunks > 0) split s takes key chunks [s C / n, (s + 1) C / n) of
  // the C = split_chunks chunks, so no split walks more than one chunk more than another (device lengths: the row's
  // own C, or split_keys)
  const int64_t cks = SR && a.seqlens ? (sk + kKC - 1) / kKC : a.split_chunks;
  const int64_t slen = SR ? split_keys(a, sk) : a.split_len;
  const int64_t kbeg = a.split_chunks > 0 ? split * cks / a.n_splits * kKC : split * slen;
  int64_t kend = a.split_chunks > 0 ? (split + 1) * cks / a.n_splits * kKC : kbeg + slen;
  if (kend > sk) kend = sk;
  if (kend > kmax_all + 1) kend = kmax_all + 1;
  const int64_t nck = kend > kbeg ? (kend - kbeg + kKC - 1) / kKC : 0;
  const int my_n = nck > w ? (int(nck) - w + nw - 1) / nw : 0;

  // Key j of the block's (b, kv head) is row head_row + j of K, V and their scales, rows kstr / vstr bytes and
  // ksstr / vsstr halves apart.
  const int64_t head_row = bh * (SR ? a.kv_rows : a.Sk);
  const int64_t kstr = SR ? a.k_stride : D, vstr = SR ? a.v_stride : VROW;
  const int8_t* kg = a.k + head_row * kstr;
  const uint8_t* vg = static_cast<const uint8_t*>(a.v) + head_row * vstr;

  // The copies of a chunk: lane l moves 16-byte pieces l, l + 32, ... of the chunk's K and V rows (padded by 16
  // bytes in shared memory; 32 pieces always span whole rows, so piece i is 32 / KPR rows after piece i - 1: kStepK /
  // kStepV bytes on in shared memory, gStepK / gStepV in global memory) and key l's K and V scale rows (2 NB bytes
  // each). A full chunk needs no bounds and one base address per lane; keys past the range of a partial chunk are
  // zero-filled.
  // q6_0's V rows (3 D / 4 bytes: 3, 6 or 12 pieces) do not divide 32 pieces: each lane copies its own key's row
  // instead (kVWhole false, cp.async and bulk staging only).
  constexpr int KPR = D / 16, VPR = VROW / 16;  // 16-byte pieces per K / V row
  constexpr bool kVWhole = 32 % VPR == 0;
  static_assert(32 % KPR == 0 && (kVWhole || (!kTma && !kRegV)), "32 pieces span whole rows");
  constexpr int VRS = kVWhole ? 32 / VPR : 1;  // V rows per 32 pieces
  constexpr int kStepK = 512 + 16 * (32 / KPR), kStepV = 512 + 16 * VRS;
  const int64_t gStepK = (32 / KPR) * kstr, gStepV = VRS * vstr;  // dense: 512
  const int8_t* kl = SR ? kg + (lane / KPR) * kstr + 16 * (lane % KPR) : kg + 16 * lane;
  const uint8_t* vl = SR ? vg + (lane / VPR) * vstr + 16 * (lane % VPR) : vg + 16 * lane;
  const int soff_k = 16 * lane + 16 * (lane / KPR), soff_v = L::OFF_V + 16 * lane + 16 * (lane / VPR);
  const int64_t ksstr = SR ? a.ks_stride : NB, vsstr = SR ? a.vs_stride : NB;
  const uint16_t* ksg = a.ks + head_row * ksstr;
  const uint16_t* vsg = kVq ? a.vs + head_row * vsstr : nullptr;
  // The warp's chunks as key starts (-1: past its last): chunks w, w + nw, ... of its split.
  int st_made = 0;
  auto peek = [&]() -> int64_t { return st_made < my_n ? kbeg + int64_t(w + int64_t(st_made) * nw) * kKC : -1; };
  auto produce = [&]() -> int64_t {
    return st_made < my_n ? kbeg + int64_t(w + int64_t(st_made++) * nw) * kKC : -1;
  };
  // keys of the chunk at key j0, up to the split's end
  auto chunk_n = [&](int64_t j0) { return int(kend - j0 < kKC ? kend - j0 : kKC); };
  auto issue = [&](int64_t j0, int sidx) {
    uint8_t* st = stages + sidx * L::STAGE;
    if (j0 >= 0) {
      const int n = chunk_n(j0);
      const int64_t stepK = SR ? opaque(gStepK) : gStepK, stepV = SR ? opaque(gStepV) : gStepV;
      const int8_t* ks0 = kl + j0 * kstr;
      const uint8_t* vs0 = vl + j0 * vstr;
      if constexpr (kBulk) {
        if (lane == 0) {  // the stage's last reads were ordered before this by the previous iteration's __syncwarp
          const uint32_t bar = bars + 8 * sidx, dst = smem_u32(st);
          mbar_arrive_expect(bar, n * (KSTR + VSTR));
          bulk_load(dst, kg + j0 * KSTR, n * KSTR, bar, l2_first);
          bulk_load(dst + L::OFF_V, vg + j0 * VSTR, n * VSTR, bar, l2_first);
        }
      } else if constexpr (kTma) {
        if (lane == 0) {  // the stage's last reads were ordered before this by the previous iteration's __syncwarp
          constexpr int WK = tma_slab(D), WV = tma_slab(VROW);
          const uint32_t bar = bars + 8 * sidx, dst = smem_u32(st);
          mbar_arrive_expect(bar, kKC * (D + VROW));  // whole boxes: rows past Sk arrive as zeros
#pragma unroll
          for (int x = 0; x < D; x += WK) tma_load_3d(dst + kKC * x, &tm.k, x, int(j0), bh, bar, l2_first);
#pragma unroll
          for (int x = 0; x < VROW; x += WV)
            tma_load_3d(dst + L::OFF_V + kKC * x, &tm.v, x, int(j0), bh, bar, l2_first);
        }
      } else if (n == kKC) {
        if constexpr (!kRegK) {
#pragma unroll
          for (int i = 0; i < NPK; ++i) cp_async16(st + soff_k + i * kStepK, ks0 + i * stepK, true);
        }
        if constexpr (!kRegV && kVWhole) {
#pragma unroll
          for (int i = 0; i < NPV; ++i) cp_async16(st + soff_v + i * kStepV, vs0 + i * stepV, true);
        }
      } else {
        if constexpr (!kRegK) {
#pragma unroll
          for (int i = 0; i < NPK; ++i) {
            const bool ok = 16 * (lane + 32 * i) < n * D;
            cp_async16(st + soff_k + i * kStepK, ok ? ks0 + i * stepK : kg, ok);
          }
        }
        if constexpr (!kRegV && kVWhole) {
#pragma unroll
          for (int i = 0; i < NPV; ++i) {
            const bool ok = 16 * (lane + 32 * i) < n * VROW;
            cp_async16(st + soff_v + i * kStepV, ok ? vs0 + i * stepV : vg, ok);
          }
        }
      }
      // q6_0: lane = key, its row's VPR pieces from one base address (the chunk's pieces spread over the lanes took
      // ~55 more registers of per-piece addresses at D = 128: 248 instead of 143)
      if constexpr (!kVWhole && !kBulk) {
        const bool ok = lane < n;
        const uint8_t* src = ok ? vg + (j0 + lane) * vstr : vg;
        uint8_t* dst = st + L::OFF_V + lane * VSTR;
#pragma unroll
        for (int c = 0; c < NPV; ++c) cp_async16(dst + 16 * c, src + 16 * c, ok);
      }
      const bool key_ok = lane < n;
      if constexpr (!kRegK && !kBulk)
        cp_async_n<2 * NB>(st + L::OFF_KS + 2 * NB * lane, key_ok ? ksg + (j0 + lane) * ksstr : ksg, key_ok);
      if constexpr (kVq && !kRegV && !kBulk)
        cp_async_n<2 * NB>(st + L::OFF_VS + 2 * NB * lane, key_ok ? vsg + (j0 + lane) * vsstr : vsg, key_ok);
    }
    cp_async_commit();
  };

  // Register staging (see StageMode): fetch() loads the register-staged parts of chunk `it` (evict-first), put()
  // stores them into a stage.
  using SRow = typename ScaleRow<2 * NB>::T;
  uint4 kr[kRegK ? NPK : 1], vr[kRegV ? NPV : 1];
  SRow ksr, vsr;
  auto fetch = [&](int it) {
    const int64_t j0 = kbeg + int64_t(w + int64_t(it) * nw) * kKC;
    const int n = int(kend - j0 < kKC ? kend - j0 : kKC);
    const int8_t* k0 = kl + j0 * kstr;
    const uint8_t* v0 = vl + j0 * vstr;
    const int64_t stepK = SR ? opaque(gStepK) : gStepK, stepV = SR ? opaque(gStepV) : gStepV;
    const bool full = n == kKC, key_ok = lane < n;
    if constexpr (kRegK) {
#pragma unroll
      for (int i = 0; i < NPK; ++i)
        kr[i] = full || 16 * (lane + 32 * i) < n * D ? ld_stream(reinterpret_cast<const uint4*>(k0 + i * stepK))
                                                     : zero_of<uint4>();
      ksr = key_ok ? ld_stream(reinterpret_cast<const SRow*>(ksg + (j0 + lane) * ksstr)) : zero_of<SRow>();
    }
    if constexpr (kRegV) {
#pragma unroll
      for (int i = 0; i < NPV; ++i)
        vr[i] = full || 16 * (lane + 32 * i) < n * VROW ? ld_stream(reinterpret_cast<const uint4*>(v0 + i * stepV))
                                                        : zero_of<uint4>();
      if constexpr (kVq)
        vsr = key_ok ? ld_stream(reinterpret_cast<const SRow*>(vsg + (j0 + lane) * vsstr)) : zero_of<SRow>();
    }
  };
  auto put = [&](uint8_t* st) {
    if constexpr (kRegK) {
#pragma unroll
      for (int i = 0; i < NPK; ++i) *reinterpret_cast<uint4*>(st + soff_k + i * kStepK) = kr[i];
      *reinterpret_cast<SRow*>(st + L::OFF_KS + 2 * NB * lane) = ksr;
    }
    if constexpr (kRegV) {
#pragma unroll
      for (int i = 0; i < NPV; ++i) *reinterpret_cast<uint4*>(st + soff_v + i * kStepV) = vr[i];
      if constexpr (kVq) *reinterpret_cast<SRow*>(st + L::OFF_VS + 2 * NB * lane) = vsr;
    }
  };

  // key starts of the chunks in flight (TMA / cp.async staging), oldest first; indices known at compile time only,
  // so they stay in registers
  int64_t jf[kDecodeMaxStages];
#pragma unroll
  for (int k = 0; k < kDecodeMaxStages; ++k) jf[k] = -1;

  // The warp's first two Q rows are loaded before the first chunks' copies are issued and quantized after them (the
  // latencies overlap: a further row loaded after a quantization adds a memory round trip to the block's prologue,
  // which short walks such as 512 keys in 2-warp blocks feel); warps of blocks with fewer than kRB / 2 warps take
  // their further rows after that. Rows past nrows (the mma's padding) are written as zeros without the
  // quantization's math.
  {
    const int r1 = w + nw;
    // chunk j (the next one produce() gave) into stage s: the first nst - 1 stages
    auto issue_first = [&](int s, int64_t j) {
#pragma unroll
      for (int k = 0; k < kDecodeMaxStages; ++k)
        if (k == s) jf[k] = j;
      issue(j, s);
    };
    int s0 = 0;  // stages issued before the Q rows are loaded
#if __CUDA_ARCH__ >= 900
    if (a.pdl) {  // launched while the prologue still writes Q and the new keys (sk - Sq on): older chunks go first
      if constexpr (kBulk) {
        for (; s0 < nst - 1; ++s0) {
          const int64_t j = peek();
          if (j < 0 || j + kKC > sk - a.Sq) break;
          produce();
          issue_first(s0, j);
        }
      }
      pdl_wait();
    }
#endif
    const QRow<D> q = q_load<D>(a, b, hkv, int(row0), nrows, w, lane);
    const QRow<D> q1 = q_load<D>(a, b, hkv, int(row0), nrows, r1, lane);  // no load past nrows
    if constexpr (SM != kStageCpAsync) {
      if (my_n > 0) fetch(0);
    }
    if constexpr (SM != kStageRegs) {
      for (int s = s0; s < nst - 1; ++s) issue_first(s, produce());
    }
    auto put_row = [&](const QRow<D>& x, int r) {
      if (r < nrows) q_quantize<D>(x, r, lane, qs, qsc);
      else q_zero<D>(r, lane, qs, qsc);
    };
    put_row(q, w);
    if (r1 < kRB) put_row(q1, r1);
#pragma unroll 1
    for (int r = r1 + nw; r < kRB; r += nw) put_row(q_load<D>(a, b, hkv, int(row0), nrows, r, lane), r);
  }
  decode_row_facts<kRB>(a, sk, b, hkv, row0, nrows, kmax_s, mrow_s);
  __syncthreads();

  // Q fragments of row g (the A operand; rows g + 8 are zero), its scales times scale * log2 e.
  uint32_t qa[NB][4];
  // The mma's A quads (a0, 0, a2, 0) per block. D = 128: the zeros come from an opaque 0 (nst >= 1) so that ptxas
  // builds the quads once instead of copying a0 / a2 next to fresh zeros for every mma (32 moves per chunk); D = 64
  // / 256 keep the literal (their register budgets spill with the 2 NB extra registers).
  const uint32_t zero = D == 128 ? uint32_t(a.nst) >> 31 : 0u;
  // q scale (q_scale23) and -M q (exact). D = 256 keeps the -M term with the key scales (L::kQBias false): 8 more
  // registers for -M q make ptxas spill ~300 bytes in most D = 256 kernels.
  constexpr bool kQBias = L::kQBias;
  float sqf[NB], sqm[kQBias ? NB : 1];
#pragma unroll
  for (int blk = 0; blk < NB; ++blk) {
    qa[blk][0] = *reinterpret_cast<const uint32_t*>(qs + g * D + 32 * blk + 4 * tq);
    qa[blk][2] = *reinterpret_cast<const uint32_t*>(qs + g * D + 32 * blk + 16 + 4 * tq);
    qa[blk][1] = qa[blk][3] = zero;
    if constexpr (kQBias) {
      sqf[blk] = q_scale23(qsc[g * NB + blk] * a.scale_log2);
      sqm[blk] = -kMagicF * sqf[blk];
    } else {
      sqf[blk] = qsc[g * NB + blk] * a.scale_log2;
    }
  }
  const int64_t kmax_g = kmax_s[g];
  const int64_t mrow_g = mrow_s[g];

  float acc[MT][4];
#pragma unroll
  for (int m = 0; m < MT; ++m) acc[m][0] = acc[m][1] = acc[m][2] = acc[m][3] = 0.f;
  float m_run = -INFINITY, l_run = 0.f;

  int s_use = 0, s_next = nst - 1;  // stage of chunk it, stage of chunk it + nst - 1
  uint32_t phases = 0;               // TMA: parity of each stage barrier's next phase
  for (int it = 0;; ++it) {
    int64_t j0;
    if constexpr (SM == kStageRegs) {  // one stage: chunk it from the registers, then chunk it + 1 into them
      if (it >= my_n) break;
      j0 = kbeg + int64_t(w + int64_t(it) * nw) * kKC;
      put(stages);
      __syncwarp();
      if (it + 1 < my_n) fetch(it + 1);
    } else {
      const int64_t jn = produce();  // chunk it + nst - 1
#pragma unroll
      for (int k = 0; k < kDecodeMaxStages; ++k)
        if (k == nst - 1) jf[k] = jn;
      j0 = jf[0];
      if (j0 < 0) break;  // then nothing is in flight: the chunks after a -1 are -1
#pragma unroll
      for (int k = 0; k + 1 < kDecodeMaxStages; ++k) jf[k] = jf[k + 1];
      if constexpr (SM == kStageRegsV) put(stages + s_use * L::STAGE);  // chunk it's V (its stage is free)
      issue(jn, s_next);
      s_next = s_next + 1 == nst ? 0 : s_next + 1;
      cp_async_wait_stages<kDecodeMaxStages>(nst);
      if constexpr (kBars) {
        mbar_wait(bars + 8 * s_use, (phases >> s_use) & 1u);
        phases ^= 1u << s_use;
      }
      __syncwarp();
      if constexpr (SM == kStageRegsV) {
        if (it + 1 < my_n) fetch(it + 1);
      }
    }

    const uint8_t* st = stages + s_use * L::STAGE;
    if constexpr (SM != kStageRegs) s_use = s_use + 1 == nst ? 0 : s_use + 1;
    const int n = chunk_n(j0);
    if constexpr (kBulk) {
      if (n < kKC) {  // rows past the range were not copied: zeros, as cp.async's zero fill
        uint8_t* z = const_cast<uint8_t*>(st);
        for (int e = lane; e < (kKC - n) * (KSTR / 16); e += 32)
          *reinterpret_cast<uint4*>(z + n * KSTR + 16 * e) = make_uint4(0u, 0u, 0u, 0u);
        for (int e = lane; e < (kKC - n) * (VSTR / 16); e += 32)
          *reinterpret_cast<uint4*>(z + L::OFF_V + n * VSTR + 16 * e) = make_uint4(0u, 0u, 0u, 0u);
        fence_proxy_async_smem();  // before a bulk copy rewrites these bytes
        __syncwarp();
      }
    }
    if constexpr (kTma && VK == kVF16) {
      if (n < kKC) {  // keys past the range: the TMA read real rows there (or uninitialised cache), zero them
        uint8_t* vz = const_cast<uint8_t*>(st) + L::OFF_V;
        for (int e = lane; e < (kKC - n) * (VROW / 16); e += 32)
          *reinterpret_cast<uint4*>(vz + row_byte<VROW, VSTR, true>(n + e / (VROW / 16), 16 * (e % (VROW / 16)))) =
              make_uint4(0u, 0u, 0u, 0u);
        fence_proxy_async_smem();  // before the TMA rewrites these bytes
        __syncwarp();
      }
    }

    // ---- V-poisoned keys and q8_0 / q4_0 scales past the float16 limit ------------------------------------------
    // Lane = key. A V-poisoned key (vendor.h) gets a NaN K scale here, before the K scale table is made: its logit
    // is then NaN, and the K side of the policy (masking turns hidden keys to -inf, NaN logits poison the rows that
    // see them) does the rest without a further instruction on the hot path; its V enters P.V as zeros.
    // q8_0 / q4_0: one compare per scale pair finds both NaN scales and scales past the limit; only then (rare,
    // warp-uniform) the NaN ones are told apart and zeroed. float16 V: one HFMA2 per word over the chunk
    // (0 x Inf / NaN = NaN), then, only if some lane found one, each lane its key's row. Keys past the chunk's range
    // are zeros here (zero-filled or zeroed above).
    bool vbig = false;
    float pshift = 0.f;  // this chunk's p are 2^pshift times their value (q8_0 / q4_0 scales past the limit)
    uint16_t* kbad = reinterpret_cast<uint16_t*>(const_cast<uint8_t*>(st)) + KS_OFF + KS_STEP * lane;
    if constexpr (kVq) {
      uint16_t* vsk = reinterpret_cast<uint16_t*>(const_cast<uint8_t*>(st)) + VS_OFF + VS_STEP * lane;
      bool past = false;
#pragma unroll
      for (int i = 0; i < NB / 2; ++i) past |= scales_past_limit<VK>(reinterpret_cast<const uint32_t*>(vsk)[i]);
      vbig = __any_sync(0xffffffffu, past);
      if (vbig) {
        uint32_t smax = 0;
#pragma unroll 1
        for (int blk = 0; blk < NB; ++blk) {
          if (half_nonfinite(vsk[blk])) {
            vsk[blk] = 0;
            kbad[0] = uint16_t(0x7e00u);
          }
          smax = max(smax, uint32_t(vsk[blk] & 0x7fffu));
        }
        // A scale past the limit: this chunk's V scales times 2^-k and its p times 2^k (pshift; exact: such scales
        // stay normal, and only scales below 2^(k - 14) lose low bits), so no dequantized value passes float16.
        int k = 0;
        for (float sm = h2f(uint16_t(__reduce_max_sync(0xffffffffu, smax))); sm > v_scale_limit<VK>(); sm *= 0.5f) ++k;
        if (k > 0) {
          const float f = __int_as_float((127 - k) << 23);  // 2^-k
#pragma unroll 1
          for (int blk = 0; blk < NB; ++blk) vsk[blk] = f2h(h2f(vsk[blk]) * f);
          pshift = float(k);
        }
        if constexpr (kBulk) fence_proxy_async_smem();  // the scales rewritten above, before a bulk copy rewrites them
      }
    } else {
      const uint8_t* vp = st + (kTma ? L::OFF_V + 16 * lane : soff_v);  // the copy's own 16-byte pieces (no padding)
      constexpr int kStep = kTma ? 512 : kStepV;
      const __half2 zero2 = __float2half2_rn(0.f);
      __half2 nf = zero2;
#pragma unroll 4
      for (int i = 0; i < NPV; ++i) {
        const uint4 u = *reinterpret_cast<const uint4*>(vp + i * kStep);
        nf = __hfma2(*reinterpret_cast<const __half2*>(&u.x), zero2, nf);
        nf = __hfma2(*reinterpret_cast<const __half2*>(&u.y), zero2, nf);
        nf = __hfma2(*reinterpret_cast<const __half2*>(&u.z), zero2, nf);
        nf = __hfma2(*reinterpret_cast<const __half2*>(&u.w), zero2, nf);
      }
      if (__any_sync(0xffffffffu, (*reinterpret_cast<const uint32_t*>(&nf) & 0x7fff7fffu) != 0u)) {
        uint8_t* vrow = const_cast<uint8_t*>(st) + L::OFF_V;
        uint32_t bad = 0;
#pragma unroll 1
        for (int c = 0; c < VROW; c += 16) {
          const uint4 u = *reinterpret_cast<const uint4*>(vrow + row_byte<VROW, VSTR, kTma>(lane, c));
          bad |= halves_nonfinite(u.x) | halves_nonfinite(u.y) | halves_nonfinite(u.z) | halves_nonfinite(u.w);
        }
        __syncwarp();  // every lane's reads before the zeroing
        if (bad != 0u) {
          kbad[0] = uint16_t(0x7e00u);
#pragma unroll 1
          for (int c = 0; c < VROW; c += 16)
            *reinterpret_cast<uint4*>(vrow + row_byte<VROW, VSTR, kTma>(lane, c)) = make_uint4(0u, 0u, 0u, 0u);
        }
        if constexpr (kTma) fence_proxy_async_smem();  // before the TMA rewrites these bytes
      }
    }
    __syncwarp();  // the zeroed V and the NaN K scales before the other lanes read them

    // ---- the chunk's K scales: float4 (block, step jp, lane tq) = keys 16 jp + 2 tq + (0, 1, 8, 9), the keys of
    // that lane's n tiles 2 jp and 2 jp + 1 (one 16-byte load per step and lane in the Q.K) ----
    {
      const uint16_t* kss = reinterpret_cast<const uint16_t*>(st) + KS_OFF;
      if constexpr (kQBias) {
#pragma unroll
        for (int e = lane; e < NB * 8; e += 32)
          ksf[e] = k_scale_quad<NB, KS_STEP>(kss, e >> 3, 16 * ((e >> 2) & 1) + 2 * (e & 3));  // (blk, jp, tq) = e
      } else {  // (sk, -M sk) per (block, key pair)
#pragma unroll
        for (int e = lane; e < NB * 16; e += 32) {
          const int blk = e >> 4, kp = e & 15;
          const float s0 = h2f(kss[(2 * kp) * KS_STEP + blk]), s1 = h2f(kss[(2 * kp + 1) * KS_STEP + blk]);
          ksf[e] = make_float4(s0, s1, -kMagicF * s0, -kMagicF * s1);
        }
      }
    }
    __syncwarp();

    // ---- Q.K: x[j][e] = logit (log2 units) of row g, key 8j + 2tq + e ----
    float x[4][2];
#pragma unroll
    for (int j = 0; j < 4; ++j) x[j][0] = x[j][1] = 0.f;
#pragma unroll
    for (int blk = 0; blk < NB; ++blk) {
#pragma unroll
      for (int jp = 0; jp < 2; ++jp) {  // n tiles 2jp, 2jp + 1 (keys 16jp .. 16jp + 15)
        uint32_t r0, r1, r2, r3;
        ldsm_x4(smem_u32(st + row_byte<D, KSTR, kTma>(16 * jp + (lane & 7) + 8 * (lane >> 4),
                                                      32 * blk + 16 * ((lane >> 3) & 1))),
                r0, r1, r2, r3);
        const float4 f = kQBias ? ksf[blk * 8 + 4 * jp + tq] : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int j = 2 * jp + h;
          int c[4];
          mma_s8_rows8(c, qa[blk], h ? r2 : r0, h ? r3 : r1);
          if constexpr (kQBias) {
            x[j][0] = fmaf(fmaf(bits_f(uint32_t(c[0])), sqf[blk], sqm[blk]), h ? f.z : f.x, x[j][0]);
            x[j][1] = fmaf(fmaf(bits_f(uint32_t(c[1])), sqf[blk], sqm[blk]), h ? f.w : f.y, x[j][1]);
          } else {
            const float4 p = ksf[blk * 16 + 4 * j + tq];
            x[j][0] = fmaf(sqf[blk], fmaf(bits_f(uint32_t(c[0])), p.x, p.z), x[j][0]);
            x[j][1] = fmaf(sqf[blk], fmaf(bits_f(uint32_t(c[1])), p.y, p.w), x[j][1]);
          }
        }
      }
    }

    // ---- masking (only chunks some row does not fully see, or explicit masks) ----
    const bool check = a.mask_kind != 0 || n < kKC || j0 + kKC - 1 > kmin_all;
    if (check) {
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int key = 8 * j + 2 * tq + e;
          const int64_t jg = j0 + key;
          bool vis = key < n && jg <= kmax_g;
          if (vis && a.mask_kind != 0) {
            const int64_t mo = mrow_g + jg * a.ms3;
            if (a.mask_kind == 1) vis = static_cast<const uint8_t*>(a.mask)[mo] != 0;
            else {  // additive, log2 units; -inf hides the key (even a NaN logit)
              const float mv = load_t(a.mask, mo, a.half);
              vis = mv != -INFINITY;
              x[j][e] += mv * kLog2e;
            }
          }
          if (!vis) x[j][e] = -INFINITY;
        }
    }

    // ---- online softmax (log2 domain): row g's max over the quad, sum per thread ----
    float cmax = fmaxf(fmaxf(fmaxf(x[0][0], x[0][1]), fmaxf(x[1][0], x[1][1])),
                       fmaxf(fmaxf(x[2][0], x[2][1]), fmaxf(x[3][0], x[3][1])));
    cmax = fmaxf(cmax, __shfl_xor_sync(0xffffffffu, cmax, 1));
    cmax = fmaxf(cmax, __shfl_xor_sync(0xffffffffu, cmax, 2));
    const float m_new = fmaxf(m_run, cmax);
    const float m_use = m_new == -INFINITY ? 0.f : m_new;
    const float alpha = ex2(m_run - m_use);
    const float m_p = m_use - pshift;
    float p[4][2], psum = 0.f;
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        p[j][e] = ex2(x[j][e] - m_p);
        psum += p[j][e];
      }
    l_run = l_run * alpha + psum * ex2(-pshift);
    m_run = m_new;
    // The accumulator holds rows 2tq, 2tq + 1 (owned by lanes 8tq, 8tq + 4): their alphas.
    const float al0 = __shfl_sync(0xffffffffu, alpha, 8 * tq), al1 = __shfl_sync(0xffffffffu, alpha, 8 * tq + 4);
    if (__any_sync(0xffffffffu, alpha != 1.f)) {  // after the first chunks the running max rarely moves
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        acc[m][0] *= al0; acc[m][1] *= al1; acc[m][2] *= al0; acc[m][3] *= al1;
      }
    }

    // ---- P.V: O^T += V^T P^T per 16 keys ----
    const uint8_t* vt = st + L::OFF_V;
    const uint32_t pbs[4] = {pack_h2(p[0][0], p[0][1]), pack_h2(p[1][0], p[1][1]), pack_h2(p[2][0], p[2][1]),
                             pack_h2(p[3][0], p[3][1])};
    // D = 256: one 16-key step at a time (a rolled loop), else ptxas keeps both steps' fragments live and spills.
#pragma unroll(D > 128 ? 1 : 2)
    for (int kk = 0; kk < 2; ++kk) {
      const uint32_t pb0 = kk ? pbs[2] : pbs[0], pb1 = kk ? pbs[3] : pbs[1];
      if constexpr (VK == kVF16) {
        const int vr_row = 16 * kk + (lane & 7) + 8 * (lane >> 4), vr_col = 16 * ((lane >> 3) & 1);
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          uint32_t av[4];
          ldsm_x4_t(smem_u32(vt + row_byte<VROW, VSTR, kTma>(vr_row, vr_col + 32 * m)), av[0], av[1], av[2], av[3]);
          mma_f16(acc[m], av, pb0, pb1);
        }
      } else if constexpr (VK == kVQ6) {
        // thread g's D / 8 columns [c0, c0 + D / 8) lie in 32-block c0 / 32 (24 bytes): D / 64 words of low nibbles
        // from byte (c0 % 32) / 2, and the block's 8 bytes of high pairs, shifted by 2 (c0 % 32 / 8) once per key
        constexpr int TW = D / 64;
        const int k0 = 16 * kk + 2 * tq, c0 = g * (D / 8);
        const int bt = c0 / 32, lo_off = 24 * bt + (c0 & 31) / 2, hsh = 2 * ((c0 & 31) >> 3);
        __half2 h01, h89;
        v_scale_pairs<VS_STEP>(reinterpret_cast<const uint16_t*>(st) + VS_OFF, k0, bt, h01, h89);
        uint32_t wl[4][TW], wh[4][2];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int key = k0 + (q & 1) + 8 * (q >> 1);  // k0, k0 + 1, k0 + 8, k0 + 9
          const uint8_t* row = vt + key * VSTR;
#pragma unroll
          for (int i = 0; i < TW; i += 2) {
            if constexpr (TW == 1) {
              wl[q][0] = *reinterpret_cast<const uint32_t*>(row + lo_off);
            } else {
              const uint2 u = *reinterpret_cast<const uint2*>(row + lo_off + 4 * i);
              wl[q][i] = u.x; wl[q][i + 1] = u.y;
            }
          }
          const uint2 h = *reinterpret_cast<const uint2*>(row + 24 * bt + 16);
          wh[q][0] = h.x >> hsh; wh[q][1] = h.y >> hsh;
        }
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          uint32_t av[4];
          av[0] = hmul2_u(level_pair_q6(wl[0], wl[1], wh[0], wh[1], 2 * m), h01);
          av[1] = hmul2_u(level_pair_q6(wl[0], wl[1], wh[0], wh[1], 2 * m + 1), h01);
          av[2] = hmul2_u(level_pair_q6(wl[2], wl[3], wh[2], wh[3], 2 * m), h89);
          av[3] = hmul2_u(level_pair_q6(wl[2], wl[3], wh[2], wh[3], 2 * m + 1), h89);
          mma_f16(acc[m], av, pb0, pb1);
        }
      } else {
        constexpr int TW = (VK == kVQ8 ? D / 8 : D / 16) / 4;  // words of a thread's columns per key
        constexpr int GW = TW < 4 ? TW : 4, NG = TW / GW, MPG = MT / NG;  // words / M tiles per load group
        const int k0 = 16 * kk + 2 * tq;
        // V scales of the thread's block for the four keys, as (k0, k0+1) and (k0+8, k0+9) f16 pairs.
        __half2 h01, h89;
        v_scale_pairs<VS_STEP>(reinterpret_cast<const uint16_t*>(st) + VS_OFF, k0, (g * (D / 8)) / 32, h01, h89);
#pragma unroll
        for (int gi = 0; gi < NG; ++gi) {
          uint32_t wv[4][GW];
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const int key = k0 + (q & 1) + 8 * (q >> 1);  // k0, k0 + 1, k0 + 8, k0 + 9
            const uint32_t* src =
                reinterpret_cast<const uint32_t*>(vt + row_byte<VROW, VSTR, kTma>(key, g * (TW * 4) + gi * GW * 4));
            if constexpr (GW == 4) {
              const uint4 u = *reinterpret_cast<const uint4*>(src);
              wv[q][0] = u.x; wv[q][1] = u.y; wv[q][2] = u.z; wv[q][3] = u.w;
            } else if constexpr (GW == 2) {
              const uint2 u = *reinterpret_cast<const uint2*>(src);
              wv[q][0] = u.x; wv[q][1] = u.y;
            } else {
              wv[q][0] = src[0];
            }
          }
          // M tile m: row g is local column 2m, row g + 8 is 2m + 1 (one byte pair / one nibble pair).
#pragma unroll
          for (int mi = 0; mi < MPG; ++mi) {
            uint32_t av[4];
            av[0] = hmul2_u(level_pair<VK, D != 256>(wv[0], wv[1], 2 * mi), h01);
            av[1] = hmul2_u(level_pair<VK, D != 256>(wv[0], wv[1], 2 * mi + 1), h01);
            av[2] = hmul2_u(level_pair<VK, D != 256>(wv[2], wv[3], 2 * mi), h89);
            av[3] = hmul2_u(level_pair<VK, D != 256>(wv[2], wv[3], 2 * mi + 1), h89);
            mma_f16(acc[gi * MPG + mi], av, pb0, pb1);
          }
        }
      }
    }
    __syncwarp();  // the stage and the K scale table are rewritten by the next iteration
  }
  cp_async_wait<0>();
#if __CUDA_ARCH__ >= 900
  // split_k: the merge kernel may launch once every block got here (it waits for this grid's completion:
  // programmatic dependent launch), so its blocks arrive during the combines below. Triggered at the start of the
  // kernel, they would sit resident through the whole key walk, which makes long walks (128k keys) slower.
  if (a.part_acc != nullptr) pdl_launch_dependents();
#endif

  // ---- combine the warps in shared memory, then the rows / partials ----
  l_run += __shfl_xor_sync(0xffffffffu, l_run, 1);
  l_run += __shfl_xor_sync(0xffffffffu, l_run, 2);
  __syncthreads();  // every warp is done with its stages: they become the combine buffer
  float* red = reinterpret_cast<float*>(smem + L::off_warps(nw));  // [nw][8][D]
  if (tq == 0) {
    wm[w * kRB + g] = m_run;
    wl[w * kRB + g] = l_run;
  }
  float* r0p = red + (w * kRB + 2 * tq) * D;
  float* r1p = r0p + D;
  const bool st0 = 2 * tq < nrows, st1 = 2 * tq + 1 < nrows;  // the mma's padding rows are never read
#pragma unroll
  for (int m = 0; m < MT; ++m) {
    const int c0 = (VK == kVF16 ? 16 * m + g : g * (D / 8) + 2 * m) ^ (4 * tq);  // ^ 4 tq: red_swz
    const int c1 = (VK == kVF16 ? 16 * m + 8 + g : g * (D / 8) + 2 * m + 1) ^ (4 * tq);
    if (st0) {
      r0p[c0] = acc[m][0];
      r0p[c1] = acc[m][2];
    }
    if (st1) {
      r1p[c0] = acc[m][1];
      r1p[c1] = acc[m][3];
    }
  }
  __syncthreads();
#if __CUDA_ARCH__ >= 900
  if constexpr (CL) {  // the cluster's blocks (its key splits) merge through distributed shared memory
    rows_finish_cluster<D>(a, wm, wl, red, reinterpret_cast<float*>(smem + L::OFF_BML), nw, nrows, int(row0), b, hkv,
                           int(a.n_splits), split);
    __cluster_barrier_arrive();  // no block leaves while the others may still read its shared memory
    __cluster_barrier_wait();
    return;
  }
#endif
  rows_finish<D>(a, wm, wl, red, nw, nrows, int(row0), split, b, hkv);
#endif
}

}  // namespace dmma
}  // namespace gpu
}  // namespace dot4attn

#endif  // D4A_CUDA
