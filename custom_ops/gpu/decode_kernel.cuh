// The dedicated Dot4Attention decode kernel (decode route and split_k stage 1; prefill keeps the tile kernel).
// Decode is memory-bound by nature, so this kernel is shaped to read every K/V byte once and spend as few
// instructions per key as the contract allows:
//
//   * one block per (batch, KV head, key split[, chunk of RB rows]); all RB = g x Sq rows (grouped heads x
//     query rows) live in the block, so a K/V row is fetched once for all of them. Q is quantized once into
//     shared memory (int8 + float32 scale per 32-block, exactly the contract).
//   * every warp streams its own chunks of KC = warp-size keys (chunks w, w + nw, ...) through its own
//     nst-stage cp.async pipeline (K rows padded to D+16 bytes so lane-per-row 16-byte reads are conflict
//     free, V and the fp16 scale runs unpadded), so warps never wait on each other inside the key loop.
//   * Q.K: one lane per key, D/4 dot4s per row against Q words broadcast from shared memory, no reductions.
//   * online softmax per warp in the log2 domain: one warp max per row and chunk; the running sum stays
//     per lane (alpha is warp-uniform) and is reduced once at the end.
//   * P.V: a lane owns 8 columns of one key slot (D/8 lanes per key, warp/(D/8) keys per step) and dequantizes
//     those 8 values once for all RB rows (q4_0: one 32-bit load = 8 nibbles; the block scale is folded into p).
//   * the end: key slots are summed by shuffles, warps' (m, l, acc) are combined in shared memory, and the block
//     writes the normalised output (decode) or the split partials for the merge kernel (split_k).
//   * non-finite V (vendor.h, "The V side"): every chunk is checked for V-poisoned keys (one warp vote); only
//     chunks that hold one NaN their logits after masking and zero their V (q8_0 / q4_0: scales) in the stage.
// The math is the contract's up to float32 rounding: logits = scale * sum_blocks((sq * sk) * dot), invisible keys
// -inf, rows with no visible key give exact zeros (decode) or l = 0 partials (dropped by the merge).
#pragma once

#include "gpu/attention_tile.cuh"

namespace dot4attn {
namespace gpu {

constexpr int kDecodeMaxThreads = 256;
// Stages per warp of the decode kernels (cp.async / TMA pipelines): the bound of pick_warps_stages, the SIMT
// kernel's wait template and the tensor-core kernel's per-warp stage barriers.
constexpr int kDecodeMaxStages = 3;

// Shared-memory layout (bytes) for warp size ws, nw warps, nst stages; identical on host and device.
struct DecodeLayout {
  int kc, nb, kstr, st_k, st_ks, st_v, st_vs, stage, pbytes, warp_bytes;
  int off_qs, off_qsc, off_kmax, off_mrow, off_wm, off_wl, off_warps, total;
  __host__ __device__ static int up16(int x) { return (x + 15) & ~15; }
  __host__ __device__ DecodeLayout(int vk, int d, int rb, int ws, int nw, int nst) {
    kc = ws;
    nb = d / 32;
    kstr = d + 16;  // D multiple of 32: rows 16 bytes apart mod 128 -> conflict-free 16-byte lane reads
    st_k = kc * kstr;
    st_ks = up16(kc * nb * 2 + 4);  // the scale run plus one leading half-word when it starts 2 bytes off
    st_v = up16(kc * v_row_bytes(vk, d));
    st_vs = v_quantized(vk) ? st_ks : 0;
    stage = st_k + st_ks + st_v + st_vs;
    pbytes = up16(kc * rb * 4);
    warp_bytes = nst * stage + pbytes;
    int o = 0;
    off_qs = o; o += up16(rb * d);
    off_qsc = o; o += up16(rb * nb * 4);
    off_kmax = o; o += up16(rb * 8);
    off_mrow = o; o += up16(rb * 8);
    off_wm = o; o += up16(nw * rb * 4);
    off_wl = o; o += up16(nw * rb * 4);
    off_warps = o; o += nw * warp_bytes;  // after the key loop: the [nw][rb][d] float32 combine buffer
    total = o;
  }
};

__device__ __forceinline__ float bits_f(uint32_t u) {
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

// Whether p holds in some lane of the warp (the same in every lane: a warp-uniform branch).
__device__ __forceinline__ bool decode_any_lane(bool p) {
#if defined(D4A_HIP)
  return __ballot(p) != 0ull;
#else
  return __any_sync(0xffffffffu, p) != 0;
#endif
}

// Copies `cnt` fp16 scales starting at element e0 of src (4-byte aligned base) into dst with 4-byte cp.async
// pieces; the run starts at dst half-word (returned shift), 0 or 1. Past-the-run bytes are zero-filled.
template <int WS>
__device__ __forceinline__ void copy_scales(uint8_t* dst, const uint16_t* src, int64_t e0, int cnt, int lane) {
  const int sh = int(e0 & 1);
  const uint8_t* al = reinterpret_cast<const uint8_t*>(src + (e0 - sh));
  const int bytes_total = 2 * (sh + cnt);
  for (int w = lane; 4 * w < bytes_total; w += WS) {
    const int rem = bytes_total - 4 * w;
    cp_async4(dst + 4 * w, al + 4 * w, rem >= 4 ? 4 : rem);
  }
}

// The fp16 scale rows of keys row0 .. row0 + n - 1 of src (rows `stride` halves apart) into dst as [n][NB] halves.
// mode 0, contiguous rows (stride == NB, dense tensors): one run by copy_scales, dst shifted by the run's half-word
// shift (4-byte aligned src). 1: each row in NB / 2 4-byte pieces (NB and stride even, 4-byte aligned src). 2: element
// by element with plain loads (any stride and alignment; odd NB in a strided cache).
template <int WS, int NB>
__device__ __forceinline__ void copy_scale_rows(uint8_t* dst, const uint16_t* src, int64_t row0, int64_t stride, int n,
                                                int mode, int lane) {
  if (mode == 0) {
    copy_scales<WS>(dst, src, row0 * NB, n * NB, lane);
  } else if (mode == 1) {
    constexpr int PPR = NB / 2 > 0 ? NB / 2 : 1;  // 4-byte pieces per row
    for (int c = lane; c < n * PPR; c += WS) {
      const int r = c / PPR, w = c - r * PPR;
      cp_async4(dst + 4 * c, src + (row0 + r) * stride + 2 * w, 4);
    }
  } else {
    uint16_t* d = reinterpret_cast<uint16_t*>(dst);
    for (int c = lane; c < n * NB; c += WS) {
      const int r = c / NB, w = c - r * NB;
      d[c] = src[(row0 + r) * stride + w];
    }
  }
}

// Scale copy mode of copy_scale_rows for a launch: 0 when every scale row follows the previous one, else 1 where
// whole 4-byte pieces fit the rows, else 2. (The planner gates the decode kernels on 4-byte aligned scale pointers.)
template <int NB, bool VQ>
__device__ __forceinline__ int scale_copy_mode(const TileArgs& a) {
  if (a.ks_stride == NB && (!VQ || a.vs_stride == NB)) return 0;
  return NB % 2 == 0 && a.ks_stride % 2 == 0 && (!VQ || a.vs_stride % 2 == 0) ? 1 : 2;
}

// 8 consecutive V values of one key (columns c0..c0+7, inside one 32-block) as float; quantized formats return
// the integer levels (the block scale is applied to p by the caller).
template <int VK, int D>
__device__ __forceinline__ void load_v8(const uint8_t* vrow, int c0, float (&v)[8]) {
  if constexpr (VK == kVF32) {
    const float4 a = *reinterpret_cast<const float4*>(vrow + 4 * c0);
    const float4 b = *reinterpret_cast<const float4*>(vrow + 4 * c0 + 16);
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
  } else if constexpr (VK == kVF16) {
    const uint4 h = *reinterpret_cast<const uint4*>(vrow + 2 * c0);
    h2x2f(h.x, v[0], v[1]); h2x2f(h.y, v[2], v[3]); h2x2f(h.z, v[4], v[5]); h2x2f(h.w, v[6], v[7]);
  } else if constexpr (VK == kVQ8) {
    const uint2 q = *reinterpret_cast<const uint2*>(vrow + c0);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      v[e] = float(int(int8_t(q.x >> (8 * e))));
      v[4 + e] = float(int(int8_t(q.y >> (8 * e))));
    }
  } else if constexpr (VK == kVQ6) {
    // block c0 / 32: low nibbles as q4_0 (4 bytes), high bits of elements e..e+7 in bytes 16..23 at bit 2 (e / 8)
    // (common/formats.h); level u - 32 -> float exactly: the bits 0x4B000000 | u are 2^23 + u.
    const uint8_t* blk = vrow + (c0 >> 5) * 24;
    const uint32_t q = *reinterpret_cast<const uint32_t*>(blk + (c0 & 31) / 2);
    const uint2 h = *reinterpret_cast<const uint2*>(blk + 16);
    const int sh = 2 * ((c0 & 31) >> 3);
    const uint32_t h0 = (h.x >> sh) & 0x03030303u, h1 = (h.y >> sh) & 0x03030303u;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const uint32_t hi = ((e < 4 ? h0 : h1) >> (8 * (e & 3))) & 3u;
      v[e] = bits_f(0x4B000000u | ((q >> (4 * e)) & 15u) | (hi << 4)) - 8388640.f;
    }
  } else {
    // nibble n -> float(n - 8) exactly: the bits 0x4B000000 | n are 2^23 + n.
    const uint32_t q = *reinterpret_cast<const uint32_t*>(vrow + c0 / 2);
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = bits_f(0x4B000000u | ((q >> (4 * e)) & 15u)) - 8388616.f;
  }
}

// Smallest / largest last-visible key over the block's rows [row0, row0 + nrows) (causal: sk - Sq + i, sk the
// batch row's keys: row_keys).
template <int RB>
__device__ __forceinline__ void decode_row_bounds(const TileArgs& a, int64_t sk, int64_t row0, int nrows,
                                                  int64_t& kmin_all, int64_t& kmax_all) {
  kmin_all = INT64_MAX;
  kmax_all = -1;
  // Row indices inside one (batch, KV head) are below g * Sq (Sq <= 8 on these routes): 32-bit division, which
  // costs a few instructions where a 64-bit one is a long dependent chain on the block's critical path.
  int i = int(row0) % int(a.Sq);
#pragma unroll
  for (int r = 0; r < RB; ++r, i = i + 1 == int(a.Sq) ? 0 : i + 1) {
    if (r < nrows) {
      int64_t km = a.causal ? sk - a.Sq + i : sk - 1;
      if (km > sk - 1) km = sk - 1;
      kmin_all = km < kmin_all ? km : kmin_all;
      kmax_all = km > kmax_all ? km : kmax_all;
    }
  }
}

// Each of the block's RB rows' last visible key (-1 past nrows) and mask row offset, into shared memory.
template <int RB>
__device__ __forceinline__ void decode_row_facts(const TileArgs& a, int64_t sk, int64_t b, int64_t hkv, int64_t row0,
                                                 int nrows, int64_t* kmax_s, int64_t* mrow_s) {
  for (int r = int(threadIdx.x); r < RB; r += int(blockDim.x)) {
    int64_t km = -1, mo = 0;
    if (r < nrows) {
      const int rr = int(row0) + r, i = rr % int(a.Sq);
      const int64_t hq = hkv * a.g + rr / int(a.Sq);
      km = a.causal ? sk - a.Sq + i : sk - 1;
      if (km > sk - 1) km = sk - 1;
      mo = b * a.ms0 + hq * a.ms1 + i * a.ms2;
    }
    kmax_s[r] = km;
    mrow_s[r] = mo;
  }
}

// The block's RB rows of (b, hkv): int8 Q [RB][D] and float32 block scales [RB][D/32] (zeros past nrows), each
// row's last visible key (-1 past nrows) and mask row offset. The caller's barrier publishes them.
template <int RB, int D>
__device__ __forceinline__ void decode_rows_prologue(const TileArgs& a, int64_t sk, int64_t b, int64_t hkv,
                                                     int64_t row0, int nrows, int8_t* qs, float* qsc, int64_t* kmax_s,
                                                     int64_t* mrow_s) {
  constexpr int NB = D / 32;
  const int t = threadIdx.x;
  // One aligned 32-lane group per (row, block), one element per lane: amax by group shuffles and one division
  // per lane keep this prologue short (it is on the critical path of short key ranges). (Issuing a group's Q
  // loads together before quantizing gains nothing at 512 keys.)
  for (int task = t / 32; task < RB * NB; task += int(blockDim.x) / 32) {
    const int r = task / NB, blk = task % NB, e = t % 32;
    float x = 0.f;
    if (r < nrows) {
      const int rr = int(row0) + r, i = rr % int(a.Sq);
      const int64_t hq = hkv * a.g + rr / int(a.Sq);
      x = load_t(a.q, ((b * a.Hq + hq) * a.Sq + i) * D + blk * 32 + e, a.half);
    }
    float dv;
    const float sc = q_block_scale(group32_max(abs_or_inf(x)), dv);  // NaN for a NaN / Inf block (dv = 0)
    float qv = dv == 0.f ? 0.f : rintf(div_rn(x, dv));
    qv = fminf(fmaxf(qv, -127.f), 127.f);
    qs[r * D + blk * 32 + e] = int8_t(int(qv));
    if (e == 0) qsc[r * NB + blk] = sc;
  }
  decode_row_facts<RB>(a, sk, b, hkv, row0, nrows, kmax_s, mrow_s);
}

// After the key loop (its barrier passed): combines the warps' (m, l) [nw][RB] and float32 accumulators
// red [nw][RB][D] into the normalised rows (decode) or the split partials (split_k stage 1). One thread per row
// first turns wm into the warps' weights 2^(m_w - M) and wl[r] into the row sum, so the element loop is plain FMAs.
template <int RB, int D>
__device__ __forceinline__ void decode_rows_finish(const TileArgs& a, float* wm, float* wl, const float* red,
                                                   int nw, int nrows, int64_t row0, int64_t split, int64_t b,
                                                   int64_t hkv) {
  const int t = threadIdx.x;
  auto out_row = [&](int r) {  // (b, hq, i) row of the output; 32-bit division, see decode_row_bounds
    const int rr = int(row0) + r, i = rr % int(a.Sq);
    const int64_t hq = hkv * a.g + rr / int(a.Sq);
    return (b * a.Hq + hq) * a.Sq + i;
  };
  if (t < nrows) {
    float M = -INFINITY;
    for (int k = 0; k < nw; ++k) M = fmaxf(M, wm[k * RB + t]);
    const float Mu = M == -INFINITY ? 0.f : M;
    float l = 0.f;
    for (int k = 0; k < nw; ++k) {
      const float f = exp2f(wm[k * RB + t] - Mu);
      wm[k * RB + t] = f;
      l += f * wl[k * RB + t];
    }
    wl[t] = l;
    if (a.part_acc) {
      const int64_t prow = split * (a.B * a.Hq * a.Sq) + out_row(t);
      a.part_ml[prow * 2] = M;
      a.part_ml[prow * 2 + 1] = l;
    }
  }
  __syncthreads();
  for (int e = t; e < nrows * D; e += int(blockDim.x)) {
    const int r = e / D, c = e % D;
    float o = 0.f;
    for (int k = 0; k < nw; ++k) o += wm[k * RB + r] * red[(k * RB + r) * D + c];
    const int64_t grow = out_row(r);
    if (a.part_acc) {
      a.part_acc[(split * (a.B * a.Hq * a.Sq) + grow) * D + c] = o;
    } else {
      const float l = wl[r];
      const float y = normalise(o, l);
      if (a.half) static_cast<uint16_t*>(a.out)[grow * D + c] = f2h_out(y);
      else static_cast<float*>(a.out)[grow * D + c] = y;
    }
  }
}

// SR (strided rows): K / V rows and their scale rows are the launch's strides apart and kv_rows rows per head (a
// packed or preallocated cache); else the tensors are dense (widths constants here, Sk rows per head) and the kernel
// is today's dense one: even one more live kernel argument (kv_rows) moves ptxas' register allocation by dozens of
// registers in some of these kernels.
template <int VK, int D, int RB, int ST, bool SR = false>
__global__ void __launch_bounds__(kDecodeMaxThreads) decode_kernel(const TileArgs a) {
  constexpr int WS = D4A_WARP, KC = WS, NB = D / 32, KSTR = D + 16;
  constexpr int VROW = v_row_bytes(VK, D);
  constexpr bool VQ = v_quantized(VK);
  constexpr int LPK = D / 8;          // P.V lanes per key (8 columns each)
  constexpr int KPI = WS / LPK;       // keys per P.V step
  constexpr int NPK = D / 16;         // 16-byte K pieces per lane per chunk (KC = WS rows of D bytes)
  constexpr int NPV = VROW / 16;      // 16-byte V pieces per lane per chunk
  static_assert(D % 32 == 0 && D <= 256 && KPI >= 1 && VROW % 16 == 0, "decode shape");

  extern __shared__ __align__(16) uint8_t smem[];
  const int nw = int(blockDim.x) / WS, nst = a.nst;
  const DecodeLayout L(VK, D, RB, WS, nw, nst);
  const int t = threadIdx.x, lane = t % WS, w = t / WS;
  int8_t* qs = reinterpret_cast<int8_t*>(smem + L.off_qs);
  float* qsc = reinterpret_cast<float*>(smem + L.off_qsc);
  int64_t* kmax_s = reinterpret_cast<int64_t*>(smem + L.off_kmax);
  int64_t* mrow_s = reinterpret_cast<int64_t*>(smem + L.off_mrow);
  float* wm = reinterpret_cast<float*>(smem + L.off_wm);
  float* wl = reinterpret_cast<float*>(smem + L.off_wl);
  uint8_t* wbase = smem + L.off_warps + w * L.warp_bytes;
  float* P = reinterpret_cast<float*>(wbase + nst * L.stage);  // [KC][RB] probabilities of this warp's chunk

  // ---- which (row chunk, split, batch, kv head) ------------------------------------------------------------
  // 64-bit here: the 32-bit form (as in decode_mma.cuh) crashes Debian's clang-15 AMDGPU backend for RB = 1
  // ("Cannot select: i1 = mul"), and this kernel is the HIP one.
  const int64_t bid = int64_t(blockIdx.x);
  const int64_t chunk = bid % a.n_chunks, rest = bid / a.n_chunks;
  const int64_t split = rest % a.n_splits, bh = rest / a.n_splits;
  const int64_t b = bh / a.Hkv, hkv = bh % a.Hkv;
  const int64_t row0 = chunk * RB;
  const int nrows = int(a.g * a.Sq - row0 < RB ? a.g * a.Sq - row0 : RB);

  // Row facts (every thread computes them: they bound the key range before any barrier). Dense rows never come with
  // device lengths (dense_rows), and their instances keep the plan's values as constants of the launch.
  const int64_t sk = SR ? row_keys(a, b) : a.Sk, slen = SR ? split_keys(a, sk) : a.split_len;
  int64_t kmin_all, kmax_all;
  decode_row_bounds<RB>(a, sk, row0, nrows, kmin_all, kmax_all);
  const int64_t kbeg = split * slen;
  int64_t kend = kbeg + slen < sk ? kbeg + slen : sk;
  if (kend > kmax_all + 1) kend = kmax_all + 1;
  const int64_t nck = kend > kbeg ? (kend - kbeg + KC - 1) / KC : 0;    // chunks of the block
  const int my_n = nck > w ? (int(nck) - w + nw - 1) / nw : 0;           // chunks of this warp

  // Key j of the block's (b, kv head) is row head_row + j, rows kstr / vstr bytes apart (dense: D / VROW, and the
  // chunk's K / V bytes are one run). Strided, lane l's 16-byte pieces p = l + WS i of a chunk are (row p / NPK,
  // piece p % NPK): where WS is a multiple of NPK (NPV) that is row l / NPK + i WS / NPK, so a lane keeps one base
  // address and steps by a fixed number of bytes.
  const int64_t head_row = bh * (SR ? a.kv_rows : a.Sk);
  const int64_t kstr = SR ? a.k_stride : D, vstr = SR ? a.v_stride : VROW;
  const int8_t* kg = a.k + head_row * kstr;
  const uint8_t* vg = static_cast<const uint8_t*>(a.v) + head_row * vstr;
  const int sc_mode = SR ? scale_copy_mode<NB, VQ>(a) : 0;

  auto issue = [&](int it) {
    if (it < my_n) {
      uint8_t* st = wbase + (it % nst) * L.stage;
      const int64_t j0 = kbeg + int64_t(w + int64_t(it) * nw) * KC;
      const int n = int(kend - j0 < KC ? kend - j0 : KC);
      const int8_t* ksrc = kg + j0 * kstr;
      const uint8_t* vsrc = vg + j0 * vstr;
      if constexpr (!SR) {
#pragma unroll
        for (int i = 0; i < NPK; ++i) {
          const int p = lane + WS * i;
          const int row = p / NPK;
          const bool ok = 16 * p < n * D;
          cp_async16(st + 16 * p + 16 * row, ok ? ksrc + 16 * p : ksrc, ok);
        }
#pragma unroll
        for (int i = 0; i < NPV; ++i) {
          const int p = lane + WS * i;
          const bool ok = 16 * p < n * VROW;
          cp_async16(st + L.st_k + L.st_ks + 16 * p, ok ? vsrc + 16 * p : vsrc, ok);
        }
      } else {
        const int64_t ks = opaque(kstr), vs = opaque(vstr);
#pragma unroll
        for (int i = 0; i < NPK; ++i) {
          const int p = lane + WS * i;
          const int row = p / NPK;
          const bool ok = row < n;
          const int8_t* src = WS % NPK == 0 ? ksrc + (lane / NPK + i * (WS / NPK)) * ks + 16 * (lane % NPK)
                                            : ksrc + row * ks + 16 * (p - row * NPK);
          cp_async16(st + 16 * p + 16 * row, ok ? src : ksrc, ok);
        }
#pragma unroll
        for (int i = 0; i < NPV; ++i) {
          const int p = lane + WS * i;
          const int row = p / NPV;
          const bool ok = row < n;
          const uint8_t* src = WS % NPV == 0 ? vsrc + (lane / NPV + i * (WS / NPV)) * vs + 16 * (lane % NPV)
                                             : vsrc + row * vs + 16 * (p - row * NPV);
          cp_async16(st + L.st_k + L.st_ks + 16 * p, ok ? src : vsrc, ok);
        }
      }
      copy_scale_rows<WS, NB>(st + L.st_k, a.ks, head_row + j0, SR ? a.ks_stride : NB, n, sc_mode, lane);
      if constexpr (VQ)
        copy_scale_rows<WS, NB>(st + L.st_k + L.st_ks + L.st_v, a.vs, head_row + j0, SR ? a.vs_stride : NB, n,
                                sc_mode, lane);
    }
    cp_async_commit();
  };

  // K/V of the first chunks are in flight while Q is quantized.
  for (int s = 0; s < nst - 1; ++s) issue(s);

  // ---- Q: quantize once (float32 scale per 32-block), row facts to shared memory ----------------------------
  decode_rows_prologue<RB, D>(a, sk, b, hkv, row0, nrows, qs, qsc, kmax_s, mrow_s);
  __syncthreads();

  // ---- per-lane state ------------------------------------------------------------------------------------------
  float m_run[RB], l_ln[RB], acc[RB][8];
#pragma unroll
  for (int r = 0; r < RB; ++r) {
    m_run[r] = -INFINITY;
    l_ln[r] = 0.f;
#pragma unroll
    for (int c = 0; c < 8; ++c) acc[r][c] = 0.f;
  }
  const int pv_slot = lane / LPK, cg = lane % LPK;

  for (int it = 0; it < my_n; ++it) {
    issue(it + nst - 1);
    cp_async_wait_stages<ST>(nst);
    warp_sync();

    uint8_t* st = wbase + (it % nst) * L.stage;
    const int64_t j0 = kbeg + int64_t(w + int64_t(it) * nw) * KC;
    const int n = int(kend - j0 < KC ? kend - j0 : KC);
    const int sh = sc_mode == 0 ? int(((head_row + j0) * NB) & 1) : 0;  // half-word shift of a scale run (copy_scales)
    const uint16_t* kss = reinterpret_cast<const uint16_t*>(st + L.st_k) + sh;
    uint8_t* vt = st + L.st_k + L.st_ks;  // V [KC][VROW] (unpadded), then the q8_0 / q4_0 scale run

    // ---- V-poisoned keys (vendor.h, "The V side"): vbad = this lane's key, vany = any key of the chunk ----
    // A bad key's V becomes zeros here (q8_0 / q4_0: its scales, so P.V adds p x 0); P.V reads the stage after the
    // warp_sync that publishes P.
    bool vbad = false, vany;
    if constexpr (VQ) {
      // lane = key: its NB scales (past the chunk: stale bytes, not a key)
      uint16_t* vsk = reinterpret_cast<uint16_t*>(vt + L.st_v) + sh + lane * NB;
#pragma unroll
      for (int blk = 0; blk < NB; ++blk) vbad |= half_nonfinite(vsk[blk]);
      vbad = vbad && lane < n;
      vany = decode_any_lane(vbad);
      if (vany && vbad) {
#pragma unroll
        for (int blk = 0; blk < NB; ++blk) vsk[blk] = 0;
      }
    } else {
      // The chunk in the 16-byte pieces this lane copied (conflict free; zero-filled past the chunk): does it hold a
      // bad key at all? Only then (rare, warp-uniform) each lane checks its own key's row.
      uint32_t nf = 0;
#pragma unroll
      for (int i = 0; i < NPV; ++i)
        nf = v_nonfinite_acc<VK>(nf, *reinterpret_cast<const uint4*>(vt + 16 * (lane + WS * i)));
      vany = decode_any_lane(v_nonfinite(nf));
      if (vany) {
        uint8_t* vrow = vt + lane * VROW;
        uint32_t rf = 0;
        for (int c = 0; c < VROW; c += 16) rf = v_nonfinite_acc<VK>(rf, *reinterpret_cast<const uint4*>(vrow + c));
        vbad = v_nonfinite(rf);
        warp_sync();  // every lane's reads above before any row is zeroed
        if (vbad) {
          for (int c = 0; c < VROW; c += 16) *reinterpret_cast<uint4*>(vrow + c) = make_uint4(0u, 0u, 0u, 0u);
        }
      }
    }

    // ---- logits: lane = key ----
    float s[RB];
#pragma unroll
    for (int r = 0; r < RB; ++r) s[r] = 0.f;
    {
      const int8_t* krow = reinterpret_cast<const int8_t*>(st) + lane * KSTR;
#pragma unroll
      for (int blk = 0; blk < NB; ++blk) {
        const int4 k0 = *reinterpret_cast<const int4*>(krow + blk * 32);
        const int4 k1 = *reinterpret_cast<const int4*>(krow + blk * 32 + 16);
        const float ksf = h2f(kss[lane * NB + blk]);
#pragma unroll
        for (int r = 0; r < RB; ++r) {
          const int4 q0 = *reinterpret_cast<const int4*>(qs + r * D + blk * 32);
          const int4 q1 = *reinterpret_cast<const int4*>(qs + r * D + blk * 32 + 16);
          int dot = 0;
          dot = dot4(k0.x, q0.x, dot); dot = dot4(k0.y, q0.y, dot);
          dot = dot4(k0.z, q0.z, dot); dot = dot4(k0.w, q0.w, dot);
          dot = dot4(k1.x, q1.x, dot); dot = dot4(k1.y, q1.y, dot);
          dot = dot4(k1.z, q1.z, dot); dot = dot4(k1.w, q1.w, dot);
          s[r] += (qsc[r * NB + blk] * ksf) * float(dot);
        }
      }
    }
    // Full chunks that every row sees and no mask: no per-element checks.
    const bool check = a.mask_kind != 0 || n < KC || j0 + KC - 1 > kmin_all;
    float pr[RB];
#pragma unroll
    for (int r = 0; r < RB; ++r) {
      float x = s[r] * a.scale_log2;
      if (check) {
        const int64_t jg = j0 + lane;
        bool vis = lane < n && jg <= kmax_s[r];
        if (vis && a.mask_kind != 0) {
          const int64_t mo = mrow_s[r] + jg * a.ms3;
          if (a.mask_kind == 1) vis = static_cast<const uint8_t*>(a.mask)[mo] != 0;
          else {  // additive, log2 units; -inf hides the key (even a NaN logit)
            const float mv = load_t(a.mask, mo, a.half);
            vis = mv != -INFINITY;
            x = (s[r] * a.scale + mv) * kLog2e;
          }
        }
        if (!vis) x = -INFINITY;
      }
      // after all masking (also on unmasked chunks): a seen V-poisoned key's logit is NaN, so its rows turn NaN
      // through l as for a poisoned K; hidden stays -inf
      if (vany) x = fold_v_poison(x, vbad);
      // ---- online softmax (log2 domain); m is warp-uniform, the sum stays per lane ----
      const float m_new = fmaxf(m_run[r], warp_max(x));
      const float m_use = m_new == -INFINITY ? 0.f : m_new;
      const float alpha = exp2f(m_run[r] - m_use);
      const float p = exp2f(x - m_use);
      l_ln[r] = l_ln[r] * alpha + p;
      m_run[r] = m_new;
      pr[r] = p;
      if (alpha != 1.f) {  // warp-uniform: after the first chunks the running max rarely moves
#pragma unroll
        for (int c = 0; c < 8; ++c) acc[r][c] *= alpha;
      }
    }
    if constexpr (RB % 4 == 0) {
#pragma unroll
      for (int r = 0; r < RB; r += 4)
        *reinterpret_cast<float4*>(P + lane * RB + r) = make_float4(pr[r], pr[r + 1], pr[r + 2], pr[r + 3]);
    } else {
#pragma unroll
      for (int r = 0; r < RB; ++r) P[lane * RB + r] = pr[r];
    }
    warp_sync();

    // ---- P.V: lane = (key slot, 8 columns) ----
    if (pv_slot < KPI) {
      const uint16_t* vss = reinterpret_cast<const uint16_t*>(st + L.st_k + L.st_ks + L.st_v) + sh;
#pragma unroll 2
      for (int j = pv_slot; j < n; j += KPI) {
        float v[8];
        load_v8<VK, D>(vt + j * VROW, cg * 8, v);
        float pj[RB];
        if constexpr (RB % 4 == 0) {
#pragma unroll
          for (int r = 0; r < RB; r += 4) {
            const float4 q = *reinterpret_cast<const float4*>(P + j * RB + r);
            pj[r] = q.x; pj[r + 1] = q.y; pj[r + 2] = q.z; pj[r + 3] = q.w;
          }
        } else {
#pragma unroll
          for (int r = 0; r < RB; ++r) pj[r] = P[j * RB + r];
        }
        if constexpr (VQ) {
          const float vsc = h2f(vss[j * NB + cg / 4]);
#pragma unroll
          for (int r = 0; r < RB; ++r) pj[r] *= vsc;
        }
#pragma unroll
        for (int r = 0; r < RB; ++r)
#pragma unroll
          for (int c = 0; c < 8; ++c) acc[r][c] = fmaf(pj[r], v[c], acc[r][c]);
      }
    }
    warp_sync();  // the stage and P are rewritten by the next iteration
  }
  cp_async_wait<0>();

  // ---- combine: key slots by shuffles, then warps in shared memory ----------------------------------------
#pragma unroll
  for (int r = 0; r < RB; ++r) l_ln[r] = warp_sum(l_ln[r]);
#pragma unroll
  for (int k = 1; k < KPI; ++k) {
#pragma unroll
    for (int r = 0; r < RB; ++r)
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        const float o = shfl(acc[r][c], lane + k * LPK);
        if (pv_slot == 0) acc[r][c] += o;
      }
  }
  __syncthreads();  // every warp is done with its stages: they become the combine buffer
  float* red = reinterpret_cast<float*>(smem + L.off_warps);  // [nw][RB][D]
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < RB; ++r) {
      wm[w * RB + r] = m_run[r];
      wl[w * RB + r] = l_ln[r];
    }
  }
  if (pv_slot == 0) {
#pragma unroll
    for (int r = 0; r < RB; ++r) {
      float* dst = red + (w * RB + r) * D + cg * 8;
      *reinterpret_cast<float4*>(dst) = make_float4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
      *reinterpret_cast<float4*>(dst + 4) = make_float4(acc[r][4], acc[r][5], acc[r][6], acc[r][7]);
    }
  }
  __syncthreads();
  decode_rows_finish<RB, D>(a, wm, wl, red, nw, nrows, row0, split, b, hkv);
}

}  // namespace gpu
}  // namespace dot4attn
