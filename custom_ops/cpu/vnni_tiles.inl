// AVX-512 VNNI pieces of the tile kernel (included by tile_kernels.inl inside the avx512vnni namespace only).
//
// Q·K with K transposed. Rows of K are D bytes, so a plain vpdpbusd on a K row produces 16 partial sums that
// still need a horizontal reduction per (row, key, block); with few query rows (decode: g * Sq, often 4) that
// reduction costs more than the dot products. Instead each group of 16 keys is transposed once (16 x 16 dword
// transposes): vector c then holds dword c of all 16 keys, and one vpdpbusd with Q's dword c broadcast (an
// embedded-broadcast memory operand) advances 16 logits of one query row. The transpose is paid per key, not
// per (key, row), and the logits come out as vectors over keys, ready for the softmax.
// vpdpbusd multiplies unsigned by signed bytes: K is stored as k + 128 (xor 0x80) on the unsigned side and Q
// stays signed, so each block's accumulator starts at -128 * sum(q over the block), a per-row constant.
//
// P·V for q8_0 / q4_0 folds the V block scale into p (p * s per key, row and block, vectorised over keys), so
// the inner loop is: decode the payload to floats, one FMA per vector and row. q4_0 decodes a 32-element block
// with two vpermps lookups into a table of -8..7 (the index is the low 4 bits of each dword, so the bytes
// widened to dwords give the low nibbles directly and shifted by 4 the high ones); the accumulators then hold
// even and odd elements apart and are interleaved back when they are stored.

constexpr int kKeyGroup = 16;  // keys per transposed group (one zmm of logits)

// In-register transpose of a 16 x 16 dword matrix (rows r[0..15] -> columns r[0..15]).
static inline void transpose16x16(__m512i* r) {
  __m512i t[16], u[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  // u[4i + k], 128-bit lane L: column 4L + k of rows 4i .. 4i + 3.
  for (int i = 0; i < 16; i += 4) {
    u[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  // A 4 x 4 transpose of 128-bit lanes for each k.
  for (int k = 0; k < 4; ++k) {
    const __m512i x0 = _mm512_shuffle_i32x4(u[k], u[4 + k], 0x44), x1 = _mm512_shuffle_i32x4(u[k], u[4 + k], 0xEE);
    const __m512i y0 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0x44);
    const __m512i y1 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0xEE);
    r[k] = _mm512_shuffle_i32x4(x0, y0, 0x88);
    r[4 + k] = _mm512_shuffle_i32x4(x0, y0, 0xDD);
    r[8 + k] = _mm512_shuffle_i32x4(x1, y1, 0x88);
    r[12 + k] = _mm512_shuffle_i32x4(x1, y1, 0xDD);
  }
}

// kt[c * 16 + j] = dword c of key j (k + 128 per byte) for the keys j < n of a group; missing keys are zeros.
static void transpose_keys(const int8_t* k, int64_t krow, int D, int n, uint32_t* kt) {
  const int nc = D / 4;
  const __m512i c128 = _mm512_set1_epi8(char(0x80));
  for (int c0 = 0; c0 < nc; c0 += 16) {
    const bool half = nc - c0 < 16;  // the trailing 32 bytes when D % 64 == 32
    __m512i r[16];
    for (int j = 0; j < 16; ++j) {
      const int8_t* src = k + int64_t(j) * krow + c0 * 4;
      __m512i x = _mm512_setzero_si512();
      if (j < n) x = half ? _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src)))
                          : _mm512_loadu_si512(src);
      r[j] = _mm512_xor_si512(x, c128);
    }
    transpose16x16(r);
    for (int c = 0; c < (half ? 8 : 16); ++c) _mm512_store_si512(kt + (c0 + c) * 16, r[c]);
  }
}

// sT[b * NK + j] = s[j * nb + b] for j < nk (zeros above): block scales as vectors over keys. `s` is a tile
// buffer of NK * nb floats (entries past nk are stale but readable). D = 128 (nb = 4) takes 4 two-source permutes
// and 4 lane shuffles per 16 keys; other D use gathers (slow on some cores, ~16 loads each).
static void transpose_scales(const float* s, int nb, int nk, float* sT) {
  for (int j0 = 0; j0 < NK; j0 += kKeyGroup) {
    const __m512i lane = _mm512_add_epi32(_mm512_set1_epi32(j0), _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,
                                                                                     11, 12, 13, 14, 15));
    const __mmask16 valid = _mm512_cmplt_epi32_mask(lane, _mm512_set1_epi32(nk));
    if (nb == 4) {
      // z_i: keys j0 + 4i .. + 3, 4 blocks each. t: [block 2h: keys 0..7 | block 2h+1: keys 0..7] (of 8 keys).
      const float* g = s + j0 * 4;
      const __m512 z0 = _mm512_loadu_ps(g), z1 = _mm512_loadu_ps(g + 16), z2 = _mm512_loadu_ps(g + 32),
                   z3 = _mm512_loadu_ps(g + 48);
      for (int h = 0; h < 2; ++h) {
        const __m512i idx = _mm512_add_epi32(_mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29),
                                             _mm512_set1_epi32(2 * h));
        const __m512 t0 = _mm512_permutex2var_ps(z0, idx, z1), t1 = _mm512_permutex2var_ps(z2, idx, z3);
        _mm512_store_ps(sT + (2 * h) * NK + j0, _mm512_maskz_mov_ps(valid, _mm512_shuffle_f32x4(t0, t1, 0x44)));
        _mm512_store_ps(sT + (2 * h + 1) * NK + j0, _mm512_maskz_mov_ps(valid, _mm512_shuffle_f32x4(t0, t1, 0xEE)));
      }
      continue;
    }
    const __m512i base = _mm512_mullo_epi32(lane, _mm512_set1_epi32(nb));
    for (int b = 0; b < nb; ++b)
      _mm512_store_ps(sT + b * NK + j0, _mm512_mask_i32gather_ps(_mm512_setzero_ps(), valid,
                                                                 _mm512_add_epi32(base, _mm512_set1_epi32(b)), s, 4));
  }
}

static inline int64_t qk_prefetch_steps(int nb, int nk) { return int64_t(nb) * ((nk + 15) / 16); }

// acc + dot4(a (unsigned bytes), the signed dword at p broadcast): vpdpbusd with an embedded-broadcast memory
// operand (compilers emit a separate vpbroadcastd for _mm512_set1_epi32(*p), one more vector uop per dot).
static inline __m512i dpbusd_bcst(__m512i acc, __m512i a, const int8_t* p) {
  asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(a), "m"(*reinterpret_cast<const int32_t*>(p)));
  return acc;
}

// 16 logits (one key group) for R rows. acc starts at the rows' -128 * sum(q) per block; two accumulator sets
// (even / odd dwords) keep enough independent vpdpbusd chains in flight for small R.
template <int R>
static inline void qk_group(const int8_t* q, const float* qs, const int32_t* qcorr, int D, const uint32_t* kt,
                            const float* ksT, float* out, PrefetchQueue& pfq) {
  const int nb = D / kBlock;
  __m512 lg[R];
  for (int r = 0; r < R; ++r) lg[r] = _mm512_setzero_ps();
  for (int b = 0; b < nb; ++b) {
    pf_step(pfq);
    __m512i a0[R], a1[R];
    for (int r = 0; r < R; ++r) {
      a0[r] = _mm512_set1_epi32(qcorr[r * nb + b]);
      a1[r] = _mm512_setzero_si512();
    }
    const uint32_t* kb = kt + b * 8 * 16;
    for (int c = 0; c < 8; c += 2) {
      const __m512i k0 = _mm512_load_si512(kb + c * 16), k1 = _mm512_load_si512(kb + (c + 1) * 16);
      for (int r = 0; r < R; ++r) {
        const int8_t* qw = q + int64_t(r) * D + b * kBlock + c * 4;
        a0[r] = dpbusd_bcst(a0[r], k0, qw);
        a1[r] = dpbusd_bcst(a1[r], k1, qw + 4);
      }
    }
    const __m512 skv = _mm512_load_ps(ksT + b * NK);
    for (int r = 0; r < R; ++r)
      lg[r] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(a0[r], a1[r])), skv),
                              _mm512_set1_ps(qs[r * nb + b]), lg[r]);
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(out + int64_t(r) * NK, lg[r]);
}

template <int R>
static inline void qk_rows_rest(int rest, const int8_t* q, const float* qs, const int32_t* qcorr, int D,
                                const uint32_t* kt, const float* ksT, float* out, PrefetchQueue& pfq) {
  if constexpr (R > 0) {
    if (rest == R) qk_group<R>(q, qs, qcorr, D, kt, ksT, out, pfq);
    else qk_rows_rest<R - 1>(rest, q, qs, qcorr, D, kt, ksT, out, pfq);
  }
}

// Per row and block: -128 * sum(q) (the correction for feeding k + 128 to vpdpbusd).
static void q_corrections(const AttendRows& r, std::vector<int32_t>& qcorr) {
  const int nb = r.D / kBlock;
  qcorr.resize(size_t(r.M) * nb);
  for (int m = 0; m < r.M; ++m)
    for (int b = 0; b < nb; ++b) {
      int32_t s = 0;
      for (int e = 0; e < kBlock; ++e) s += r.q[int64_t(m) * r.D + b * kBlock + e];
      qcorr[size_t(m) * nb + b] = -128 * s;
    }
}

// logits[m * NK + j] for the tile's nk keys (lanes up to the next multiple of 16 hold junk the softmax never reads).
static void qk_tile_t(const AttendRows& r, const int32_t* qcorr, const int8_t* k, int64_t krow, const float* ksf,
                      int nk, float* logits, PrefetchQueue& pfq) {
  constexpr int RMAX = 8;
  const int D = r.D, nb = D / kBlock;
  alignas(64) uint32_t kt[kMaxHeadDim / 4 * kKeyGroup];
  alignas(64) float ksT[kMaxHeadDim / kBlock * NK];
  transpose_scales(ksf, nb, nk, ksT);
  for (int j0 = 0; j0 < nk; j0 += kKeyGroup) {
    transpose_keys(k + int64_t(j0) * krow, krow, D, std::min(kKeyGroup, nk - j0), kt);
    int m0 = 0;
    for (; m0 + RMAX <= r.M; m0 += RMAX)
      qk_group<RMAX>(r.q + int64_t(m0) * D, r.qs + m0 * nb, qcorr + m0 * nb, D, kt, ksT + j0,
                     logits + int64_t(m0) * NK + j0, pfq);
    qk_rows_rest<RMAX - 1>(r.M - m0, r.q + int64_t(m0) * D, r.qs + m0 * nb, qcorr + m0 * nb, D, kt, ksT + j0,
                           logits + int64_t(m0) * NK + j0, pfq);
  }
}

// ---- P·V for quantized V, block scale folded into p --------------------------------------------------------
// (Measured: P·V on vpdpbusd with p in fixed point is no faster for few rows; interleaving V by keys costs what
// the fewer multiplies save.)
// Interleave (even, odd) element vectors of a 32-element block back into element order, and the reverse.
static inline void deinterleave32(const float* src, __m512& ev, __m512& od) {
  const __m512 n0 = _mm512_loadu_ps(src), n1 = _mm512_loadu_ps(src + 16);
  const __m512i ie = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  ev = _mm512_permutex2var_ps(n0, ie, n1);
  od = _mm512_permutex2var_ps(n0, _mm512_add_epi32(ie, _mm512_set1_epi32(1)), n1);
}
static inline void interleave32(__m512 ev, __m512 od, float* dst) {
  const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  _mm512_storeu_ps(dst, _mm512_permutex2var_ps(ev, lo, od));
  _mm512_storeu_ps(dst + 16, _mm512_permutex2var_ps(ev, _mm512_add_epi32(lo, _mm512_set1_epi32(8)), od));
}

template <int KIND, int MR>
static inline void pv_rows_q(const float* p, int m0, const void* v, const float* vsT, int nk, int D, int64_t vrow,
                             float* acc, PrefetchQueue& pfq) {
  alignas(64) float ps[MR][NK];
  const __m512 table = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
  const int nkv = (nk + 15) & ~15;
  for (int d0 = 0, b = 0; d0 < D; d0 += kBlock, ++b) {
    for (int r = 0; r < MR; ++r)
      for (int j = 0; j < nkv; j += 16)
        _mm512_store_ps(ps[r] + j, _mm512_mul_ps(_mm512_loadu_ps(p + int64_t(m0 + r) * NK + j),
                                                 _mm512_load_ps(vsT + b * NK + j)));
    __m512 a[MR][2];
    for (int r = 0; r < MR; ++r) {
      float* ar = acc + int64_t(m0 + r) * D + d0;
      if constexpr (KIND == kVQ4) deinterleave32(ar, a[r][0], a[r][1]);
      else a[r][0] = _mm512_loadu_ps(ar), a[r][1] = _mm512_loadu_ps(ar + 16);
    }
    for (int j = 0; j < nk; ++j) {
      if ((j & 3) == 0) pf_step(pfq);
      __m512 x0, x1;
      if constexpr (KIND == kVQ4) {
        const __m512i w = _mm512_cvtepu8_epi32(_mm_loadu_si128(
            reinterpret_cast<const __m128i*>(static_cast<const uint8_t*>(v) + int64_t(j) * vrow + d0 / 2)));
        x0 = _mm512_permutexvar_ps(w, table);                         // low nibbles: elements 0, 2, ..
        x1 = _mm512_permutexvar_ps(_mm512_srli_epi32(w, 4), table);  // high nibbles: elements 1, 3, ..
      } else if constexpr (KIND == kVQ6) {  // element order, like q8_0
        __m128i e0, e1;
        q6_block_levels(static_cast<const uint8_t*>(v) + int64_t(j) * vrow + d0 / kBlock * kQ6BlockBytes, e0, e1);
        x0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(e0));
        x1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(e1));
      } else {
        const int8_t* vj = static_cast<const int8_t*>(v) + int64_t(j) * vrow + d0;
        x0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(vj))));
        x1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(vj + 16))));
      }
      for (int r = 0; r < MR; ++r) {
        const __m512 pb = _mm512_set1_ps(ps[r][j]);
        a[r][0] = _mm512_fmadd_ps(pb, x0, a[r][0]);
        a[r][1] = _mm512_fmadd_ps(pb, x1, a[r][1]);
      }
    }
    for (int r = 0; r < MR; ++r) {
      float* ar = acc + int64_t(m0 + r) * D + d0;
      if constexpr (KIND == kVQ4) interleave32(a[r][0], a[r][1], ar);
      else _mm512_storeu_ps(ar, a[r][0]), _mm512_storeu_ps(ar + 16, a[r][1]);
    }
  }
}

template <int KIND, int MR>
static inline void pv_rest_q(int rest, const float* p, int m0, const void* v, const float* vsT, int nk, int D,
                             int64_t vrow, float* acc, PrefetchQueue& pfq) {
  if constexpr (MR > 0) {
    if (rest == MR) pv_rows_q<KIND, MR>(p, m0, v, vsT, nk, D, vrow, acc, pfq);
    else pv_rest_q<KIND, MR - 1>(rest, p, m0, v, vsT, nk, D, vrow, acc, pfq);
  }
}

// vsf: the tile's V scales as floats [nk][nb].
template <int KIND>
static void pv_tile_q(const float* p, int M, const void* v, const float* vsf, int nk, int D, int64_t vrow,
                      float* acc, PrefetchQueue& pfq) {
  alignas(64) float vsT[kMaxHeadDim / kBlock * NK];
  transpose_scales(vsf, D / kBlock, nk, vsT);
  int m0 = 0;
  for (; m0 + PV_MR <= M; m0 += PV_MR) pv_rows_q<KIND, PV_MR>(p, m0, v, vsT, nk, D, vrow, acc, pfq);
  pv_rest_q<KIND, PV_MR - 1>(M - m0, p, m0, v, vsT, nk, D, vrow, acc, pfq);
}
