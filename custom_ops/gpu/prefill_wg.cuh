// Dot4Attention prefill on Hopper (sm_90a) for D = 256: Q.K on f16 wgmma from K's float16 copy (k_dequant.cuh; the
// QK16 numerics of prefill_mma.cuh, a documented deviation of the contract: docs/ops.md) with Q in shared memory.
//
// Why a kernel of its own: at D = 256 a warpgroup's O accumulator (64 rows x 256 columns, float32) takes 128
// registers per thread, so Q's f16 A fragments (64 more) cannot stay in registers as prefill_mma.cuh keeps them at
// D <= 128; wgmma reads A from shared memory as well as B, so Q lives there, in the same 128-byte-swizzled K-major
// layout as the K tile the TMA lands (one descriptor rule for both). The int8 Q.K of prefill_mma.cuh spends 16 FFMAs
// per logit at D = 256 on its per-32-block scaling alone; here the Q.K is 16 wgmma per 64-key tile.
//
// Block = NWG warpgroups of 128 threads, 64 rows each (rows of one (batch, KV head) row space, as prefill_mma.cuh),
// sharing every K / V tile. Keys in 64-key tiles through a 2-slot ring of [K tile | V tile], each slot filled by one
// thread's tensor copies (2 D / 128 boxes of 64 rows x 128 bytes per tensor) and waited for on its mbarrier. Per tile
// and warpgroup:
//   qk():      S = Q.K, D / 16 wgmma m64n64k16 (A: the warpgroup's Q tile, B: the K tile, both by descriptor);
//   mask():    the causal diagonal / Sk tail / explicit mask, only on tiles that need it;
//   softmax(): online, in log2 units (scale * log2 e in the exponent's FFMA), the lazy running max of
//              prefill_mma.cuh (O rescaled only when a row's max passes its running max by more than 2^8);
//   pv():      O += P.V, P from registers (the f16 logits in the A layout), V by descriptor (MN-major), D / 128
//              wgmma m64n128k16 per 16 keys (D = 64: one m64n64k16).
// One block barrier per tile frees the slot for the tile two ahead. The V check (VC) works as prefill_mma.cuh's:
// with a V scan (a.v_flags) the unchecked instance runs the clean heads and the checked one the flagged heads; a tile
// holding a V-poisoned key zeroes its NaN / Inf halves and makes the key's float16 K row NaN, so its logit is NaN.
#pragma once

#include "gpu/prefill_mma.cuh"

#if defined(D4A_CUDA)

namespace dot4attn {
namespace gpu {
namespace pwg {

constexpr int kKeys = pmma::kKeys;  // keys per tile (64)

// Shared memory of the block (offsets from a 1024-byte aligned base: the swizzle period; the launcher adds the slack).
template <int D, int NWG>
struct Layout {
  static_assert(D == 64 || D == 128 || D == 256, "prefill_wg: D = 64, 128 or 256");
  static constexpr int kRows = 64 * NWG;
  static constexpr int kThreads = 128 * NWG;
  static constexpr int TILE = kKeys * 2 * D;  // 64 rows of 2 D bytes as 128-byte slabs of 64 rows (swizzled)
  static constexpr int SLAB = kKeys * 128;
  static constexpr int OFF_Q = 0;             // one Q tile per warpgroup, the same layout
  static constexpr int OFF_RING = NWG * TILE;  // 2 slots of [K tile | V tile]
  static constexpr int SLOT = 2 * TILE;
  static constexpr int OFF_BAR = OFF_RING + 2 * SLOT;  // 2 mbarriers
  static constexpr int bytes = OFF_BAR + 16 + 1024;
};

// ---- per-tile row math shared by the kernels of this file and prefill_ws.cuh: a thread holds rows r, r + 8 of a
// warp's 16 (r = gid) as the m16n8 C layout of a tile of NK keys (64, or 128 in prefill_ws.cuh's wide tiles),
// s[n][e]: key 8 n + 2 tig + (e & 1), row e >> 1 ----

// Hides the keys rows r0, r0 + 8 (block-relative to the row space; past rows_here: dead rows) do not see in the tile
// at j0: past the causal diagonal (bottom-right aligned) or Sk, or hidden by the explicit mask (an additive mask's
// value, in unscaled dot-product units by mask_mul, is added to the logit). Hidden logits become -inf. I: the type of
// the row's division by Sq (as pmma::run_kminmax's).
template <int NK = kKeys, typename I = int64_t>
__device__ __forceinline__ void mask_tile(const TileArgs& a, float (&s)[NK / 8][4], int64_t b, int64_t hkv, int64_t r0,
                                          int64_t rows_here, int j0, int tig, float mask_mul) {
  int64_t kmx[2], mrow[2];  // last visible key (-1: dead row), mask row offset
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t rr = r0 + 8 * h;
    kmx[h] = -1;
    mrow[h] = 0;
    if (rr < rows_here) {
      const int64_t hq = hkv * a.g + I(rr) / I(a.Sq), i = I(rr) % I(a.Sq);
      const int64_t km = a.causal ? a.Sk - a.Sq + i : a.Sk - 1;
      kmx[h] = km > a.Sk - 1 ? a.Sk - 1 : km;
      mrow[h] = b * a.ms0 + hq * a.ms1 + i * a.ms2;
    }
  }
  if (a.mask_kind == 0) {  // causal or Sk only: one compare of a constant column per logit (the diagonal's tile of
                           // every item runs this, so its 64-bit column math and per-logit mask branch were paid
                           // per item)
    int lim[2];  // the last visible column of the tile, -1 .. NK
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t l = kmx[h] - j0 - 2 * tig;
      lim[h] = l < 0 ? -1 : l > NK ? NK : int(l);
    }
#pragma unroll
    for (int n = 0; n < NK / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (n * 8 + (e & 1) > lim[e >> 1]) s[n][e] = -INFINITY;
    return;
  }
#pragma unroll
  for (int n = 0; n < NK / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int h = e >> 1;
      const int64_t j = j0 + n * 8 + tig * 2 + (e & 1);
      bool vis = j <= kmx[h];
      float x = s[n][e];
      if (vis && a.mask_kind != 0) {
        const int64_t mo = mrow[h] + j * a.ms3;
        if (a.mask_kind == 1) vis = static_cast<const uint8_t*>(a.mask)[mo] != 0;
        else {  // additive; -inf hides the key (even a NaN logit)
          const float mv = load_t(a.mask, mo, a.half);
          vis = mv != -INFINITY;
          x += mv * mask_mul;
        }
      }
      s[n][e] = vis ? x : -INFINITY;
    }
}

// The online softmax of a thread's two rows (a quad shares a row), in log2 units: the running max m (with the lazy
// rule of prefill_mma.cuh: it moves only when a tile's max passes it by more than 2^kMaxSlack, so O is rescaled on
// few tiles) and the running sum l of this thread's columns (the quad's sum is taken at the end).
struct RowSoftmax {
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

  // Turns the tile's logits s (unscaled dot products; c_qk = scale * log2 e > 0) into p = 2^(c_qk s - m) in place,
  // adds them to l and gives each row's factor alpha for O (1 where m did not move). True where O must be rescaled
  // (warp-uniform: some row of the warp has alpha != 1).
  template <int NK = kKeys>
  __device__ __forceinline__ bool update(float (&s)[NK / 8][4], float c_qk, float (&alpha)[2]) {
    float mu[2], mx[2] = {tree_max<NK / 8>(s, 0), tree_max<NK / 8>(s, 2)};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = fmaxf(mx[h], shfl_xor(mx[h], 1));
      mx[h] = fmaxf(mx[h], shfl_xor(mx[h], 2));
      mx[h] *= c_qk;  // into log2 units (c_qk > 0: the planner's condition)
      const float mn = mx[h] > m[h] + pmma::kMaxSlack ? fmaxf(m[h], mx[h]) : m[h];
      mu[h] = mn == -INFINITY ? 0.f : mn;
      alpha[h] = ex2(m[h] - mu[h]);
      m[h] = mn;
    }
    float ls[2] = {0.f, 0.f};
#pragma unroll
    for (int n = 0; n < NK / 8; ++n) {
      s[n][0] = ex2(fmaf(s[n][0], c_qk, -mu[0]));
      s[n][1] = ex2(fmaf(s[n][1], c_qk, -mu[0]));
      s[n][2] = ex2(fmaf(s[n][2], c_qk, -mu[1]));
      s[n][3] = ex2(fmaf(s[n][3], c_qk, -mu[1]));
      ls[0] += s[n][0] + s[n][1];
      ls[1] += s[n][2] + s[n][3];
    }
    l[0] = l[0] * alpha[0] + ls[0];
    l[1] = l[1] * alpha[1] + ls[1];
    return __any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f);  // rare past the first tiles
  }
};

// O of a warpgroup's 64 rows x D columns, float32 in the wgmma C layout: OP blocks of up to 128 columns (one
// m64n128 or, at D = 64, one m64n64 accumulator each), ON 8-column groups per block; o[p][n][e] is column
// 128 p + 8 n + 2 tig + (e & 1) of row gid + 8 (e >> 1) of the warp's 16.
template <int D>
struct OShape {
  static constexpr int P = D >= 128 ? D / 128 : 1, N = D >= 128 ? 16 : D / 8;
};
template <int D>
using OAcc = float[OShape<D>::P][OShape<D>::N][4];

// O (the warpgroup's accumulator, OAcc) times each row's alpha.
template <int D>
__device__ __forceinline__ void rescale_o(OAcc<D>& o, const float (&alpha)[2]) {
#pragma unroll
  for (int p = 0; p < OShape<D>::P; ++p)
#pragma unroll
    for (int n = 0; n < OShape<D>::N; ++n) {
      o[p][n][0] *= alpha[0];
      o[p][n][1] *= alpha[0];
      o[p][n][2] *= alpha[1];
      o[p][n][3] *= alpha[1];
    }
}

// The first row of (batch b, KV head hkv)'s row space in the dense [B, Hq, Sq, D] query and output: its g query heads'
// Sq rows follow each other, so row-space row rr (query head hkv g + rr / Sq, position rr % Sq) is that row + rr, with
// no division.
__device__ __forceinline__ int64_t q_space_row(const TileArgs& a, int64_t b, int64_t hkv) {
  return (b * a.Hq + hkv * a.g) * a.Sq;
}

// The epilogue: the quad's row sums, O / l into the output rows r0, r0 + 8 of the row space whose first row is output
// row q0 (q_space_row; dead rows: l = 0 -> exact zeros; a NaN l, a poisoned key was visible: a NaN row), float16
// saturated.
template <int D>
__device__ __forceinline__ void store_o_rows(const TileArgs& a, const OAcc<D>& o, const RowSoftmax& st, int64_t q0,
                                             int64_t r0, int64_t rows_here, int tig) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = st.l[h];
    l += shfl_xor(l, 1);
    l += shfl_xor(l, 2);
    const float inv = l == 0.f ? 0.f : 1.f / l;
    const int64_t rr = r0 + 8 * h;
    if (rr >= rows_here) continue;
    const int64_t orow = (q0 + rr) * D;
#pragma unroll
    for (int p = 0; p < OShape<D>::P; ++p)
#pragma unroll
      for (int n = 0; n < OShape<D>::N; ++n) {
        const float y0 = o[p][n][2 * h] * inv, y1 = o[p][n][2 * h + 1] * inv;
        const int64_t at = orow + p * 128 + n * 8 + tig * 2;
        *reinterpret_cast<uint32_t*>(static_cast<uint16_t*>(a.out) + at) = pack_h2(sat_half(y0), sat_half(y1));
      }
  }
}

// store_o_rows for the rows r0, r0 + 8 of (batch b, KV head hkv)'s row space.
template <int D>
__device__ __forceinline__ void store_o(const TileArgs& a, const OAcc<D>& o, const RowSoftmax& st,
                                        int64_t b, int64_t hkv, int64_t r0, int64_t rows_here, int tig) {
  store_o_rows<D>(a, o, st, q_space_row(a, b, hkv), r0, rows_here, tig);
}

// Zeros into the output rows r0, r0 + 8 (those of store_o for rows that see no key: l = 0, O = 0).
template <int D>
__device__ __forceinline__ void store_zero(const TileArgs& a, int64_t b, int64_t hkv, int64_t r0, int64_t rows_here,
                                           int tig) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t rr = r0 + 8 * h;
    if (rr >= rows_here) continue;
    const int64_t orow = (q_space_row(a, b, hkv) + rr) * D;
#pragma unroll
    for (int p = 0; p < OShape<D>::P; ++p)
#pragma unroll
      for (int n = 0; n < OShape<D>::N; ++n)
        *reinterpret_cast<uint32_t*>(static_cast<uint16_t*>(a.out) + orow + p * 128 + n * 8 + tig * 2) = 0u;
  }
}

#if defined(D4A_WGMMA)
// The f16 byte b of row r of a swizzled 64-row tile (Q, K or V): the TMA's layout (tma.cuh).
template <int D>
__device__ __forceinline__ int tile_byte(int r, int b) {
  return tma_row_byte<2 * D, kKeys>(r, b);
}

// max |x| over a 32-block of float16 values held by four neighbouring lanes, 8 each (abs_or_inf's: +inf where the
// block holds a NaN or an Inf). On the halves' bits: with the sign cleared their unsigned order is that of the
// magnitudes, and a NaN or Inf is >= 0x7c00; two halves per instruction, one conversion at the end.
__device__ __forceinline__ float block_amax_halves(const uint4 xv) {
#if defined(D4A_HIP)
  const __half2* h = reinterpret_cast<const __half2*>(&xv);
  float amax = 0.f;
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const float2 f = __half22float2(h[u]);
    amax = fmaxf(amax, fmaxf(abs_or_inf(f.x), abs_or_inf(f.y)));
  }
  amax = fmaxf(amax, shfl_xor(amax, 1));
  return fmaxf(amax, shfl_xor(amax, 2));
#else
  constexpr uint32_t kMag = 0x7fff7fffu;
  uint32_t m = __vmaxu2(__vmaxu2(xv.x & kMag, xv.y & kMag), __vmaxu2(xv.z & kMag, xv.w & kMag));
  m = __vmaxu2(m, __shfl_xor_sync(0xffffffffu, m, 1));
  m = __vmaxu2(m, __shfl_xor_sync(0xffffffffu, m, 2));
  const uint32_t top = max(m & 0xffffu, m >> 16);
  return top >= 0x7c00u ? INFINITY : h2f(uint16_t(top));
#endif
}

// One lane's 8 float16 values of Q (a quarter of a 32-block: four neighbouring lanes hold the block), quantized as the
// contract says (int8 levels per 32-block, float32 block scale) and returned as float16 (level * scale, one rounding:
// the QK16 mode's Q). All 32 lanes take part (the block's max over the four lanes).
__device__ __forceinline__ uint4 quantize_q_piece(const uint4 xv) {
  const __half2* h = reinterpret_cast<const __half2*>(&xv);
  float x[8];
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const float2 f = __half22float2(h[u]);
    x[2 * u] = f.x;
    x[2 * u + 1] = f.y;
  }
  const float amax = block_amax_halves(xv);  // the 32-block's (four lanes'); +inf for a NaN / Inf block
  float dv;
  const float sc = q_block_scale(amax, dv);  // NaN for a non-finite block (dv = 0: levels 0)
  float q[8];
  q_block_levels<8>(x, dv, q);
  uint32_t w[4];
#pragma unroll
  for (int u = 0; u < 8; u += 2) w[u / 2] = pack_h2(q[u] * sc, q[u + 1] * sc);
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Rows [r0, r0 + 16) of this warp, quantized as the contract says (int8 levels per 32-block, float32 block scale)
// and stored as float16 (level * scale, one rounding: the QK16 mode's Q) into the warpgroup's Q tile `qt` at tile
// rows wr .. wr + 15. Rows past the row space are zeros.
template <int D>
__device__ __forceinline__ void stage_q(const TileArgs& a, int64_t b, int64_t hkv, int64_t r0, int64_t rows_here,
                                        uint8_t* qt, int wr, int lane) {
  constexpr int LPR = D / 8;     // lanes per row (8 halves each)
  constexpr int RPI = 32 / LPR;  // rows per warp-wide load
  constexpr int QIT = 16 / RPI;
  const int c8 = lane % LPR, rsub = lane / LPR;
  const uint16_t* rows = static_cast<const uint16_t*>(a.q) + q_space_row(a, b, hkv) * D + c8 * 8;
  uint4 xv[QIT];
#pragma unroll
  for (int it = 0; it < QIT; ++it) {
    const int64_t rr = r0 + it * RPI + rsub;
    xv[it] = make_uint4(0, 0, 0, 0);
    if (rr < rows_here) xv[it] = *reinterpret_cast<const uint4*>(rows + rr * D);
  }
#pragma unroll
  for (int it = 0; it < QIT; ++it)
    *reinterpret_cast<uint4*>(qt + tile_byte<D>(wr + it * RPI + rsub, c8 * 16)) = quantize_q_piece(xv[it]);
}

// stage_q in two parts, for a warpgroup that holds its O and P while the next item's Q comes in (prefill_ws.cuh's
// loop across work items): load_q copies the warp's rows as they are (float16) into their places in the Q tile with
// cp.async (no registers held; rows past the row space arrive as zeros), quantize_q waits for them and quantizes
// them in place, one 16-byte piece per lane and step (few registers). Same values as stage_q.
template <int D>
__device__ __forceinline__ void load_q(const TileArgs& a, int64_t b, int64_t hkv, int64_t r0, int64_t rows_here,
                                       uint8_t* qt, int wr, int lane) {
  constexpr int LPR = D / 8, RPI = 32 / LPR, QIT = 16 / RPI;
  const int c8 = lane % LPR, rsub = lane / LPR;
  const uint16_t* rows = static_cast<const uint16_t*>(a.q) + q_space_row(a, b, hkv) * D + c8 * 8;
#pragma unroll
  for (int it = 0; it < QIT; ++it) {
    const int64_t rr = r0 + it * RPI + rsub;
    cp_async16(qt + tile_byte<D>(wr + it * RPI + rsub, c8 * 16), rows + (rr < rows_here ? rr : 0) * D,
               rr < rows_here);
  }
  cp_async_commit();
}

template <int D>
__device__ __forceinline__ void quantize_q(uint8_t* qt, int wr, int lane) {
  constexpr int LPR = D / 8, RPI = 32 / LPR, QIT = 16 / RPI;
  const int c8 = lane % LPR, rsub = lane / LPR;
  cp_async_wait<0>();  // this lane's own copies (each lane quantizes the pieces it copied)
#pragma unroll 1
  for (int it = 0; it < QIT; ++it) {
    uint4* at = reinterpret_cast<uint4*>(qt + tile_byte<D>(wr + it * RPI + rsub, c8 * 16));
    *at = quantize_q_piece(*at);
  }
}

// kDescWords: the descriptors as the tile's low word plus each step's offset (wg_desc_lo, wg_desc), ~60 fewer
// instructions per warp and 128-key tile of the warp-specialized prefill; only at D = 128, where that kernel with
// q_space_row's rows ran 4 % / 2 % faster at 8k / 32k keys. At D = 64 and 256 the same code ran 4-6 % and 11 % slower
// at 32k keys (H100; ptxas schedules the loop differently), so they build each descriptor whole
// (docs/performance.md, "Tried and dropped").
template <int D>
constexpr bool kDescWords = D == 128;

// S (this warp's 16 rows x NK keys in the m16n8 C layout) = Q.K of the warpgroup's Q tile at q (64 rows) and the K
// tile at k (NK rows): issued and committed as one wgmma group (qk_issue), or also waited for (qk).
template <int D, int NK = kKeys>
__device__ __forceinline__ void qk_issue(float (&s)[NK / 8][4], unsigned q, unsigned k) {
  const uint32_t qd = wg_desc_lo(q, kDescLboK), kd = wg_desc_lo(k, kDescLboK);
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    const unsigned qo = kmajor_step(kKeys, ks), ko = kmajor_step(NK, ks);
    const uint64_t a = kDescWords<D> ? wg_desc(qd + qo / 16, kDescHiSw128) : wg_desc_k_sw128(q + qo);
    const uint64_t b = kDescWords<D> ? wg_desc(kd + ko / 16, kDescHiSw128) : wg_desc_k_sw128(k + ko);
    if constexpr (NK == 128) {
      if (ks == 0) wgmma_f16_n128_ss<false>(s, a, b);
      else wgmma_f16_n128_ss<true>(s, a, b);
    } else {
      if (ks == 0) wgmma_f16_n64_ss<false>(s, a, b);
      else wgmma_f16_n64_ss<true>(s, a, b);
    }
  }
  wgmma_commit();
}

// After the wait for the Q.K's group: s is read only from here on.
template <int NK = kKeys>
__device__ __forceinline__ void fence_s(float (&s)[NK / 8][4]) {
#pragma unroll
  for (int n = 0; n < NK / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) wg_reg_fence(s[n][e]);
}

template <int D>
__device__ __forceinline__ void qk(float (&s)[8][4], unsigned q, unsigned k) {
  qk_issue<D>(s, q, k);
  wgmma_wait<0>();
  fence_s(s);
}

// P (this warp's rows of the tile's NK keys, from s) as f16 A fragments of m16n8k16, one per 16 keys.
template <int NK = kKeys>
__device__ __forceinline__ void p_frags(uint32_t (&pa)[NK / 16][4], const float (&s)[NK / 8][4]) {
#pragma unroll
  for (int ks = 0; ks < NK / 16; ++ks) {
    pa[ks][0] = pack_h2(s[2 * ks][0], s[2 * ks][1]);
    pa[ks][1] = pack_h2(s[2 * ks][2], s[2 * ks][3]);
    pa[ks][2] = pack_h2(s[2 * ks + 1][0], s[2 * ks + 1][1]);
    pa[ks][3] = pack_h2(s[2 * ks + 1][2], s[2 * ks + 1][3]);
  }
}

// O += P.V: P from registers (pa, p_frags), V the tile of NK keys at v (MN-major, 128-byte slabs of 64 columns x NK
// keys: LBO the next slab, SBO the next 8 keys); columns 128 p .. 128 p + 127 into o[p] (D = 64: one m64n64).
// Issued and committed; the caller waits (wait_o).
template <int D, int NK = kKeys>
__device__ __forceinline__ void pv_issue(OAcc<D>& o, const uint32_t (&pa)[NK / 16][4], unsigned v) {
  const uint32_t vd = wg_desc_lo(v, NK * 128);  // wg_desc_mn_sw128(v, NK * 128, 1024) as two words
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < NK / 16; ++ks)
#pragma unroll
    for (int p = 0; p < OShape<D>::P; ++p) {
      const unsigned vo = unsigned(p * 2 * NK * 128 + ks * 16 * 128);
      const uint64_t desc =
          kDescWords<D> ? wg_desc(vd + vo / 16, kDescHiSw128) : wg_desc_mn_sw128(v + vo, NK * 128, 1024);
      if constexpr (D == 64) wgmma_f16_n64(o[p], pa[ks], desc);
      else wgmma_f16_n128(o[p], pa[ks], desc);
    }
  wgmma_commit();
}

template <int D>
__device__ __forceinline__ void pv(OAcc<D>& o, const float (&s)[8][4], unsigned v) {
  uint32_t pa[4][4];
  p_frags(pa, s);
  pv_issue<D>(o, pa, v);
}

template <int D>
__device__ __forceinline__ void wait_o(OAcc<D>& o) {
  wgmma_wait<0>();
#pragma unroll
  for (int p = 0; p < OShape<D>::P; ++p)
#pragma unroll
    for (int n = 0; n < OShape<D>::N; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) wg_reg_fence(o[p][n][e]);
}
#endif  // D4A_WGMMA

// ncq > 0: causal with Sq % kRows == 0, blocks in position-major order (heaviest query chunk of every head first).
// VC = false: the instance without the V check, for the heads a V scan left unflagged (see the header). STRIDE: a
// grid smaller than the items, each block walking items gridDim.x apart.
template <int D, int NWG, bool VC, bool STRIDE = false>
__global__ void __launch_bounds__(128 * NWG, 1)
    prefill_wg_kernel(const TileArgs a, const int64_t ncq, const __grid_constant__ TmaMaps tm) {
#if defined(D4A_WGMMA)
  using L = Layout<D, NWG>;
  constexpr int kRows = L::kRows, kThreads = L::kThreads;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + smem_pad1024(smem_raw);
  const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31, gid = lane >> 2, tig = lane & 3;

  uint8_t* ring = smem + L::OFF_RING;
  const unsigned bar0 = smem_u32(smem + L::OFF_BAR);

  // One item, or with STRIDE fewer blocks than items striding over them (the checked companion of prefill_ws.cuh,
  // which runs only the rare V-flagged heads: a launch of one block per item would cost more than the flagged work;
  // the loop costs the instances that run every head registers). `done`: the tiles this block consumed before, so
  // the ring's slot and phase carry on from item to item; `ready`: the ring's barriers are initialized.
  unsigned done = 0;
  bool ready = false;
  auto item = [&](const int64_t idx) {
    // ---- which (batch, KV head, row chunk) ----
    int64_t bh, chunk;
    pmma::item_chunk(a, ncq, idx, bh, chunk);
    if (a.v_flags != nullptr && (a.v_flags[bh] != 0) != VC) return false;  // the other instance runs this head
    const int64_t b = bh / a.Hkv, hkv = bh % a.Hkv;
    const int64_t rows_here = a.g * a.Sq;
    const int64_t row0 = chunk * kRows;
    const int64_t row_end = row0 + kRows < rows_here ? row0 + kRows : rows_here;
    const int64_t wg0 = row0 + 64 * wg, w0 = wg0 + 16 * warp;  // this warpgroup's / warp's first row

    // key bounds: the block's last key (kend, nkt tiles), the warpgroup's (a tile past it is skipped by the whole
    // warpgroup, as wgmma needs), the warp's first causal limit (tiles before it need no masking)
    int kmax_g, kmin_w, kend, nkt;
    {
      int64_t lo, hi, lo_w, hi_w;
      pmma::run_kminmax(a, row0, row_end, lo, hi);
      kend = int(hi + 1 < a.Sk ? hi + 1 : a.Sk);
      nkt = kend > 0 ? (kend + kKeys - 1) / kKeys : 0;
      pmma::run_kminmax(a, wg0, wg0 + 64 < row_end ? wg0 + 64 : row_end, lo, hi);
      kmax_g = int(hi);
      pmma::run_kminmax(a, w0, w0 + 16 < row_end ? w0 + 16 : row_end, lo_w, hi_w);
      kmin_w = int(lo_w < 0x7fffffffLL ? lo_w : 0x7fffffffLL);
    }

    // K and V of `tile` into slot (done + tile) & 1 (one thread; keys past Sk arrive as zeros and are masked like any
    // other)
    auto issue = [&](int tile) {
      if (tid == 0 && tile < nkt) {
        const unsigned t = done + unsigned(tile);
        const unsigned bar = bar0 + 8u * (t & 1u);
        mbar_arrive_expect(bar, 2 * L::TILE);
        uint8_t* slot = ring + (t & 1u) * L::SLOT;
        const int y = tile * kKeys, z = int(bh);
#pragma unroll
        for (int x = 0; x < 2 * D; x += 128) {
          tma_load_3d_plain(smem_u32(slot + (x / 128) * L::SLAB), &tm.k, x, y, z, bar);
          tma_load_3d_plain(smem_u32(slot + L::TILE + (x / 128) * L::SLAB), &tm.v, x, y, z, bar);
        }
      }
    };
    if (!ready) {  // once per block, at its first item (a block whose heads the other instance runs never gets here)
      if (tid == 0) {
        mbar_init(bar0, 1);
        mbar_init(bar0 + 8, 1);
        mbar_init_fence();
      }
      __syncthreads();
      ready = true;
    }
    issue(0);
    issue(1);

    uint8_t* qt = smem + L::OFF_Q + wg * L::TILE;
    stage_q<D>(a, b, hkv, w0, rows_here, qt, 16 * warp, lane);
    fence_proxy_async_smem();  // the generic stores of Q before the wgmma reads them
    __syncthreads();
    const unsigned q_addr = smem_u32(qt);
    // the softmax's exponent factor: scale * log2 e, times 2^8 where this head's K copy holds K times 2^-8
    const float c_qk = a.scale_log2 * (a.k_flags != nullptr && a.k_flags[bh] != 0 ? 256.f : 1.f);
    const float mask_mul = kLog2e / c_qk;  // an additive mask value in unscaled dot-product units

    OAcc<D> o;
#pragma unroll
    for (int p = 0; p < OShape<D>::P; ++p)
#pragma unroll
      for (int n = 0; n < OShape<D>::N; ++n) o[p][n][0] = o[p][n][1] = o[p][n][2] = o[p][n][3] = 0.f;
    RowSoftmax st;
    const int rl0 = 64 * wg + 16 * warp + gid;  // this thread's rows: rl0, rl0 + 8 of the block

    for (int tile = 0; tile < nkt; ++tile) {
      const unsigned t = done + unsigned(tile);
      uint8_t* slot = ring + (t & 1u) * L::SLOT;
      mbar_wait(bar0 + 8u * (t & 1u), (t >> 1) & 1u);
      if constexpr (VC) {
        // this thread's V pieces of the tile; a tile holding a V-poisoned key (block-uniform, rare): thread j < 64
        // zeroes key j's NaN / Inf halves and makes its float16 K row NaN (its logit turns NaN, the K side does the
        // rest)
        constexpr int PIECES = kKeys * 2 * D / 16, PR = 2 * D / 16;
        const bool vbad = pmma::f16_pieces_nonfinite<PIECES / kThreads, 0>([&](int i) {
          const int pc = tid + i * kThreads;
          return *reinterpret_cast<const uint4*>(slot + L::TILE + tile_byte<D>(pc / PR, (pc % PR) * 16));
        });
        if (__syncthreads_or(vbad) != 0) {
          if (tid < kKeys) {
            const bool bad = pmma::f16_row_poisoned<PR>(
                [&](int c) { return reinterpret_cast<uint4*>(slot + L::TILE + tile_byte<D>(tid, c * 16)); });
            if (bad) {
#pragma unroll 4
              for (int c = 0; c < PR; ++c)
                *reinterpret_cast<uint4*>(slot + tile_byte<D>(tid, c * 16)) =
                    make_uint4(0x7e007e00u, 0x7e007e00u, 0x7e007e00u, 0x7e007e00u);
            }
            fence_proxy_async_smem();  // the rewritten bytes before the wgmma reads them
          }
          __syncthreads();
        }
      }
      const int j0 = tile * kKeys;
      if (j0 <= kmax_g) {  // else no row of this warpgroup sees a key of the tile (uniform over the warpgroup)
        float s[8][4];
        qk<D>(s, q_addr, smem_u32(slot));
        if (a.mask_kind != 0 || j0 + kKeys - 1 > kmin_w)
          mask_tile(a, s, b, hkv, row0 + rl0, rows_here, j0, tig, mask_mul);
        float alpha[2];
        if (st.update(s, c_qk, alpha)) rescale_o<D>(o, alpha);
        pv<D>(o, s, smem_u32(slot + L::TILE));
        wait_o<D>(o);
      }
      __syncthreads();   // every warpgroup is done with the slot
      issue(tile + 2);   // into it
    }

    store_o<D>(a, o, st, b, hkv, row0 + rl0, rows_here, tig);
    done += unsigned(nkt);
    return true;
  };
  if constexpr (STRIDE) {
    pdl_wait();  // a programmatic dependent of the warp-specialized kernel (ws_qk16): launched before that one ends
    if (a.v_flags != nullptr) {  // most calls flag no head: one look at every flag, not one (in turn) per item
      bool mine = false;
      for (int64_t h = tid; h < a.B * a.Hkv; h += kThreads) mine |= (a.v_flags[h] != 0) == VC;
      if (__syncthreads_or(mine) == 0) return;
    }
    const int64_t n_items = ncq > 0 ? ncq * a.B * a.Hkv * a.g : a.B * a.Hkv * a.n_chunks;
    for (int64_t idx = int64_t(blockIdx.x); idx < n_items; idx += int64_t(gridDim.x))
      if (item(idx)) __syncthreads();  // every warpgroup is done with its Q tile before the next item's
  } else {
    item(int64_t(blockIdx.x));
  }
#else
  (void)a;
  (void)ncq;
  (void)tm;
  __trap();
#endif
}

}  // namespace pwg
}  // namespace gpu
}  // namespace dot4attn

#endif  // D4A_CUDA
