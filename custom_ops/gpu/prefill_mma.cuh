// Dot4Attention prefill on NVIDIA tensor cores (sm_80+), FlashAttention-2 style. CUDA only: HIP builds (and
// any shape this kernel does not take) keep the scalar tile kernel of attention_tile.cuh.
//
// Block = 4 warps = 64 rows of one (batch, KV head) row space (rows are (grouped query head, query row) pairs,
// exactly like the tile kernel, so GQA shares every K/V tile among the group's heads); each warp owns 16 rows
// (one mma M tile) for the whole key walk, so the online softmax state lives in registers. Keys are walked in
// 64-key tiles through an nst-stage cp.async pipeline (K payload, raw V, fp16 scale runs).
//
//  * Q.K: int8 Q (quantized per 32-block on the fly, float32 scale, as the contract says) x int8 K with
//    mma.m16n8k32.s8.s8.s32, one mma per (16 rows x 8 keys x one 32-block) because each block has its own
//    scales. The int32 accumulator starts at 0x4B400000 (the float M = 1.5 * 2^23): |dot| <= 32*127*127 < 2^22,
//    so its bits read as a float are exactly M + dot, and fma(c, q, -M q) == q*dot rounded once (q = the Q block
//    scale * scale * log2 e with its last bit cleared, q_scale23, so -M q is exact). That turns int->float
//    conversion (quarter rate) + two multiplies into two full-rate FFMAs per element and block:
//    logit2 += fma(c, q, -M q) * sk. q and -M q stay in registers; the K scales of a tile are spread once per block
//    into one float4 per (block, 16-key step, quad lane) in shared memory (k_scales): one 16-byte load per step.
//    (With -M sk on the key side every step would load two float4, and those loads alone would be half of the
//    kernel's shared-memory wavefronts, and an 8k causal prefill ~7 % slower.)
//    K fragments come straight from the int8 rows by ldmatrix (rows padded to D+16 bytes: conflict free).
//  * online softmax in registers (log2 domain, ex2.approx), each thread owns 2 rows x 16 keys of the tile; the
//    row sum stays per thread until the end (quad reduce once). At D >= 128 the running max moves only by more
//    than 2^8 (kMaxSlack, kLazyMax), so O is rescaled on few tiles: 6 % fewer instructions, an 8k causal prefill
//    (32, 8, 128) 2-3 % faster, the output within NMSE 8e-8 of the exact max's. Prefix tiles that every row of the
//    warp sees skip all masking; only the causal diagonal / Sk tail / explicit masks check per element.
//  * P.V: P rounded to f16 in registers (the QK accumulator layout is the A fragment layout of m16n8k16), V as
//    f16 in shared memory read by ldmatrix.trans, mma.m16n8k16.f32.f16.f16.f32 (float32 accumulation). On sm_90a
//    (D = 64 / 128, TMA tiles) the block's 4 warps (one warpgroup) instead issue one wgmma.m64nDk16 per 16 keys
//    with P from registers and V from shared memory in the MN-major 128-byte-swizzle layout: the f16 V tile as
//    the TMA lands it, or the buffer q8_0 / q4_0 V is dequantized into in that same layout. 4 instructions per
//    warp and tile instead of 64 mma.sync + 32 ldmatrix, and no V fragment registers, which lets 3 blocks per SM
//    fit (see MINB). float16 V is copied as is; q8_0 / q4_0 are dequantized (value * scale, one f16 rounding,
//    exact levels via the 0x6400|n trick) once per tile by the whole block into one buffer. float32 T (and so
//    float32 V) stays on the tile kernel (see try_prefill_mma).
//    Accuracy: f16 P and f16 V each add ~2^-12 relative error per term, NMSE ~1e-7 (contract bound 1e-6).
//  * causal: heaviest query chunks launch first (position-major block order when Sq % 64 == 0), a block stops
//    at the last key its rows can see, a warp skips tiles its rows cannot see at all (exact: p would be 0).
//  * V-poisoned keys (docs/ops.md, vendor.h): each thread checks the V it prepares for a tile (float16: one HFMA2
//    per word, a pass over the whole tile since the wgmma P.V never holds V in registers; when the plan scans V first
//    (v_scan.cuh), only the VC instance that runs the flagged heads has the check; q8_0 / q4_0: one compare per scale
//    during their conversion, which finds scales past the float16 limit too) and the barrier that publishes the
//    tile ORs the answers (__syncthreads_or). q8_0 / q4_0 chunks with such a scale are converted
//    again by their thread (rare): a NaN / Inf scale as 0, values clamped to +-65504. Only a tile that holds a
//    poisoned key (block-uniform) takes the slow branch: thread j checks key j (zeroing the NaN / Inf halves of a
//    float16 row, so p = 0 times its V stays 0) and makes a bad key's K scale NaN in the tile's K scale table
//    (ksf_poison): its logit is NaN, and the K side's masking and softmax do the rest.
//
//  * D <= 128 (Q in registers): one block barrier per tile (Traits::kPipe layout): the K scales and f16 V
//    of tile t+1 are prepared at the end of tile t into double buffers; raw q8_0 / q4_0 V is converted by the
//    thread that copied it (no barrier needed), the scale runs arrive one tile ahead. D = 256 keeps two barriers.
//    On sm_90 (TMA = true) the K / V tiles of this layout come by tensor-map TMA instead of cp.async: one thread
//    issues 2-3 copies per tile into dense, XOR-swizzled tiles and every thread waits on the ring slot's mbarrier;
//    the ldmatrix addresses follow the swizzle. The 12 cp.async per thread and tile, with their address
//    arithmetic, would cost ~10 % of the kernel's time.
// Shared memory per block (D=128, f16 V, 2 stages): 66 KB. Registers: up to 255 by default (MINB = 2: 2 blocks, 8 warps
// per SM of 64K registers), because the double-buffered ldmatrix fragments do not fit the 168 of 3 blocks per SM (ptxas
// then spills and keeps one fragment set, and every mma waits for shared memory: ~7 % slower). The wgmma P.V path
// is the exception: without V fragments it runs 3 blocks per SM at 168 registers (MINB = 3, 12 warps per SM),
// ~7 % faster than 2 blocks at 8k keys.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "gpu/attention_tile.cuh"
#include "gpu/mma_primitives.cuh"
#include "gpu/tma.cuh"

#if defined(D4A_CUDA)
#define D4A_HAS_PREFILL_MMA 1

namespace dot4attn {
namespace gpu {
namespace pmma {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kKeys = 64;           // keys per tile
// The running max of a row moves only by more than this (log2 units): P stays <= 2^8, and O is rescaled only then.
constexpr float kMaxSlack = 8.f;

// MT: 16-row m tiles per warp (1: 64 rows per block; 2: 128 rows, every K / V fragment read from shared memory
// feeds two mmas: half the ldmatrix traffic per row, more registers).
template <int VK, int D, int MT>
struct Traits {
  // Float V is T, and this kernel takes float16 T only (try_prefill_mma): V is f16, q8_0 or q4_0.
  static_assert(VK != kVF32, "the tensor-core prefill takes float16 T, so V is never float32");
  static constexpr int kRows = 16 * MT * kWarps;  // query rows per block
  static constexpr int NB = D / 32;
  static constexpr int KSTR = D + 16;      // K row bytes in shared memory (+16: ldmatrix conflict free)
  static constexpr int QSTR = D + 16;      // int8 Q row bytes
  static constexpr int VSTR = 2 * D + 16;  // f16 V row bytes
  static constexpr bool kConv = VK != kVF16;               // V needs converting to f16
  static constexpr bool kVq = VK == kVQ8 || VK == kVQ4;    // V has block scales
  static constexpr int VRAW = kConv ? v_row_bytes(VK, D) : VSTR;  // V row bytes in a stage
  static constexpr int ST_K = kKeys * KSTR;
  static constexpr int ST_V = kKeys * VRAW;
  static constexpr int ST_KS = kKeys * NB * 2;
  static constexpr int ST_VS = kVq ? kKeys * NB * 2 : 0;
  static constexpr int STAGE = ST_K + ST_V + ST_KS + ST_VS;  // every part a multiple of 16 bytes
  static constexpr int OFF_Q = 0;                             // int8 [kRows][QSTR]
  static constexpr int OFF_SQ = OFF_Q + kRows * QSTR;         // float [kRows][NB] Q block scales
  static constexpr int KSF_N = NB * 16;                       // float4 of K scales per tile (k_scales)
  static constexpr int OFF_KSF = OFF_SQ + kRows * NB * 4;     // float4 [NB][4 n-tile pairs][4 tig]
  static constexpr int OFF_VH = OFF_KSF + KSF_N * 16;         // f16 [64][VSTR] converted V (kConv only)
  static constexpr int OFF_ST = OFF_VH + (kConv ? kKeys * VSTR : 0);
  static constexpr bool kQReg = D * MT <= 128;  // Q fragments in registers (else reloaded from shared memory)
  static int smem_bytes(int nst) { return OFF_ST + nst * STAGE; }
  // Pipelined layout (kPipe: Q in registers, f16 / q8_0 / q4_0 V): one block barrier per tile. K (and f16 V) in a
  // 2-slot ring, the fp16 scale runs one tile ahead in their own 2 slots, raw q8_0 / q4_0 V in one buffer (each
  // thread converts exactly the chunks it copied), KSF and the f16 V double-buffered. Q / SQ are only read in
  // the prologue, so they overlay the second f16 V buffer where they fit.
  static constexpr bool kPipe = kQReg;
  static constexpr int P_KSF = 0;                   // float4 [2][KSF_N]
  static constexpr int P_VHB = kKeys * VSTR;        // one f16 V buffer
  static constexpr int P_VH = P_KSF + 2 * KSF_N * 16;  // f16 [2][64][VSTR] (kConv)
  static constexpr int QBYTES = kRows * QSTR + kRows * NB * 4;
  static constexpr bool kQOver = kConv && QBYTES <= P_VHB;
  static constexpr int P_Q = kQOver ? P_VH + P_VHB : P_VH + (kConv ? 2 * P_VHB : 0);
  static constexpr int P_SQ = P_Q + kRows * QSTR;
  static constexpr int P_VR = kQOver ? P_VH + 2 * P_VHB : P_SQ + kRows * NB * 4;  // raw V [64][VRAW] (kConv)
  static constexpr int RING = ST_K + (kConv ? 0 : ST_V);  // K (+ f16 V) of one tile
  static constexpr int P_RING = P_VR + (kConv ? ST_V : 0);
  static constexpr int SC = ST_KS + ST_VS;  // scale runs of one tile
  static constexpr int P_SC = P_RING + 2 * RING;
  static constexpr int pipe_bytes = P_SC + 2 * SC;
  // TMA layout (sm_90, kPipe): the K tile and the V tile (f16, or raw q8_0 / q4_0) arrive by tensor copies, dense
  // rows with the hardware's XOR swizzle (tma_row_byte), so the ring slots and the raw V buffer are 1024-byte
  // aligned (the swizzle period) and the base is aligned at run time (1024 bytes of slack). Two mbarriers, one per
  // ring slot. KSF, the converted f16 V and Q / SQ keep the pipelined layout's offsets.
  static constexpr int VROW = v_row_bytes(VK, D);
  static constexpr int T_KT = kKeys * D;     // one tensor box of 64 rows x D bytes (D <= 128)
  static constexpr int T_VT = kKeys * VROW;  // slabs of 64 rows x min(VROW, 128) bytes
  static constexpr int T_RING = up1024(T_KT + (kConv ? 0 : T_VT));
  static constexpr int T_VR = up1024(P_VR);
  static constexpr int T_RINGO = up1024(T_VR + (kConv ? T_VT : 0));
  // P.V by wgmma (m64nDk16, P from registers, V as an MN-major 128-byte-swizzled operand): f16 V straight from its
  // TMA tile (the operand as it lands), q8_0 / q4_0 from the f16 buffer prep_pipe writes in that same layout; one m
  // tile per warp (the warpgroup's 64 rows are the instruction's M).
  static constexpr bool kWgmma = MT == 1 && (D == 64 || D == 128);
  // the converted V buffers are wgmma operands with a 1024-byte swizzle period (the kernel aligns smem to it)
  static_assert(!kWgmma || !kConv || (P_VH % 1024 == 0 && P_VHB % 1024 == 0), "f16 V buffers off the swizzle period");
  static constexpr int T_SC = T_RINGO + 2 * T_RING;
  static constexpr int T_BAR = T_SC + 2 * SC;
  static constexpr int tma_bytes = T_BAR + 16 + 1024;
  // QK16 layout (Q.K on f16 wgmma from K's float16 copy, k_dequant.cuh; float16 V, TMA, wgmma): no scale runs, no K
  // scale table. Two ring slots of [K tile: 64 keys x 2 D bytes | V tile: 64 keys x 2 D bytes], both as 128-byte slabs
  // in the TMA's swizzle (K: the K-major operand of the Q.K, V: the MN-major operand of the P.V), then the two
  // mbarriers. Q's int8 rows and block scales are only read in the prologue, before the first copy into slot 1, so
  // they overlay that slot: 3 blocks per SM fit (D = 128: 66,576 bytes a block).
  static constexpr int Q16_KT = kKeys * 2 * D;
  static constexpr int Q16_RING = up1024(Q16_KT + T_VT);
  static constexpr int Q16_Q = Q16_RING;                 // int8 Q [kRows][QSTR], then float SQ [kRows][NB]
  static constexpr int Q16_SQ = Q16_Q + kRows * QSTR;
  // At D = 64 the Q.K's float16 A fragments of every thread (16 bytes per k step) also sit in bytes of their own, and
  // each tile's Q.K loads them from there: kept in registers through the key loop, ptxas (13.0) gave those registers
  // to the P fragments at D = 64, so every tile after the first multiplied K by the previous tile's P (at D = 128 it
  // keeps them; the overlapped schedule below is right at D = 64 too).
  static constexpr int Q16_QH = 2 * Q16_RING;
  static constexpr int Q16_BAR = Q16_QH + (D == 64 ? kThreads * (D / 16) * 16 : 0);
  static constexpr int qk16_bytes = Q16_BAR + 16 + 1024;
  // QK16 with 2 blocks per SM (MINB = 2, up to 255 registers): the Q.K of tile t + 1 runs on the tensor cores while
  // the softmax of tile t runs (FlashAttention-3's intra-warpgroup overlap), which needs tile t + 1's K while tile t's
  // V is still read and tile t + 2 is in flight: three ring slots, Q on the third, three mbarriers (D = 128: 99,360
  // bytes a block).
  static constexpr int Q16P_Q = 2 * Q16_RING;
  static constexpr int Q16P_SQ = Q16P_Q + kRows * QSTR;
  static constexpr int Q16P_BAR = 3 * Q16_RING;
  static constexpr int qk16p_bytes = Q16P_BAR + 32 + 1024;
  static_assert(VK != kVF16 || MT != 1 || kRows * QSTR + kRows * NB * 4 <= Q16_RING, "Q does not fit ring slot 1");
};

// One 32-block's int8 Q.K partials of a thread's two n tiles (c0: keys j, j + 1 of rows gid, gid + 8; c1: keys j + 8,
// j + 9), magic-biased int32 bits (kMagicI), into its logits s0 / s1: (q dot) rounded once, then times the key's
// scale, fma(fma(c, q, -q M), sk, s); q0 / q1 the rows' Q block scale (times scale * log2 e), m = -M q, k the four
// keys' K scales (k_scale_quad's order).
__device__ __forceinline__ void scale_block_pair(float* s0, float* s1, const int* c0, const int* c1, float q0, float q1,
                                                 float m0, float m1, float4 k) {
  s0[0] = fmaf(fmaf(__int_as_float(c0[0]), q0, m0), k.x, s0[0]);
  s0[1] = fmaf(fmaf(__int_as_float(c0[1]), q0, m0), k.y, s0[1]);
  s0[2] = fmaf(fmaf(__int_as_float(c0[2]), q1, m1), k.x, s0[2]);
  s0[3] = fmaf(fmaf(__int_as_float(c0[3]), q1, m1), k.y, s0[3]);
  s1[0] = fmaf(fmaf(__int_as_float(c1[0]), q0, m0), k.z, s1[0]);
  s1[1] = fmaf(fmaf(__int_as_float(c1[1]), q0, m0), k.w, s1[1]);
  s1[2] = fmaf(fmaf(__int_as_float(c1[2]), q1, m1), k.z, s1[2]);
  s1[3] = fmaf(fmaf(__int_as_float(c1[3]), q1, m1), k.w, s1[3]);
}

// The K scales of a 64-key tile as one float4 per (32-block, 16-key step np, quad lane tig): the four keys a
// thread's two Q.K n tiles of that step hold (16 np + 2 tig + {0, 1, 8, 9}), from the fp16 scale run [64][NB]. One
// 16-byte load per step and thread: every 4 bytes a thread loads from shared memory costs a wavefront whatever the
// broadcast, and if they also carried -M sk these loads alone would be half of the kernel's shared-memory wavefronts.
template <int NB>
__device__ __forceinline__ void k_scales(const uint16_t* kst, float4* ksf, int tid) {
  constexpr int N = NB * 16;
#pragma unroll
  for (int it = 0; it < (N + kThreads - 1) / kThreads; ++it) {  // a fixed trip count (no tid-bound loop)
    const int e = tid + it * kThreads;
    if (N % kThreads != 0 && e >= N) break;
    ksf[e] = k_scale_quad<NB>(kst, e / 16, 16 * ((e / 4) % 4) + 2 * (e % 4));  // (blk, np, tig) = e
  }
}

// 8 f16 values (one 16-byte store) from 8 unsigned bytes u0, u1 (levels + offset), times the block scale s:
// each byte b becomes the f16 1024 + b (0x64 high byte), minus bias = 1024 + offset in both halves, exactly.
__device__ __forceinline__ uint4 bytes8_to_f16(uint32_t u0, uint32_t u1, uint32_t bias, __half2 s) {
  uint4 o;
  o.x = hmul2_u(hsub2_u(__byte_perm(u0, 0x64646464u, 0x4140), bias), s);
  o.y = hmul2_u(hsub2_u(__byte_perm(u0, 0x64646464u, 0x4342), bias), s);
  o.z = hmul2_u(hsub2_u(__byte_perm(u1, 0x64646464u, 0x4140), bias), s);
  o.w = hmul2_u(hsub2_u(__byte_perm(u1, 0x64646464u, 0x4342), bias), s);
  return o;
}

// 8 f16 values from 8 q8_0 bytes (w0, w1) / 8 q4_0 nibbles (w), times the block scale s.
__device__ __forceinline__ uint4 cvt_q8(uint32_t w0, uint32_t w1, __half2 s) {
  return bytes8_to_f16(w0 ^ 0x80808080u, w1 ^ 0x80808080u, 0x64806480u, s);  // q + 128; bias (1152, 1152)
}

__device__ __forceinline__ uint4 cvt_q4(uint32_t w, __half2 s) {
  const uint32_t lo = w & 0x0F0F0F0Fu, hi = (w >> 4) & 0x0F0F0F0Fu;
  const uint32_t x0 = __byte_perm(lo, hi, 0x5140), x1 = __byte_perm(lo, hi, 0x7362);  // e0..e3, e4..e7
  return bytes8_to_f16(x0, x1, 0x64086408u, s);                                      // bias (1032, 1032)
}

// 8 dequantized f16 values clamped to +-65504: a scale past the float16 limit (scales_past_limit) overflows.
__device__ __forceinline__ uint4 hclamp4(uint4 o) {
  return make_uint4(hclamp_u(o.x), hclamp_u(o.y), hclamp_u(o.z), hclamp_u(o.w));
}

// A q8_0 / q4_0 V chunk's fp16 scale sb as the half2 its conversion multiplies by. FIX = false (the common
// conversion): past notes a scale past the float16 limit or non-finite (scales_past_limit). FIX = true (that chunk
// converted again, rare): a NaN / Inf scale becomes 0 and vbad notes the V-poisoned key.
template <int VK, bool FIX>
__device__ __forceinline__ __half2 v_scale2(uint16_t sb, bool& past, bool& vbad) {
  __half2 s2 = __half2half2(__ushort_as_half(sb));
  if constexpr (FIX) {
    if (half_nonfinite(sb)) {
      s2 = __float2half2_rn(0.f);
      vbad = true;
    }
  } else {
    past |= scales_past_limit<VK>(sb);  // the upper half (0) is within the limit
  }
  return s2;
}
// Whether N 16-byte pieces of float16 V, piece i at at(i), hold a NaN / Inf (the common path's check, see prep_pipe):
// acc = w * 0 + acc stays +-0 while every half is finite and turns NaN at an Inf / NaN; one HFMA2 per word, as
// v_nonfinite_acc (attention_tile.cuh) but in four short chains, one per word of a piece, not one chain per thread. UNROLL: the caller's unroll factor (0: full).
template <int N, int UNROLL, typename At>
__device__ __forceinline__ bool f16_pieces_nonfinite(At at) {
  const __half2 z2 = __float2half2_rn(0.f);
  __half2 nf[4] = {z2, z2, z2, z2};
  auto add = [&](const uint4 u) {
    nf[0] = __hfma2(*reinterpret_cast<const __half2*>(&u.x), z2, nf[0]);
    nf[1] = __hfma2(*reinterpret_cast<const __half2*>(&u.y), z2, nf[1]);
    nf[2] = __hfma2(*reinterpret_cast<const __half2*>(&u.z), z2, nf[2]);
    nf[3] = __hfma2(*reinterpret_cast<const __half2*>(&u.w), z2, nf[3]);
  };
  if constexpr (UNROLL == 0) {
#pragma unroll
    for (int i = 0; i < N; ++i) add(at(i));
  } else {
#pragma unroll UNROLL
    for (int i = 0; i < N; ++i) add(at(i));
  }
  const __half2 nfa = __hadd2(__hadd2(nf[0], nf[1]), __hadd2(nf[2], nf[3]));
  return v_nonfinite(*reinterpret_cast<const uint32_t*>(&nfa));  // attention_tile.cuh
}
// The V-poisoned keys of a tile (rare; the common path only checks, see prep_pipe): key j's flag is found by thread
// j alone, which also zeroes the NaN / +-Inf halves of a float16 row. Zeroing those values alone is enough: the other
// values of a poisoned key are finite, and p = 0 (rows that do not see the key) times a finite value is 0, while the
// rows that see it turn NaN through the logit (ksf_poison). C 16-byte chunks, chunk c at at(c).
template <int C, typename At>
__device__ __forceinline__ bool f16_row_poisoned(At at) {
  uint32_t any = 0;
#pragma unroll 4
  for (int c = 0; c < C; ++c) {
    uint4 u = *at(c);
    const uint32_t m0 = halves_nonfinite(u.x), m1 = halves_nonfinite(u.y);
    const uint32_t m2 = halves_nonfinite(u.z), m3 = halves_nonfinite(u.w);
    if ((m0 | m1 | m2 | m3) != 0u) {  // bit 15 / 31 of m -> the half's 16 bits: (m >> 15) * 0xffff
      u.x &= ~((m0 >> 15) * 0xffffu);
      u.y &= ~((m1 >> 15) * 0xffffu);
      u.z &= ~((m2 >> 15) * 0xffffu);
      u.w &= ~((m3 >> 15) * 0xffffu);
      *at(c) = u;
      any = 1u;
    }
  }
  return any != 0u;
}
// q8_0 / q4_0: a NaN / Inf among the key's NB V scales (its fp16 scale run, 4-byte aligned).
template <int NB>
__device__ __forceinline__ bool v_scales_poisoned(const uint16_t* vs) {
  uint32_t m = 0;
#pragma unroll
  for (int b = 0; b < NB / 2; ++b) m |= halves_nonfinite(reinterpret_cast<const uint32_t*>(vs)[b]);
  return m != 0u;
}
// A V-poisoned key j of the tile: its K scale of block 0 becomes NaN in the tile's K scale table (k_scales'
// layout: float4 (block 0, step j / 16, lane (j % 8) / 2), component (j & 1) + 2 ((j % 16) >= 8)), so its logit is
// NaN and the K side of the policy does the rest: masking hides it with -inf where unseen, a seen NaN logit turns the
// row's l NaN. No code in the tile loop's Q.K or softmax for it (a fold there costs the kernels registers and spills).
__device__ __forceinline__ void ksf_poison(float4* ksf, int j) {
  const int r = j & 15;
  reinterpret_cast<float*>(ksf + 4 * (j >> 4) + ((r & 7) >> 1))[(r & 1) + 2 * (r >> 3)] = __int_as_float(0x7fc00000);
}

// Block (or work item) idx's (batch, KV head) bh and row chunk of the prefill kernels. ncq > 0: causal with
// Sq % rows == 0, in position-major order (the heaviest query chunk of every head first); else (bh, chunk) order,
// the chunks reversed where a.reverse_chunks says so (causal: heaviest first). I: the type of the divisions, uint32_t
// where the planner keeps the items and every factor below 2^31 (a 64-bit division is a ~60-instruction call).
template <typename I = int64_t>
__device__ __forceinline__ void item_chunk(const TileArgs& a, int64_t ncq, int64_t idx, int64_t& bh, int64_t& chunk) {
  if (ncq > 0) {
    const I U = I(a.B * a.Hkv * a.g), g = I(a.g), nc = I(ncq);
    const I level = I(idx) / U, u = I(idx) % U;
    bh = u / g;
    chunk = (u % g) * nc + (nc - 1 - level);
  } else {
    const I n = I(a.n_chunks);
    bh = I(idx) / n;
    chunk = I(idx) % n;
    if (a.reverse_chunks) chunk = a.n_chunks - 1 - chunk;
  }
}

// Facts of a run of rows [r0, r1) of one (b, hkv) row space: smallest and largest last-visible key index
// (causal: Sk - Sq + i, clamped to Sk - 1). kmax is non-decreasing in i inside a head, so the extremes come
// from the run's first / last query position, or 0 / Sq-1 when the run crosses a head boundary. I: the type of the
// divisions (as item_chunk's; uint32_t where the rows of a (batch, KV head) stay below 2^31).
template <typename I = int64_t>
__device__ __forceinline__ void run_kminmax(const TileArgs& a, int64_t r0, int64_t r1, int64_t& kmin,
                                            int64_t& kmax) {
  if (r1 <= r0) {
    kmin = INT64_MAX;
    kmax = -1;
    return;
  }
  const I sq = I(a.Sq);
  int64_t i_lo = I(r0) % sq, i_hi = I(r1 - 1) % sq;
  if (I(r0) / sq != I(r1 - 1) / sq) {
    i_lo = 0;
    i_hi = a.Sq - 1;
  }
  auto f = [&](int64_t i) {
    int64_t k = a.causal ? a.Sk - a.Sq + i : a.Sk - 1;
    return k > a.Sk - 1 ? a.Sk - 1 : k;
  };
  kmin = f(i_lo);
  kmax = f(i_hi);
}

// ncq > 0: causal with Sq % 64 == 0, blocks in position-major order (heaviest query chunk of every head first).
// MINB: blocks per SM promised to ptxas (2: 255 registers; 3 caps D <= 128 at 168 registers, the default for the
// wgmma path, see launch_vk).
// TMA (sm_90, pipelined layout only): K / V tiles by tensor copies from the maps in tm (else tm is unused).
// WG (with TMA, MT = 1, D <= 128): P.V by wgmma from the swizzled f16 V where the build has it (sm_90a, D4A_WGMMA);
// elsewhere the same launch runs mma.sync (the shared-memory layout is the TMA one either way).
// VC = false (float16 V only): the instance without the V check, for the heads a V scan left unflagged
// (v_scan.cuh); with a scan (a.v_flags set) the VC = true instance runs only the flagged heads. Their other blocks
// return at once. Without a scan (a.v_flags null) the VC = true instance runs every head, checking each tile.
// QK16 (float16 V, MT = 1, TMA, WG): Q.K on f16 wgmma from K's float16 copy (a.k, rows of 2 D bytes; k_dequant.cuh)
// instead of the int8 mma.sync and its per-block scaling: Q's int8 levels times their block scale as float16 A
// fragments in registers, the K tile as the K-major operand. The logits stay unscaled dot products until the softmax,
// whose exponent takes scale * log2 e (times 2^8 on a head whose copy was shifted, a.k_flags) in the FFMA it has
// anyway.
// S8W (float16 V, MT = 1, TMA, WG): the contract's int8 Q.K on wgmma instead of mma.sync: one m64n64k32 per 32-block
// with Q's int8 fragments from registers and the int8 K tile as the K-major operand, the same magic-bias accumulators
// and per-block scaling FFMAs; at 2 blocks per SM the next block's wgmma runs while this block's FFMAs do.
template <int VK, int D, int MT, int MINB, bool TMA, bool WG, bool VC = true, bool QK16 = false, bool S8W = false>
__global__ void __launch_bounds__(kThreads, MINB)
    prefill_mma_kernel(const TileArgs a, const int64_t ncq, const __grid_constant__ TmaMaps tm) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  static_assert(!QK16 || (VK == kVF16 && MT == 1 && TMA && WG), "QK16: float16 V, one m tile, TMA, wgmma");
  static_assert(!S8W || (!QK16 && VK == kVF16 && MT == 1 && TMA && WG), "S8W: float16 V, one m tile, TMA, wgmma");
#if !defined(D4A_WGMMA)
  // Only wgmma plans launch the unchecked, QK16 and S8W instances (launch_plan.cu: v_scan, k_dequant, qk_wgmma), so
  // only sm_90a code needs their bodies: the trap keeps the other targets' copies empty (less for ptxas) and loud if
  // ever reached.
  if constexpr (!VC || QK16 || S8W) {
    __trap();
    return;
  }
#endif
  using Tr = Traits<VK, D, MT>;
  constexpr int kRows = Tr::kRows;
  constexpr int RW = 16 * MT;  // rows per warp
  constexpr int NH = 2 * MT;   // rows per thread (gid, gid + 8 of each m tile)
  constexpr int NB = Tr::NB;
  constexpr int ND = D / 8;  // output n tiles
  constexpr bool kT = TMA && Tr::kPipe;
#if defined(D4A_WGMMA)
  constexpr bool kWG = WG && kT && Tr::kWgmma;
#else
  constexpr bool kWG = false;
#endif
  constexpr bool kQ16 = QK16 && kWG;
  constexpr bool kQ16P = kQ16 && MINB == 2;  // the overlapped schedule (Traits::qk16p_bytes)
  constexpr bool kS8 = S8W && kWG;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  uint8_t* smem = smem_raw;
  if constexpr (kT) smem += smem_pad1024(smem_raw);  // TMA: the swizzle period (the launcher adds the slack)
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gid = lane >> 2, tig = lane & 3;
  const int nst = a.nst;

  // ---- which (batch, kv head, row chunk) ---------------------------------------------------------------------
  // item_chunk's decoding written out: calling it changes the instruction schedule of these instances
  const int64_t idx = int64_t(blockIdx.x);
  int64_t bh, chunk;
  if (ncq > 0) {
    const int64_t U = a.B * a.Hkv * a.g;
    const int64_t level = idx / U, u = idx % U;
    bh = u / a.g;
    chunk = (u % a.g) * ncq + (ncq - 1 - level);
  } else {
    bh = idx / a.n_chunks;
    chunk = idx % a.n_chunks;
    if (a.reverse_chunks) chunk = a.n_chunks - 1 - chunk;
  }
  const int64_t b = bh / a.Hkv, hkv = bh % a.Hkv;
  // float16 V after a scan: this instance takes only the heads of its kind (flagged: VC, unflagged: !VC). The check
  // is compiled out of the !VC instance, not skipped at run time: its code alone (registers, spills of the 168-register
  // wgmma instance) cost ~6 % of an 8k prefill whose heads all skipped it.
  if (VK == kVF16 && a.v_flags != nullptr && (a.v_flags[bh] != 0) != VC) return;
  constexpr bool kVCheck = VC || VK != kVF16;  // q8_0 / q4_0: always (their conversion needs the scale check anyway)
  const int64_t rows_here = a.g * a.Sq;
  const int64_t row0 = chunk * kRows;
  const int64_t row_end = row0 + kRows < rows_here ? row0 + kRows : rows_here;

  // Key indices (tiles, key bounds) are int: launch takes Sk <= 2^31 - 1 - kKeys only. Held as int64
  // through the key walk they would cost registers that the 3-blocks-per-SM budget lacks (ptxas spills).
  int kmin_w, kmax_w, kend, nkt;
  {
    int64_t kmin_blk, kmax_blk, kmin64, kmax64;
    run_kminmax(a, row0, row_end, kmin_blk, kmax_blk);
    const int64_t w0 = row0 + warp * RW;
    const int64_t w1 = w0 + RW < row_end ? w0 + RW : row_end;
    run_kminmax(a, w0, w1, kmin64, kmax64);
    kmin_w = int(kmin64 < 0x7fffffffLL ? kmin64 : 0x7fffffffLL);  // INT64_MAX: the warp has no rows
    kmax_w = int(kmax64);
    kend = int(kmax_blk + 1 < a.Sk ? kmax_blk + 1 : a.Sk);
    nkt = kend > 0 ? (kend + kKeys - 1) / kKeys : 0;
  }

  constexpr bool kPipe = Tr::kPipe;
  int8_t* Qs = reinterpret_cast<int8_t*>(smem + (kQ16P ? Tr::Q16P_Q : kQ16 ? Tr::Q16_Q : kPipe ? Tr::P_Q : Tr::OFF_Q));
  float* SQ = reinterpret_cast<float*>(smem + (kQ16P ? Tr::Q16P_SQ : kQ16 ? Tr::Q16_SQ : kPipe ? Tr::P_SQ : Tr::OFF_SQ));
  float4* KSF = reinterpret_cast<float4*>(smem + (kPipe ? Tr::P_KSF : Tr::OFF_KSF));
  uint8_t* VH = smem + (kPipe ? Tr::P_VH : Tr::OFF_VH);
  uint8_t* stages = smem + Tr::OFF_ST;

  // Key j of this (b, hkv) is row head_row + j of K, V and their scales; rows a.k_stride / a.v_stride bytes and
  // a.ks_stride / a.vs_stride halves apart (dense tensors: the row widths). head_row is computed where the copies
  // need it (opaque: not hoisted into a register held through the key walk, which the 168-register instances lack).
  auto first_row = [&]() { return bh * opaque(a.kv_rows); };
  // (query head, query position) of row-space row rr
  auto row_pos = [&](int64_t rr, int64_t& hq, int64_t& i) {
    hq = hkv * a.g + rr / a.Sq;
    i = rr % a.Sq;
  };
  // Loop-invariant parts are recomputed per tile on purpose (unroll 1): hoisted per-chunk addresses would cost
  // dozens of registers for the whole key walk.
  auto issue_tile = [&](int tile) {
    if (tile < nkt) {
      const int64_t head_row = first_row();
      uint8_t* st = stages + int(tile % nst) * Tr::STAGE;
      const int j0 = tile * kKeys;
      const int nv = int(kend - j0 < kKeys ? kend - j0 : kKeys);  // keys of the tile inside the range
      constexpr int kch = D / 16;
      const int64_t kstr = a.k_stride, vstr = a.v_stride;
      const int8_t* kg = a.k + (head_row + j0) * kstr;
#pragma unroll 1
      for (int c = tid; c < kKeys * kch; c += kThreads) {
        const int j = c / kch, part = c % kch;
        const bool ok = j < nv;
        cp_async16(st + j * Tr::KSTR + part * 16, kg + (ok ? j * kstr : 0) + part * 16, ok);
      }
      constexpr int vrow = v_row_bytes(VK, D), vch = vrow / 16;
      const uint8_t* vg = static_cast<const uint8_t*>(a.v) + (head_row + j0) * vstr;
#pragma unroll 1
      for (int c = tid; c < kKeys * vch; c += kThreads) {
        const int j = c / vch, part = c % vch;
        const bool ok = j < nv;
        cp_async16(st + Tr::ST_K + j * Tr::VRAW + part * 16, vg + (ok ? j * vstr : 0) + part * 16, ok);
      }
      // fp16 scale rows into [64][NB] runs: NB is even, so every 4-byte piece is two scales of one key (both valid
      // or not; the planner asks for 4-byte aligned scale rows)
      const uint16_t* ksg = a.ks + (head_row + j0) * a.ks_stride;
      const uint16_t* vsg = Tr::kVq ? a.vs + (head_row + j0) * a.vs_stride : nullptr;
      const int kss = int(a.ks_stride), vss = int(a.vs_stride);  // in-tile offsets are 32-bit (the planner checks)
      uint16_t* kst = reinterpret_cast<uint16_t*>(st + Tr::ST_K + Tr::ST_V);
      uint16_t* vst = reinterpret_cast<uint16_t*>(st + Tr::ST_K + Tr::ST_V + Tr::ST_KS);
#pragma unroll 1
      for (int c = tid; c < kKeys * NB / 2; c += kThreads) {
        const int e = 2 * c, j = e / NB, x = e % NB;
        const bool ok = j < nv;
        cp_async4(kst + e, ksg + (ok ? j * kss + x : 0), ok ? 4 : 0);
        if constexpr (Tr::kVq) cp_async4(vst + e, vsg + (ok ? j * vss + x : 0), ok ? 4 : 0);
      }
    }
    cp_async_commit();
  };

  // ---- pipelined path (kPipe): fixed trip counts, every thread owns the same chunks in every tile ----
  constexpr int kch = D / 16;                        // 16-byte K chunks per key
  constexpr int vrow_b = Tr::VROW, vch = vrow_b / 16;
  constexpr int KIT = kKeys * kch / kThreads, VIT = kKeys * vch / kThreads;
  static_assert(!kPipe || (kKeys * kch % kThreads == 0 && kKeys * vch % kThreads == 0 && kThreads % vch == 0),
                "pipelined copy split");
  constexpr int kSC = kT ? Tr::T_SC : Tr::P_SC;          // scale-run slots
  constexpr int kRingO = kQ16 ? 0 : kT ? Tr::T_RINGO : Tr::P_RING;  // ring slots
  constexpr int kRingB = kQ16 ? Tr::Q16_RING : kT ? Tr::T_RING : Tr::RING;
  constexpr int kVR = kT ? Tr::T_VR : Tr::P_VR;          // raw q8_0 / q4_0 V
  constexpr int kVOff = kQ16 ? Tr::Q16_KT : kT ? Tr::T_KT : Tr::ST_K;  // the V tile in a ring slot
  const unsigned bar0 = smem_u32(smem + (kQ16P ? Tr::Q16P_BAR : kQ16 ? Tr::Q16_BAR : Tr::T_BAR));  // kT: slot s: bar0 + 8 s
  // A tile's ring slot is tile & 1, or tile % 3 in the overlapped QK16 schedule (its mbarrier's phase: tile / 3); the
  // expressions are spelled out where used: through a shared lambda, ptxas schedules the other instances differently.
  auto issue_scales = [&](int tile) {  // fp16 scale runs of `tile` into slot tile & 1 (QK16: none needed)
    if (!kQ16 && tile < nkt) {
      const int64_t head_row = first_row();
      const int j0 = tile * kKeys;
      const int nv = int(kend - j0 < kKeys ? kend - j0 : kKeys);
      uint8_t* sc = smem + kSC + int(tile & 1) * Tr::SC;
      // key j0 + j's scale row (strides below 2^25 halves: the planner checks)
      const int kss = int(a.ks_stride), vss = int(a.vs_stride);
      constexpr int N = kKeys * NB / 2;  // 4-byte pieces, two scales of one key each (NB is even)
#pragma unroll
      for (int it = 0; it < (N + kThreads - 1) / kThreads; ++it) {
        const int c = tid + it * kThreads;
        if (N % kThreads != 0 && c >= N) break;
        const int e = 2 * c, j = e / NB, x = e % NB;
        const bool ok = j < nv;
        const int64_t row = head_row + j0 + (ok ? j : 0);
        cp_async4(reinterpret_cast<uint16_t*>(sc) + e, a.ks + row * kss + x, ok ? 4 : 0);
        if constexpr (Tr::kVq)
          cp_async4(reinterpret_cast<uint16_t*>(sc + Tr::ST_KS) + e, a.vs + row * vss + x, ok ? 4 : 0);
      }
    }
  };
  // K (+ V) of `tile` and the scale runs of tile + 1, one commit group
  auto issue_pipe = [&](int tile) {
    if constexpr (kT) {
      // one thread: arm the slot's mbarrier with the tile's bytes, then one tensor copy for K and one per 128-byte
      // slab of V (keys past Sk arrive as zeros; keys past the block's range are masked like any causal key)
      if (tile < nkt && tid == 0) {
        const unsigned bar = bar0 + 8u * unsigned(kQ16P ? tile % 3 : tile & 1);
        mbar_arrive_expect(bar, (kQ16 ? Tr::Q16_KT : Tr::T_KT) + Tr::T_VT);
        uint8_t* ring = smem + kRingO + (kQ16P ? tile % 3 : int(tile & 1)) * kRingB;
        const int y = int(tile * kKeys), z = int(bh);
        if constexpr (kQ16) {  // float16 K rows of 2 D bytes: 128-byte slabs, as V's
#pragma unroll
          for (int x = 0; x < 2 * D; x += 128) tma_load_3d_plain(smem_u32(ring + (x / 128) * (kKeys * 128)), &tm.k, x, y, z, bar);
        } else {
          tma_load_3d_plain(smem_u32(ring), &tm.k, 0, y, z, bar);
        }
        uint8_t* vd = Tr::kConv ? smem + kVR : ring + kVOff;
        constexpr int W = tma_slab(Tr::VROW);
#pragma unroll
        for (int x = 0; x < Tr::VROW; x += W) tma_load_3d_plain(smem_u32(vd + (x / W) * (kKeys * W)), &tm.v, x, y, z, bar);
      }
    } else if (tile < nkt) {
      const int j0 = tile * kKeys;
      const int nv = int(kend - j0 < kKeys ? kend - j0 : kKeys);
      const int64_t head_row = first_row();
      uint8_t* ring = smem + kRingO + int(tile & 1) * kRingB;
      const int64_t kstr = opaque(a.k_stride), vstr = opaque(a.v_stride);
      const int8_t* kg = a.k + (head_row + j0) * kstr;
      const int jk = tid / kch, pk = tid % kch;
      const uint8_t* vg = static_cast<const uint8_t*>(a.v) + (head_row + j0) * vstr;
      uint8_t* vd = Tr::kConv ? smem + kVR : ring + Tr::ST_K;
      const int jv = tid / vch, pv = tid % vch;
      if (nv == kKeys) {  // whole tile (all but the last): one base address per thread, constant offsets, no checks
        const int8_t* ks0 = kg + jk * kstr + pk * 16;
        uint8_t* kd0 = ring + jk * Tr::KSTR + pk * 16;
#pragma unroll
        for (int i = 0; i < KIT; ++i)
          cp_async16(kd0 + i * (kThreads / kch) * Tr::KSTR, ks0 + i * (kThreads / kch) * kstr, true);
        const uint8_t* vs0 = vg + jv * vstr + pv * 16;
        uint8_t* vd0 = vd + jv * Tr::VRAW + pv * 16;
#pragma unroll
        for (int i = 0; i < VIT; ++i)
          cp_async16(vd0 + i * (kThreads / vch) * Tr::VRAW, vs0 + i * (kThreads / vch) * vstr, true);
      } else {
#pragma unroll
        for (int i = 0; i < KIT; ++i) {
          const int j = jk + i * (kThreads / kch);
          const bool ok = j < nv;
          cp_async16(ring + j * Tr::KSTR + pk * 16, kg + (ok ? j * kstr + pk * 16 : 0), ok);
        }
#pragma unroll
        for (int i = 0; i < VIT; ++i) {
          const int j = jv + i * (kThreads / vch);
          const bool ok = j < nv;
          cp_async16(vd + j * Tr::VRAW + pv * 16, vg + (ok ? j * vstr + pv * 16 : 0), ok);
        }
      }
    }
    issue_scales(tile + 1);
    cp_async_commit();
  };
  // KSF and f16 V of `tile` into buffer tile & 1: the scale runs must be visible to all threads (a barrier after
  // their group), the raw V only to this thread (it copied exactly these chunks; its own wait is enough; with TMA
  // every thread has waited on the tile's mbarrier).
  // V-poisoned keys: vbad tells whether this thread's V chunks of the tile hold a non-finite value (float16: a NaN /
  // Inf half, left for the tile's rare branch to zero; q8_0 / q4_0: a NaN / Inf scale, dequantized as 0 right here);
  // the next barrier ORs it (see the loop).
  bool vbad = false;
  auto prep_pipe = [&](int tile) {
    const int buf = int(tile & 1), slot = kQ16P ? tile % 3 : buf;
    const uint8_t* sc = smem + kSC + buf * Tr::SC;
    const uint16_t* kst = reinterpret_cast<const uint16_t*>(sc);
    if constexpr (!kQ16) k_scales<NB>(kst, KSF + buf * Tr::KSF_N, tid);
    vbad = false;
    const int jv = tid / vch, pv = tid % vch;
    if constexpr (Tr::kConv) {
      const uint16_t* vsr = reinterpret_cast<const uint16_t*>(sc + Tr::ST_KS);
      uint8_t* vh = VH + buf * Tr::P_VHB;
      // 16 f16 bytes of key j at row byte b: padded rows for ldmatrix, or with wgmma the MN-major 128-byte-swizzle
      // layout the f16 V tile has when the TMA writes it (so the P.V reads both the same way)
      auto vh_at = [&](int j, int b) {
        return reinterpret_cast<uint4*>(vh + (kWG ? tma_row_byte<2 * D, kKeys>(j, b) : j * Tr::VSTR + b));
      };
      // fix = false: the plain conversion, and whether a scale of this thread's chunks is past the float16 limit or
      // non-finite (past). Only then (rare, per thread) the chunks are converted again with fix = true: a NaN / Inf
      // scale as 0 (vbad), every value clamped to +-65504.
      bool past = false;
      auto conv = [&](auto fix) {
#pragma unroll
        for (int i = 0; i < VIT; ++i) {
          const int j = jv + i * (kThreads / vch);
          const int at = kT ? tma_row_byte<Tr::VROW, kKeys>(j, pv * 16) : j * Tr::VRAW + pv * 16;
          const uint4 w = *reinterpret_cast<const uint4*>(smem + kVR + at);
          const uint16_t sb = vsr[j * NB + (VK == kVQ8 ? pv >> 1 : pv)];  // q8_0: block pv / 2; q4_0: block pv
          const __half2 s2 = v_scale2<VK, decltype(fix)::value>(sb, past, vbad);
          auto put = [&](int b, uint4 o) {
            if constexpr (decltype(fix)::value) o = hclamp4(o);
            *vh_at(j, b) = o;
          };
          if constexpr (VK == kVQ8) {  // 16 values of block pv / 2
            put(pv * 32, cvt_q8(w.x, w.y, s2));
            put(pv * 32 + 16, cvt_q8(w.z, w.w, s2));
          } else {  // q4_0: 32 values of block pv
            put(pv * 64, cvt_q4(w.x, s2));
            put(pv * 64 + 16, cvt_q4(w.y, s2));
            put(pv * 64 + 32, cvt_q4(w.z, s2));
            put(pv * 64 + 48, cvt_q4(w.w, s2));
          }
        }
      };
      conv(std::false_type{});
      if (past) conv(std::true_type{});
      // wgmma reads the buffer through the async proxy: order these generic-proxy writes before it (the barrier
      // at the top of the next tile then publishes them to the other warps)
      if constexpr (kWG) fence_proxy_async_smem();
    } else if constexpr (kVCheck) {
      // f16 V where it lies in the ring slot (this thread's chunks: the ones it copied, or with TMA the same split)
      const uint8_t* vt = smem + kRingO + slot * kRingB + kVOff;
      vbad = f16_pieces_nonfinite<VIT, 0>([&](int i) {
        const int j = jv + i * (kThreads / vch);
        return *reinterpret_cast<const uint4*>(
            vt + (kT ? tma_row_byte<Tr::VROW, kKeys>(j, pv * 16) : j * Tr::VRAW + pv * 16));
      });
    }
  };
  // The rare branch of a tile whose V holds a poisoned key (block-uniform, after the barrier that ORed vbad): thread
  // j < 64 checks key j (float16: zeroing the row's NaN / Inf halves in the ring slot; q8_0 / q4_0: its NB V scales,
  // still in the tile's scale slot: issue_pipe(tile + 1) refills that after this) and, when it is bad, makes its K
  // scale NaN in the tile's K scale table (ksf_poison) before compute reads it.
  auto v_poison_pipe = [&](int tile) {
    const int buf = int(tile & 1), slot = kQ16P ? tile % 3 : buf;
    if (tid < kKeys) {
      bool bad;
      if constexpr (Tr::kConv) {
        const uint16_t* vs = reinterpret_cast<const uint16_t*>(smem + kSC + buf * Tr::SC + Tr::ST_KS);
        bad = v_scales_poisoned<NB>(vs + tid * NB);
      } else {
        uint8_t* vt = smem + kRingO + slot * kRingB + kVOff;
        bad = f16_row_poisoned<vch>([&](int c) {
          return reinterpret_cast<uint4*>(vt + (kT ? tma_row_byte<Tr::VROW, kKeys>(tid, c * 16)
                                                   : tid * Tr::VRAW + c * 16));
        });
        if constexpr (kQ16) {  // no K scale table: the key's float16 K row becomes NaN, so its dot product is NaN
          if (bad) {
            uint8_t* kt = smem + kRingO + slot * kRingB;
#pragma unroll
            for (int c = 0; c < 2 * D / 16; ++c)
              *reinterpret_cast<uint4*>(kt + tma_row_byte<2 * D, kKeys>(tid, c * 16)) =
                  make_uint4(0x7e007e00u, 0x7e007e00u, 0x7e007e00u, 0x7e007e00u);
          }
        }
        if constexpr (kT) fence_proxy_async_smem();  // zeroed bytes: before wgmma / the next TMA into the slot
      }
      if constexpr (!kQ16) {
        if (bad) ksf_poison(KSF + buf * Tr::KSF_N, tid);
      }
    }
    __syncthreads();  // the NaN K scales and zeroed V; every scale read before issue_pipe(tile + 1) refills the slot
  };

  auto wait_tma = [&](int tile) {  // kT: every thread waits until the tile's tensor copies have landed
    if constexpr (kQ16P) mbar_wait(bar0 + 8u * unsigned(tile % 3), unsigned(tile / 3) & 1u);
    else if constexpr (kT) mbar_wait(bar0 + 8u * unsigned(tile & 1), unsigned(tile >> 1) & 1u);
  };

  // Start the first tiles before quantizing Q (they do not depend on it).
  if constexpr (kT) {
    if (tid == 0) {
      mbar_init(bar0, 1);
      mbar_init(bar0 + 8, 1);
      if constexpr (kQ16P) mbar_init(bar0 + 16, 1);
      mbar_init_fence();
    }
    __syncthreads();
  }
  if constexpr (kPipe) {
    issue_scales(0);
    issue_pipe(0);
    if constexpr (kQ16P) issue_pipe(1);  // two tiles ahead (Q lies in the third slot)
  } else {
    for (int s = 0; s < nst - 1; ++s) issue_tile(s);
  }

  // ---- Q: each warp quantizes its RW rows. A lane loads 8 f16 (16 bytes) per row piece, D/8 lanes per row, and
  // all of its pieces are loaded before any is quantized: the loads' latency is paid once, not once per row.
  // Four lanes hold one 32-block (amax by two shuffles). ----
  int8_t* qw = Qs + warp * RW * Tr::QSTR;
  {
    constexpr int LPR = D / 8;            // lanes per row
    constexpr int RPI = 32 / LPR;         // rows per warp-wide load
    constexpr int QIT = RW / RPI;         // loads per lane
    const int c8 = lane % LPR, rsub = lane / LPR;
    uint4 xv[QIT];
#pragma unroll
    for (int it = 0; it < QIT; ++it) {
      const int64_t rr = row0 + warp * RW + it * RPI + rsub;
      xv[it] = make_uint4(0, 0, 0, 0);
      if (rr < rows_here) {
        int64_t hq, i;
        row_pos(rr, hq, i);
        xv[it] = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(a.q) + ((b * a.Hq + hq) * a.Sq + i) * D +
                                                 c8 * 8);
      }
    }
#pragma unroll
    for (int it = 0; it < QIT; ++it) {
      const int r = it * RPI + rsub;
      const __half2* h = reinterpret_cast<const __half2*>(&xv[it]);
      float x[8];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const float2 f = __half22float2(h[u]);
        x[2 * u] = f.x;
        x[2 * u + 1] = f.y;
      }
      float amax = 0.f;
#pragma unroll
      for (int u = 0; u < 8; ++u) amax = fmaxf(amax, abs_or_inf(x[u]));  // +inf for a NaN / Inf block
      amax = fmaxf(amax, shfl_xor(amax, 1));
      amax = fmaxf(amax, shfl_xor(amax, 2));
      float dv;
      const float sc = q_block_scale(amax, dv);  // NaN for a non-finite block (dv = 0: q = 0)
      float ql[8];
      q_block_levels<8>(x, dv, ql);
      uint32_t w[2] = {0u, 0u};
#pragma unroll
      for (int u = 0; u < 8; ++u) w[u >> 2] |= (uint32_t(int(ql[u])) & 0xffu) << (8 * (u & 3));
      *reinterpret_cast<uint2*>(qw + r * Tr::QSTR + c8 * 8) = make_uint2(w[0], w[1]);
      if ((c8 & 3) == 0) SQ[(warp * RW + r) * NB + c8 / 4] = sc;
    }
  }
  __syncwarp();

  // A fragments of Q (m16n8k32 row layout via ldmatrix: matrices rows 0-7 / 8-15 x bytes 0-15 / 16-31)
  const unsigned q_addr = smem_u32(qw + ((lane >> 3) & 1) * 8 * Tr::QSTR + (lane & 7) * Tr::QSTR + (lane >> 4) * 16);
  uint32_t qa[MT][Tr::kQReg && !kQ16 ? NB : 1][4];
  if constexpr (Tr::kQReg && !kQ16) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int blk = 0; blk < NB; ++blk)
        ldsm_x4(q_addr + mt * 16 * Tr::QSTR + blk * 32, qa[mt][blk][0], qa[mt][blk][1], qa[mt][blk][2],
                qa[mt][blk][3]);
  }
  // Q block scales of this thread's rows: h = 2 * mt + (0: row gid, 1: row gid + 8) of m tile mt. The other row
  // facts (last visible key, mask and output offsets) are derived where they are needed (masked tiles, the
  // epilogue), not kept in registers for the whole key walk.
  float sq[NH][Tr::kQReg && !kQ16 ? NB : 1];  // Q block scale * scale * log2 e, q_scale23 (else read from shared memory)
  auto row_local = [&](int h) { return warp * RW + (h >> 1) * 16 + gid + 8 * (h & 1); };
  if constexpr (Tr::kQReg && !kQ16) {
#pragma unroll
    for (int h = 0; h < NH; ++h)
#pragma unroll
      for (int blk = 0; blk < NB; ++blk) sq[h][blk] = q_scale23(SQ[row_local(h) * NB + blk] * a.scale_log2);
  }
  // QK16: Q's A fragments in float16 (int8 level * float32 block scale, one rounding: the contract's quantized Q as
  // float16), one set of 4 registers per 16 columns, in the mma.sync m16n8k16 A layout that wgmma takes per warp; and
  // the factor of the softmax's exponent, scale * log2 e (times 2^8 where this head's K copy holds K times 2^-8).
  uint32_t qh[kQ16 ? D / 16 : 1][4];
  constexpr bool kQhSmem = kQ16 && !kQ16P && D == 64;  // Traits::Q16_QH: reloaded before each tile's Q.K
  const unsigned qh_at = smem_u32(smem + Tr::Q16_QH) + unsigned(tid) * 16u;  // + 16 kThreads per k step
  float c_qk = 1.f;
  if constexpr (kQ16) {
    const int r0 = row_local(0), r1 = row_local(1);
    auto pair = [&](int r, int col, float sc) {
      const int8_t* q = Qs + r * Tr::QSTR + col;
      return pack_h2(float(q[0]) * sc, float(q[1]) * sc);
    };
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      const float s0 = SQ[r0 * NB + ks / 2], s1 = SQ[r1 * NB + ks / 2];
      qh[ks][0] = pair(r0, 16 * ks + 2 * tig, s0);
      qh[ks][1] = pair(r1, 16 * ks + 2 * tig, s1);
      qh[ks][2] = pair(r0, 16 * ks + 8 + 2 * tig, s0);
      qh[ks][3] = pair(r1, 16 * ks + 8 + 2 * tig, s1);
      if constexpr (kQhSmem)  // this thread's own bytes: it alone reads them back
        asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(qh_at + unsigned(ks * kThreads * 16)),
                     "r"(qh[ks][0]), "r"(qh[ks][1]), "r"(qh[ks][2]), "r"(qh[ks][3]) : "memory");
    }
    fence_proxy_async_smem();  // these reads of Q's ring slot before its first tensor copy (after the next barrier)
    c_qk = a.scale_log2 * (a.k_flags != nullptr && a.k_flags[bh] != 0 ? 256.f : 1.f);
  }
  // an additive mask value in the logits' units: log2 units, or with QK16 unscaled dot products
  const float mask_mul = kQ16 ? kLog2e / c_qk : kLog2e;

  float oacc[MT][ND][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int n = 0; n < ND; ++n) oacc[mt][n][0] = oacc[mt][n][1] = oacc[mt][n][2] = oacc[mt][n][3] = 0.f;
  float m_run[NH], l_run[NH];
#pragma unroll
  for (int h = 0; h < NH; ++h) {
    m_run[h] = -INFINITY;
    l_run[h] = 0.f;
  }

  // per-lane ldmatrix offsets inside a tile
  const int k_off = ((lane >> 4) * 8 + (lane & 7)) * Tr::KSTR + ((lane >> 3) & 1) * 16;  // QK: n tile pair
  const int v_off = (((lane >> 3) & 1) * 8 + (lane & 7)) * Tr::VSTR + (lane >> 4) * 16;  // PV: trans
  // kT: the same fragments in the swizzled dense tiles. K rows are D bytes (one slab): the lane's row r0 (+ 16 np)
  // and 16-byte piece 2 blk + hi sit at r0 D + ((2 blk + hi) ^ swz(r0)) 16, swz from the lane's row only (rows 8 and
  // 16 apart share it). f16 V rows are 2D bytes in 128-byte slabs: row rv0 (+ 16 ks), piece 2 (ndp % 4) + (lane >> 4)
  // of slab ndp / 4 at (ndp / 4) 64 128 + row 128 + (piece ^ (row & 7)) 16.
  int kx[NB], vx[4];
  const int k_off_t = ((lane >> 4) * 8 + (lane & 7)) * D;
  const int v_off_t = (((lane >> 3) & 1) * 8 + (lane & 7)) * 128;
  {
    const int r0 = (lane >> 4) * 8 + (lane & 7), sw = (r0 * D >> 7) & (D / 16 - 1);
#pragma unroll
    for (int blk = 0; blk < NB; ++blk) kx[blk] = ((2 * blk + ((lane >> 3) & 1)) ^ sw) << 4;
#pragma unroll
    for (int q = 0; q < 4; ++q) vx[q] = ((2 * q + (lane >> 4)) ^ (lane & 7)) << 4;
  }

  // wgmma: wait for the P.V in flight (it writes O)
  auto wg_wait_o = [&]() {
#if defined(D4A_WGMMA)
    if constexpr (kWG) {
      wgmma_wait<0>();
#pragma unroll
      for (int n = 0; n < ND; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) wg_reg_fence(oacc[0][n][e]);
    }
#endif
  };

  // QK16: issue (and commit, not wait for) the Q.K of the K tile at k_st into s: D / 16 wgmma m64n64k16 for the
  // warpgroup's 64 rows x 64 keys, Q from registers, the K tile (64 rows of 2 D bytes in 128-byte slabs of 64
  // columns, the TMA's swizzle) as the K-major B operand; k step ks reads columns 16 ks .. 16 ks + 15 of slab ks / 4,
  // 32 (ks % 4) bytes into its rows
  auto qk16_issue = [&](const unsigned k_st, float (&s)[8][4]) {
#if defined(D4A_WGMMA)
    if constexpr (kQ16) {
      if constexpr (kQhSmem) {
#pragma unroll
        for (int ks = 0; ks < D / 16; ++ks)
          asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                       : "=r"(qh[ks][0]), "=r"(qh[ks][1]), "=r"(qh[ks][2]), "=r"(qh[ks][3])
                       : "r"(qh_at + unsigned(ks * kThreads * 16)) : "memory");
      }
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) {
        const uint64_t desc = wg_desc_k_sw128(k_st + kmajor_step(kKeys, ks));
        if (ks == 0) wgmma_f16_n64_kmajor<false>(s, qh[ks], desc);
        else wgmma_f16_n64_kmajor<true>(s, qh[ks], desc);
      }
      wgmma_commit();
    }
#endif
  };
  // after a wgmma wait: the compiler must not move reads of s above it
  auto s_fence = [&](float (&s)[8][4]) {
#if defined(D4A_WGMMA)
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) wg_reg_fence(s[n][e]);
#endif
  };

  // One tile of this warp: S = Q.K, mask, online softmax, O += P.V. K from the stage at k_st, the K scale
  // pairs at KSF, f16 V rows at v_addr (shared addresses).
  // pre: nullptr, or (the overlapped QK16 schedule) the tile's S, its Q.K already done.
  auto compute = [&](const int j0, const unsigned k_st, const float4* __restrict__ ksf, const unsigned v_addr,
                     auto pre) {
    // ---- S = Q.K (log2 units; QK16: unscaled dot products, the softmax scales them) ----
    float S[MT][8][4];
#if defined(D4A_WGMMA)
    if constexpr (!std::is_same_v<decltype(pre), std::nullptr_t>) {
#pragma unroll
      for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) S[0][n][e] = (*pre)[0][n][e];
    } else if constexpr (kQ16) {
      // D / 16 wgmma m64n64k16 for the warpgroup's 64 rows x 64 keys: Q from registers, the K tile (64 rows of 2 D
      // bytes in 128-byte slabs of 64 columns, the TMA's swizzle) as the K-major B operand; k step ks reads columns
      // 16 ks .. 16 ks + 15 of slab ks / 4, 32 (ks % 4) bytes into its rows
      qk16_issue(k_st, S[0]);
      wgmma_wait<0>();
      s_fence(S[0]);
    } else if constexpr (kS8) {
      // one wgmma m64n64k32 per 32-block into int32 accumulators that start at the magic bias (the K tile: the TMA's
      // D-byte rows in the min(D, 128)-byte swizzle, block blk 32 bytes into them), then the same two FFMAs per logit
      // as the mma.sync path; NACC = 2 keeps the next block's wgmma in flight during this block's FFMAs (wgmma groups
      // complete in order, so waiting for all but one finishes this block's)
      constexpr int NACC = MINB == 2 && NB > 1 ? 2 : 1;
#pragma unroll
      for (int n = 0; n < 8; ++n) S[0][n][0] = S[0][n][1] = S[0][n][2] = S[0][n][3] = 0.f;
      int acc[NACC][8][4];
      auto issue = [&](int blk, int (&c)[8][4]) {
#pragma unroll
        for (int n = 0; n < 8; ++n) c[n][0] = c[n][1] = c[n][2] = c[n][3] = kMagicI;
        // D = 64: Q's fragments loaded again for each tile (Q keeps its own bytes in this layout): kept in registers
        // through the key loop, ptxas gave them to the P fragments there, as for QK16's (Traits::Q16_QH)
        if constexpr (D == 64)
          ldsm_x4(q_addr + blk * 32, qa[0][blk][0], qa[0][blk][1], qa[0][blk][2], qa[0][blk][3]);
        wgmma_fence();
        wgmma_s8_n64(c, qa[0][blk], D == 128 ? wg_desc_k_sw128(k_st + 32 * blk) : wg_desc_k_sw64(k_st + 32 * blk));
        wgmma_commit();
      };
      issue(0, acc[0]);
      if constexpr (NACC == 2) issue(1, acc[1]);
#pragma unroll
      for (int blk = 0; blk < NB; ++blk) {
        int (&c)[8][4] = acc[blk % NACC];
        if (NACC == 2 && blk + 1 < NB) wgmma_wait<1>();
        else wgmma_wait<0>();
#pragma unroll
        for (int n = 0; n < 8; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) wg_reg_fence_i(c[n][e]);
        const float q0 = sq[0][blk], q1 = sq[1][blk], m0 = -kMagicF * q0, m1 = -kMagicF * q1;
#pragma unroll
        for (int np = 0; np < 4; ++np) {
          const float4 k = ksf[(blk * 4 + np) * 4 + tig];  // keys 16 np + 2 tig + (0, 1) and + (8, 9)
          const int* c0 = c[2 * np];
          const int* c1 = c[2 * np + 1];
          float* s0 = S[0][2 * np];
          float* s1 = S[0][2 * np + 1];
          scale_block_pair(s0, s1, c0, c1, q0, q1, m0, m1, k);
        }
        if (blk + NACC < NB) issue(blk + NACC, c);
      }
    } else
#endif
    {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int n = 0; n < 8; ++n) S[mt][n][0] = S[mt][n][1] = S[mt][n][2] = S[mt][n][3] = 0.f;
    // K fragments and scales are double-buffered over the (block, n-tile pair) steps, like V below.
    const unsigned k_base = k_st + (kT ? k_off_t : k_off);
    uint32_t kf[2][4];
    float4 kp[2];
    auto load_k = [&](int step, uint32_t (&f)[4], float4& p) {
      const int blk = step / 4, np = step % 4;
      if constexpr (kT) ldsm_x4(k_base + np * 16 * D + kx[blk], f[0], f[1], f[2], f[3]);
      else ldsm_x4(k_base + np * 16 * Tr::KSTR + blk * 32, f[0], f[1], f[2], f[3]);
      p = ksf[step * 4 + tig];
    };
    load_k(0, kf[0], kp[0]);
#pragma unroll
    for (int blk = 0; blk < NB; ++blk) {
      uint32_t af[MT][4];
      float sqv[NH], sqmv[NH];  // -q M: two multiplies per block rather than NH * NB more live registers
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        if constexpr (Tr::kQReg) {
          af[mt][0] = qa[mt][blk][0]; af[mt][1] = qa[mt][blk][1];
          af[mt][2] = qa[mt][blk][2]; af[mt][3] = qa[mt][blk][3];
          sqv[2 * mt] = sq[2 * mt][blk];
          sqv[2 * mt + 1] = sq[2 * mt + 1][blk];
        } else {
          ldsm_x4(q_addr + mt * 16 * Tr::QSTR + blk * 32, af[mt][0], af[mt][1], af[mt][2], af[mt][3]);
          sqv[2 * mt] = q_scale23(SQ[(warp * RW + mt * 16 + gid) * NB + blk] * a.scale_log2);
          sqv[2 * mt + 1] = q_scale23(SQ[(warp * RW + mt * 16 + gid + 8) * NB + blk] * a.scale_log2);
        }
      }
#pragma unroll
      for (int h = 0; h < NH; ++h) sqmv[h] = -kMagicF * sqv[h];
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        const int step = blk * 4 + np, cur = step & 1;
        if (step + 1 < 4 * NB) load_k(step + 1, kf[cur ^ 1], kp[cur ^ 1]);
        const float4 k = kp[cur];  // scales of keys 16 np + 2 tig + (0, 1) (n tile 2 np) and + (8, 9) (2 np + 1)
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          int c0[4] = {kMagicI, kMagicI, kMagicI, kMagicI};
          int c1[4] = {kMagicI, kMagicI, kMagicI, kMagicI};
          mma_s8(c0, af[mt], kf[cur][0], kf[cur][1]);
          mma_s8(c1, af[mt], kf[cur][2], kf[cur][3]);
          const float q0 = sqv[2 * mt], q1 = sqv[2 * mt + 1], m0 = sqmv[2 * mt], m1 = sqmv[2 * mt + 1];
          float* s0 = S[mt][2 * np];
          float* s1 = S[mt][2 * np + 1];
          scale_block_pair(s0, s1, c0, c1, q0, q1, m0, m1, k);
        }
      }
    }
    }  // int8 Q.K

    // ---- masking: causal diagonal / Sk tail / explicit mask only ----
    if (a.mask_kind != 0 || j0 + kKeys - 1 > kmin_w) {
      int64_t kmx[NH], mrow[NH];  // last visible key (-1: dead row), mask row offset
#pragma unroll
      for (int h = 0; h < NH; ++h) {
        const int64_t rr = row0 + row_local(h);
        kmx[h] = -1;
        mrow[h] = 0;
        if (rr < rows_here) {
          int64_t hq, i;
          row_pos(rr, hq, i);
          const int64_t km = a.causal ? a.Sk - a.Sq + i : a.Sk - 1;
          kmx[h] = km > a.Sk - 1 ? a.Sk - 1 : km;
          mrow[h] = b * a.ms0 + hq * a.ms1 + i * a.ms2;
        }
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int n = 0; n < 8; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int h = 2 * mt + (e >> 1);
            const int64_t j = j0 + n * 8 + tig * 2 + (e & 1);
            bool vis = j <= kmx[h];
            float x = S[mt][n][e];
            if (vis && a.mask_kind != 0) {
              const int64_t mo = mrow[h] + j * a.ms3;
              if (a.mask_kind == 1) vis = static_cast<const uint8_t*>(a.mask)[mo] != 0;
              else {  // additive; -inf hides the key (even a NaN logit)
                const float mv = load_t(a.mask, mo, a.half);
                vis = mv != -INFINITY;
                x += mv * mask_mul;
              }
            }
            S[mt][n][e] = vis ? x : -INFINITY;
          }
        }
    }
    // ---- online softmax (rows gid, gid + 8 of each m tile; a quad shares a row) ----
    // kLazyMax (D >= 128): the lazy running max. At D = 64 the saved FMULs are half as many and the vote and branch
    // cost more than they save (an 8k causal prefill: 4 % slower), so the max moves on every tile there.
    constexpr bool kLazyMax = D >= 128;
    float alpha[NH];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      float mx[2] = {tree_max(S[mt], 0), tree_max(S[mt], 2)};
      float mu[2];
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int h = 2 * mt + hh;
        mx[hh] = fmaxf(mx[hh], shfl_xor(mx[hh], 1));
        mx[hh] = fmaxf(mx[hh], shfl_xor(mx[hh], 2));
        if constexpr (kQ16) mx[hh] *= c_qk;  // into log2 units (c_qk > 0: the planner's condition)
        // The running max moves only when the tile's passes it by more than kMaxSlack: p <= 2^kMaxSlack then (exact
        // scaling in the f16 P and the float sum), and most tiles leave O's scale alone (alpha == 1, no rescale).
        const float mn = !kLazyMax || mx[hh] > m_run[h] + kMaxSlack ? fmaxf(m_run[h], mx[hh]) : m_run[h];
        mu[hh] = mn == -INFINITY ? 0.f : mn;
        alpha[h] = ex2(m_run[h] - mu[hh]);
        m_run[h] = mn;
      }
      float ls[2] = {0.f, 0.f};
#pragma unroll
      for (int n = 0; n < 8; ++n) {
        if constexpr (kQ16) {  // the scale rides in the FFMA that replaces the subtraction
          S[mt][n][0] = ex2(fmaf(S[mt][n][0], c_qk, -mu[0]));
          S[mt][n][1] = ex2(fmaf(S[mt][n][1], c_qk, -mu[0]));
          S[mt][n][2] = ex2(fmaf(S[mt][n][2], c_qk, -mu[1]));
          S[mt][n][3] = ex2(fmaf(S[mt][n][3], c_qk, -mu[1]));
        } else {
          S[mt][n][0] = ex2(S[mt][n][0] - mu[0]);
          S[mt][n][1] = ex2(S[mt][n][1] - mu[0]);
          S[mt][n][2] = ex2(S[mt][n][2] - mu[1]);
          S[mt][n][3] = ex2(S[mt][n][3] - mu[1]);
        }
        ls[0] += S[mt][n][0] + S[mt][n][1];
        ls[1] += S[mt][n][2] + S[mt][n][3];
      }
      l_run[2 * mt] = l_run[2 * mt] * alpha[2 * mt] + ls[0];
      l_run[2 * mt + 1] = l_run[2 * mt + 1] * alpha[2 * mt + 1] + ls[1];
    }
    bool moved = false;
#pragma unroll
    for (int h = 0; h < NH; ++h) moved |= alpha[h] != 1.f;
    if (!kLazyMax || __any_sync(0xffffffffu, moved)) {  // warp-uniform: D / 2 FMULs a tile saved on most tiles
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int n = 0; n < ND; ++n) {
          oacc[mt][n][0] *= alpha[2 * mt]; oacc[mt][n][1] *= alpha[2 * mt];
          oacc[mt][n][2] *= alpha[2 * mt + 1]; oacc[mt][n][3] *= alpha[2 * mt + 1];
        }
    }

    // ---- O += P.V ----
#if defined(D4A_WGMMA)
    if constexpr (kWG) {
      // One wgmma per 16-key step for the warpgroup's 64 rows x D columns: V (16 keys x D) from the TMA tile (f16
      // V) or the converted buffer (q8_0 / q4_0, written by prep_pipe in the TMA's layout), whose 128-byte slabs
      // of 64 columns are the MN-major canonical layout (LBO: the next 64 columns, one
      // slab = 64 keys x 128 bytes on; SBO: the next 8 keys = 1024 bytes; a 16-key step starts 2048 bytes on).
      // Issued asynchronously; the loop waits for them at the end of the tile (wg_wait_o), before the barrier after
      // which the ring slot is refilled. (Waiting in the next tile instead, with a third ring slot, is slower:
      // ptxas then spills around the accumulators in flight.)
      uint32_t pa[4][4];
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        pa[ks][0] = pack_h2(S[0][2 * ks][0], S[0][2 * ks][1]);
        pa[ks][1] = pack_h2(S[0][2 * ks][2], S[0][2 * ks][3]);
        pa[ks][2] = pack_h2(S[0][2 * ks + 1][0], S[0][2 * ks + 1][1]);
        pa[ks][3] = pack_h2(S[0][2 * ks + 1][2], S[0][2 * ks + 1][3]);
      }
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) {
        const uint64_t desc = wg_desc_mn_sw128(v_addr + ks * 16 * 128, kKeys * 128, 1024);
        if constexpr (D == 128) wgmma_f16_n128(oacc[0], pa[ks], desc);
        else wgmma_f16_n64(oacc[0], pa[ks], desc);
      }
      wgmma_commit();
      return;
    }
#endif
    // V fragments are double-buffered: the ldmatrix of the next step is issued before this step's mmas, so the
    // mmas do not wait for shared memory (without it ptxas reuses one fragment set and every mma stalls).
    constexpr bool kVT = kT && !Tr::kConv;  // f16 V straight from the swizzled TMA tile
    const unsigned v_base = v_addr + (kVT ? v_off_t : v_off);
    auto v_at = [&](int ks, int nd) {
      return kVT ? v_base + (nd / 4) * (kKeys * 128) + ks * 16 * 128 + vx[nd % 4] : v_base + ks * 16 * Tr::VSTR + nd * 32;
    };
    constexpr int NPV = 4 * (ND / 2);  // (16-key step, 16-column pair) steps
    uint32_t vf[2][4];
    ldsm_x4_t(v_at(0, 0), vf[0][0], vf[0][1], vf[0][2], vf[0][3]);
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      uint32_t pa[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        pa[mt][0] = pack_h2(S[mt][2 * ks][0], S[mt][2 * ks][1]);
        pa[mt][1] = pack_h2(S[mt][2 * ks][2], S[mt][2 * ks][3]);
        pa[mt][2] = pack_h2(S[mt][2 * ks + 1][0], S[mt][2 * ks + 1][1]);
        pa[mt][3] = pack_h2(S[mt][2 * ks + 1][2], S[mt][2 * ks + 1][3]);
      }
#pragma unroll
      for (int ndp = 0; ndp < ND / 2; ++ndp) {
        const int step = ks * (ND / 2) + ndp, cur = step & 1;
        if (step + 1 < NPV) {
          const int ks1 = (step + 1) / (ND / 2), nd1 = (step + 1) % (ND / 2);
          ldsm_x4_t(v_at(ks1, nd1), vf[cur ^ 1][0], vf[cur ^ 1][1], vf[cur ^ 1][2],
                    vf[cur ^ 1][3]);
        }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_f16(oacc[mt][2 * ndp], pa[mt], vf[cur][0], vf[cur][1]);
          mma_f16(oacc[mt][2 * ndp + 1], pa[mt], vf[cur][2], vf[cur][3]);
        }
      }
    }
  };

  if constexpr (!kPipe) {
  for (int tile = 0; tile < nkt; ++tile) {
    if (nst == 1) {  // one stage (large D, to fit 2 blocks per SM): no overlap inside the block
      __syncthreads();  // everybody is done with tile - 1
      issue_tile(tile);
      cp_async_wait<0>();
      __syncthreads();
    } else {
      if (nst >= 3) cp_async_wait<1>();
      else cp_async_wait<0>();
      __syncthreads();  // tile ready for all; everybody is done with tile - 1 (its stage, KSF, VH)
      issue_tile(tile + nst - 1);
    }

    uint8_t* st = stages + int(tile % nst) * Tr::STAGE;
    uint8_t* kst = st + Tr::ST_K + Tr::ST_V;
    // ---- per tile, once per block: K scale pairs; V to f16 (and the V checks, see prep_pipe) ----
    k_scales<NB>(reinterpret_cast<const uint16_t*>(kst), KSF, tid);
    constexpr int C8 = D / 8, IT8 = kKeys * C8 / kThreads;  // 16-byte f16 pieces per key, pieces per thread
    vbad = false;  // as in prep_pipe: this thread's V pieces hold a non-finite value
    if constexpr (Tr::kConv) {
      const uint8_t* vr = st + Tr::ST_K;
      const uint16_t* vsr = reinterpret_cast<const uint16_t*>(st + Tr::ST_K + Tr::ST_V + Tr::ST_KS);
      bool past = false;
      auto conv = [&](auto fix) {  // as in prep_pipe: fix (rare, per thread) when a scale is past the limit
#pragma unroll 4
        for (int it = 0; it < IT8; ++it) {
          const int u = tid + it * kThreads, j = u / C8, c8 = u % C8;
          const uint16_t sb = vsr[j * NB + (c8 >> 2)];
          const __half2 s2 = v_scale2<VK, decltype(fix)::value>(sb, past, vbad);
          uint4 o;
          if constexpr (VK == kVQ8) {
            const uint2 w = *reinterpret_cast<const uint2*>(vr + j * Tr::VRAW + c8 * 8);
            o = cvt_q8(w.x, w.y, s2);
          } else {
            const uint32_t w = *reinterpret_cast<const uint32_t*>(vr + j * Tr::VRAW + c8 * 4);
            o = cvt_q4(w, s2);
          }
          if constexpr (decltype(fix)::value) o = hclamp4(o);
          *reinterpret_cast<uint4*>(VH + j * Tr::VSTR + c8 * 16) = o;
        }
      };
      conv(std::false_type{});
      if (past) conv(std::true_type{});
    } else if constexpr (kVCheck) {  // f16 V in the stage (padded rows: only the 2 D bytes of V are read)
      vbad = f16_pieces_nonfinite<IT8, 4>([&](int it) {
        const int u = tid + it * kThreads;
        return *reinterpret_cast<const uint4*>(st + Tr::ST_K + (u / C8) * Tr::VRAW + (u % C8) * 16);
      });
    }
    // KSF / VH ready; and whether the tile holds a V-poisoned key (block-uniform)
    const bool vpois = __syncthreads_or(vbad) != 0;  // (the !VC instances all take the pipelined loop below)
    if (vpois) {  // rare, as v_poison_pipe: a bad key's K scale NaN in KSF (ksf_poison) before compute reads it
      if (tid < kKeys) {
        bool bad;
        if constexpr (Tr::kConv) {
          const uint16_t* vs = reinterpret_cast<const uint16_t*>(st + Tr::ST_K + Tr::ST_V + Tr::ST_KS);
          bad = v_scales_poisoned<NB>(vs + tid * NB);
        } else {
          bad = f16_row_poisoned<C8>(
              [&](int c) { return reinterpret_cast<uint4*>(st + Tr::ST_K + tid * Tr::VRAW + c * 16); });
        }
        if (bad) ksf_poison(KSF, tid);
      }
      __syncthreads();  // the NaN K scales and zeroed V
    }

    const int j0 = tile * kKeys;
    if (j0 > kmax_w) continue;  // no row of this warp sees any key of the tile (uniform per warp)
    compute(j0, smem_u32(st), KSF,
            smem_u32(Tr::kConv ? static_cast<const void*>(VH) : static_cast<const void*>(st + Tr::ST_K)), nullptr);
  }
  } else if constexpr (kQ16P) {
#if defined(D4A_WGMMA)
  // The overlapped QK16 schedule (3 ring slots, 2 blocks per SM). Entering the step of tile t, S(t) is in registers and
  // P.V(t - 1) is done: tile t + 1 has landed and its V is checked (a poisoned key's K row turns NaN before its Q.K)
  // -> one barrier, after which tile t - 1's slot is free -> the tensor copy of tile t + 2 into it -> Q.K(t + 1) is
  // issued -> the softmax and P.V of tile t run while the tensor cores compute Q.K(t + 1) -> wait for both.
  // Unrolled by two so that S(t) and S(t + 1) swap roles instead of being copied.
  float sa[MT][8][4], sb[MT][8][4];
  auto ring_at = [&](int tile) { return smem_u32(smem + kRingO + (tile % 3) * kRingB); };
  __syncthreads();
  if (nkt > 0) {
    wait_tma(0);
    prep_pipe(0);
    if constexpr (kVCheck) {
      if (__syncthreads_or(vbad) != 0) v_poison_pipe(0);  // rare
    }
    qk16_issue(ring_at(0), sa[0]);
    wgmma_wait<0>();
    s_fence(sa[0]);
  }
  auto step = [&](const int tile, float (&sc)[MT][8][4], float (&sn)[MT][8][4]) {
    const bool more = tile + 1 < nkt;
    vbad = false;
    if (more) {
      wait_tma(tile + 1);
      prep_pipe(tile + 1);
    }
    if constexpr (kVCheck) {
      if (__syncthreads_or(vbad) != 0) v_poison_pipe(tile + 1);  // rare
    } else {
      __syncthreads();
    }
    issue_pipe(tile + 2);  // into tile - 1's slot: every thread has waited for P.V(t - 1) before the barrier
    if (more) qk16_issue(ring_at(tile + 1), sn[0]);
    compute(tile * kKeys, 0u, KSF, ring_at(tile) + unsigned(kVOff), &sc);  // S(t): sc
    wg_wait_o();  // Q.K(t + 1) and P.V(t)
    s_fence(sn[0]);
  };
  int tile = 0;
  for (; tile + 1 < nkt; tile += 2) {
    step(tile, sa, sb);
    step(tile + 1, sb, sa);
  }
  if (tile < nkt) step(tile, sa, sb);
#endif
  } else {
  // one barrier per tile: it publishes KSF / f16 V of `tile` (prepared at the end of tile - 1) and K (+ f16 V)
  // of `tile`, and frees the buffers of tile - 1 (ring slot, KSF / V buffer, scale slot) for tile + 1 / + 2.
  cp_async_wait<0>();
  __syncthreads();  // the prologue group (scales of tiles 0 and 1, K / V of tile 0) visible to all
  if (nkt > 0) {
    wait_tma(0);
    prep_pipe(0);
  }
  for (int tile = 0; tile < nkt; ++tile) {
    // and whether the tile holds a V-poisoned key (prep_pipe)
    if constexpr (kVCheck) {
      if (__syncthreads_or(vbad) != 0) v_poison_pipe(tile);  // rare
    } else {
      __syncthreads();
    }
    issue_pipe(tile + 1);  // K / V of tile + 1, scale runs of tile + 2
    const int buf = int(tile & 1);
    const int j0 = tile * kKeys;
    if (kWG || j0 <= kmax_w) {  // else no row of this warp sees any key of the tile (uniform per warp; with wgmma
                                 // all 4 warps take part: such a warp's rows are all masked, so its P is 0)
      const unsigned ring = smem_u32(smem + kRingO + buf * kRingB);
      compute(j0, ring, KSF + buf * Tr::KSF_N,
              Tr::kConv ? smem_u32(VH + buf * Tr::P_VHB) : ring + unsigned(kVOff), nullptr);
    }
    cp_async_wait<0>();  // this thread's copies of tile + 1
    if (tile + 1 < nkt) {
      wait_tma(tile + 1);  // kT: the tensor copies of tile + 1 (every thread reads them: raw V in prep_pipe, K / V)
      prep_pipe(tile + 1);
    }
    wg_wait_o();  // wgmma: this tile's P.V has read its V slot (refilled after the next barrier) and written O
  }
  }
  cp_async_wait<0>();

  // ---- epilogue: quad-reduce the row sums, normalise, store (dead rows: l = 0 -> exact zeros) ----
#pragma unroll
  for (int h = 0; h < NH; ++h) {
    float l = l_run[h];
    l += shfl_xor(l, 1);
    l += shfl_xor(l, 2);
    l_run[h] = l == 0.f ? 0.f : 1.f / l;  // NaN l (a poisoned key was visible): a NaN row
  }
#pragma unroll
  for (int h = 0; h < NH; ++h) {
    const int64_t rr = row0 + row_local(h);
    if (rr >= rows_here) continue;
    int64_t hq, i;
    row_pos(rr, hq, i);
    const int64_t orow = ((b * a.Hq + hq) * a.Sq + i) * D;
    const float inv = l_run[h];
    const int mt = h >> 1, e0 = 2 * (h & 1);
#pragma unroll
    for (int n = 0; n < ND; ++n) {
      const float y0 = oacc[mt][n][e0] * inv, y1 = oacc[mt][n][e0 + 1] * inv;
      const int64_t o = orow + n * 8 + tig * 2;
      if (a.half) *reinterpret_cast<uint32_t*>(static_cast<uint16_t*>(a.out) + o) = pack_h2(sat_half(y0), sat_half(y1));
      else *reinterpret_cast<float2*>(static_cast<float*>(a.out) + o) = make_float2(y0, y1);
    }
  }
#else
  (void)a;
  (void)ncq;
  __trap();
#endif
}

}  // namespace pmma
}  // namespace gpu
}  // namespace dot4attn

#endif  // D4A_CUDA
