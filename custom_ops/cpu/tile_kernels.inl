// The CPU attention tile kernel, written once and compiled per ISA (isa_scalar.cc, isa_avx2.cc,
// isa_avx512vnni.cc include it inside their own namespace). Structure, per tile of NK keys:
//   1. Q·K: int32 dot4 per 32-block (VNNI vpdpbusd on K transposed per 16 keys, see vnni_tiles.inl / AVX2
//      maddubs / scalar), scaled per block, summed in f32.
//   2. masks: only on tiles that need them (causal tail, explicit masks); prefix tiles skip every check.
//   3. online softmax in base 2 (scales were folded with log2(e) when Q was quantized).
//   4. P·V: V dequantized on the fly (f32, f16, q8_0, q4_0, q6_0), register-blocked over rows (AVX-512: q8_0 /
//      q4_0 / q6_0 with the V block scale folded into p, vnni_tiles.inl).

constexpr int NK = 64;  // keys per tile
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// ------------------------------------------------------------------------------------------------------------
// SIMD layer: a float vector of W lanes and the few loads the kernels need.
#if defined(__AVX512F__)
constexpr int W = 16;
using vf = __m512;
static inline vf vzero() { return _mm512_setzero_ps(); }
static inline vf vset1(float x) { return _mm512_set1_ps(x); }
static inline vf vload(const float* p) { return _mm512_loadu_ps(p); }
static inline void vstore(float* p, vf v) { _mm512_storeu_ps(p, v); }
static inline vf vfma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline vf vmul(vf a, vf b) { return _mm512_mul_ps(a, b); }
static inline vf vmax(vf a, vf b) { return _mm512_max_ps(a, b); }
static inline float vhsum(vf a) { return _mm512_reduce_add_ps(a); }
static inline float vhmax(vf a) { return _mm512_reduce_max_ps(a); }
static inline vf vload_h(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
static inline vf vload_i8(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
#elif defined(__AVX2__)
constexpr int W = 8;
using vf = __m256;
static inline vf vzero() { return _mm256_setzero_ps(); }
static inline vf vset1(float x) { return _mm256_set1_ps(x); }
static inline vf vload(const float* p) { return _mm256_loadu_ps(p); }
static inline void vstore(float* p, vf v) { _mm256_storeu_ps(p, v); }
static inline vf vfma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
static inline vf vmul(vf a, vf b) { return _mm256_mul_ps(a, b); }
static inline vf vmax(vf a, vf b) { return _mm256_max_ps(a, b); }
static inline float vhsum(vf a) {
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}
static inline float vhmax(vf a) {
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
}
static inline vf vload_h(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
static inline vf vload_i8(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
#else
// Portable: a 4-lane struct the compiler may or may not vectorise; no ISA intrinsics.
constexpr int W = 4;
struct vf {
  float x[4];
};
static inline vf vzero() { return vf{{0.f, 0.f, 0.f, 0.f}}; }
static inline vf vset1(float a) { return vf{{a, a, a, a}}; }
static inline vf vload(const float* p) { return vf{{p[0], p[1], p[2], p[3]}}; }
static inline void vstore(float* p, vf v) { std::memcpy(p, v.x, sizeof(v.x)); }
static inline vf vfma(vf a, vf b, vf c) {
  for (int i = 0; i < 4; ++i) c.x[i] = a.x[i] * b.x[i] + c.x[i];
  return c;
}
static inline vf vmul(vf a, vf b) {
  for (int i = 0; i < 4; ++i) a.x[i] *= b.x[i];
  return a;
}
static inline vf vmax(vf a, vf b) {
  for (int i = 0; i < 4; ++i) a.x[i] = std::max(a.x[i], b.x[i]);
  return a;
}
static inline float vhsum(vf a) { return (a.x[0] + a.x[1]) + (a.x[2] + a.x[3]); }
static inline float vhmax(vf a) { return std::max(std::max(a.x[0], a.x[1]), std::max(a.x[2], a.x[3])); }
static inline vf vload_h(const uint16_t* p) {
  return vf{{half_to_float(p[0]), half_to_float(p[1]), half_to_float(p[2]), half_to_float(p[3])}};
}
static inline vf vload_i8(const int8_t* p) { return vf{{float(p[0]), float(p[1]), float(p[2]), float(p[3])}}; }
static inline vf vload_q4(const uint8_t* p) {  // 2 bytes -> 4 values
  return vf{{float((p[0] & 15) - 8), float((p[0] >> 4) - 8), float((p[1] & 15) - 8), float((p[1] >> 4) - 8)}};
}
static inline vf vload_q6(const uint8_t* block, int e) {  // elements e .. e + 3 of a q6_0 block
  return vf{{float(q6_level(block, e)), float(q6_level(block, e + 1)), float(q6_level(block, e + 2)),
             float(q6_level(block, e + 3))}};
}
#endif

#if defined(__AVX2__)
// A q6_0 block's 32 levels n = u - 32 as int8 in element order: elements 0..15 in e0, 16..31 in e1. The low
// nibbles interleave back like q4_0's; the high pairs of elements 0..7 / 8..15 / 16..23 / 24..31 sit at bits 0-1 /
// 2-3 / 4-5 / 6-7 of bytes 16..23, moved to bits 4-5 by 16-bit shifts (the mask drops what crosses a byte).
static inline void q6_block_levels(const uint8_t* block, __m128i& e0, __m128i& e1) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block));
  const __m128i h = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(block + kQ6LowBytes));
  const __m128i m4 = _mm_set1_epi8(0x0f), m2 = _mm_set1_epi8(0x30), bias = _mm_set1_epi8(32);
  const __m128i lo = _mm_and_si128(b, m4);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), m4);
  const __m128i h0 = _mm_and_si128(_mm_unpacklo_epi64(_mm_slli_epi16(h, 4), _mm_slli_epi16(h, 2)), m2);
  const __m128i h1 = _mm_and_si128(_mm_unpacklo_epi64(h, _mm_srli_epi16(h, 2)), m2);
  e0 = _mm_sub_epi8(_mm_or_si128(_mm_unpacklo_epi8(lo, hi), h0), bias);
  e1 = _mm_sub_epi8(_mm_or_si128(_mm_unpackhi_epi8(lo, hi), h1), bias);
}
#endif

// float16 bits -> float32 for n contiguous values.
static inline void halves_to_floats(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__) || defined(__AVX2__)
  for (; i + W <= n; i += W) vstore(dst + i, vload_h(src + i));
#endif
  for (; i < n; ++i) dst[i] = half_to_float(src[i]);
}

// The float16 scales of n rows, `stride` halves apart, nb per row -> dst[n][nb] (one run when the rows are dense).
// Strided rows are gathered first (nb halves = 2..16 bytes each), so the conversion still runs on whole vectors.
static inline void scales_to_floats(const uint16_t* src, int64_t stride, int nb, int n, float* dst) {
  if (stride == nb) return halves_to_floats(src, dst, int64_t(n) * nb);
  uint16_t packed[NK * kMaxHeadDim / kBlock];
  if (nb == 4) {
    for (int j = 0; j < n; ++j) std::memcpy(packed + 4 * j, src + j * stride, 8);
  } else {
    for (int j = 0; j < n; ++j) std::memcpy(packed + j * nb, src + j * stride, size_t(nb) * 2);
  }
  halves_to_floats(packed, dst, int64_t(n) * nb);
}

// float32 -> float16 bits, round to nearest even (vcvtps2ph with imm 0 rounds exactly like float_to_half).
static inline void floats_to_halves(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i),
                        _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#elif defined(__AVX2__)
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
  for (; i < n; ++i) dst[i] = float_to_half(src[i]);
}

// 2^x for x <= 0 (-inf -> 0, NaN -> NaN: a poisoned logit must stay NaN), one vector. Degree-7 Taylor on
// [-0.5, 0.5] after rounding: rel. error < 3e-9.
#if defined(__AVX512F__) || defined(__AVX2__)
static inline vf vexp2(vf v) {
  const vf c = vmax(vset1(-126.f), v);  // maxps returns its second operand when one is NaN
#if defined(__AVX512F__)
  const __mmask16 dead = _mm512_cmp_ps_mask(v, _mm512_set1_ps(-126.f), _CMP_LT_OQ);
  const vf r = _mm512_roundscale_ps(c, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#else
  const vf alive = _mm256_cmp_ps(v, _mm256_set1_ps(-126.f), _CMP_NLT_UQ);  // true for NaN
  const vf r = _mm256_round_ps(c, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#endif
  const vf f = c - r;
  vf p = vset1(1.5252733804e-5f);
  p = vfma(p, f, vset1(1.5403530393e-4f));
  p = vfma(p, f, vset1(1.3333558146e-3f));
  p = vfma(p, f, vset1(9.6181291076e-3f));
  p = vfma(p, f, vset1(5.5504108665e-2f));
  p = vfma(p, f, vset1(2.4022650696e-1f));
  p = vfma(p, f, vset1(6.9314718056e-1f));
  p = vfma(p, f, vset1(1.f));
#if defined(__AVX512F__)
  return _mm512_maskz_mov_ps(_knot_mask16(dead), _mm512_scalef_ps(p, r));
#else
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(r), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(alive, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
#endif
}
#endif

// ------------------------------------------------------------------------------------------------------------
// Spread prefetching. Decode streams K/V from DRAM once, and with the compute between accesses the hardware
// prefetchers run too short a distance ahead: a single thread decoding (32,8,128) at 16k keys with f16 V takes
// about twice as long per (key, KV head) from DRAM as from cache. Bursts of software prefetches at tile starts do
// not help (L1 holds one f16 tile). Instead the data of the next phase is queued at each phase boundary (during
// Q·K: this tile's V; during P·V: the next tile's K) and requested a few lines at a time from inside the compute
// loops (pf_step): f16 V (with the L2 hint below) and q4_0 then run at their cache speed (docs/performance.md).
// Every ISA's Q·K and P·V loops take steps.
struct PrefetchQueue {
  const char* p[4];
  int64_t left[4], step[4];
  int n = 0, i = 0;
  int64_t lines = 0;
  int per_step = 0;
  bool to_l1 = true;  // prefetcht0; false: prefetcht2 (L2), for tiles that would crowd L1
  void clear() { n = i = 0; lines = 0; }
  void add(const void* ptr, int64_t bytes) {
    if (bytes > 0 && n < 4)
      p[n] = static_cast<const char*>(ptr), left[n] = bytes, step[n++] = 64, lines += (bytes + 63) / 64;
  }
  // One line every `stride` bytes, `count` of them: small pieces of other rows (the K scales that a packed cache's
  // pair layout keeps in the V rows).
  void add_strided(const void* ptr, int64_t count, int64_t stride) {
    if (count > 0 && n < 4) p[n] = static_cast<const char*>(ptr), left[n] = count * stride, step[n++] = stride, lines += count;
  }
  void spread_over(int64_t steps) { per_step = int((lines + steps - 1) / std::max<int64_t>(1, steps)); }
};
static inline void pf_step(PrefetchQueue& pfq) {
  int lines = pfq.per_step;
  while (lines > 0 && pfq.i < pfq.n) {
    if (pfq.to_l1) __builtin_prefetch(pfq.p[pfq.i], 0, 3);
    else __builtin_prefetch(pfq.p[pfq.i], 0, 1);
    pfq.p[pfq.i] += pfq.step[pfq.i];
    pfq.left[pfq.i] -= pfq.step[pfq.i];
    if (pfq.left[pfq.i] <= 0) ++pfq.i;
    --lines;
  }
}

// ------------------------------------------------------------------------------------------------------------
// Q·K for one tile: logits[m * NK + j] = sum_b qs[m][b] * ks[j][b] * dot(q[m, b], k[j, b]).
#if defined(__AVX512VNNI__)
// qk_tile_t in vnni_tiles.inl (included after P·V below): K transposed per 16-key group.
#elif defined(__AVX2__)
// maddubs multiplies unsigned by signed bytes too: use |q| and k * sign(q). |q|, |k| <= 127, so the pairwise
// int16 sums (<= 2 * 127 * 127) never saturate.
static inline int64_t qk_prefetch_steps(int, int nk) { return nk; }  // one per key of the first row
static void qk_tile(const AttendRows& r, const int8_t* k, int64_t krow, const float* ksf, int nk, float* logits,
                    PrefetchQueue& pfq) {
  const int D = r.D, nb = D / kBlock;
  const __m256i ones = _mm256_set1_epi16(1);
  for (int m = 0; m < r.M; ++m) {
    const int8_t* qm = r.q + int64_t(m) * D;
    const float* qsm = r.qs + int64_t(m) * nb;
    __m256i qv[8], qa[8];
    for (int b = 0; b < nb; ++b) {
      qv[b] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qm + b * kBlock));
      qa[b] = _mm256_abs_epi8(qv[b]);
    }
    float* out = logits + int64_t(m) * NK;
    for (int j = 0; j < nk; ++j) {
      if (m == 0) pf_step(pfq);
      const int8_t* kj = k + int64_t(j) * krow;
      __m256 acc = _mm256_setzero_ps();
      for (int b = 0; b < nb; ++b) {
        const __m256i kv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kj + b * kBlock));
        const __m256i prod = _mm256_madd_epi16(_mm256_maddubs_epi16(qa[b], _mm256_sign_epi8(kv, qv[b])), ones);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(prod), _mm256_set1_ps(qsm[b] * ksf[j * nb + b]), acc);
      }
      __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
      h = _mm_add_ps(h, _mm_movehl_ps(h, h));
      h = _mm_add_ss(h, _mm_movehdup_ps(h));
      out[j] = _mm_cvtss_f32(h);
    }
  }
}
#else
static inline int64_t qk_prefetch_steps(int, int nk) { return nk; }  // one per key of the first row
static void qk_tile(const AttendRows& r, const int8_t* k, int64_t krow, const float* ksf, int nk, float* logits,
                    PrefetchQueue& pfq) {
  const int D = r.D, nb = D / kBlock;
  for (int m = 0; m < r.M; ++m) {
    const int8_t* qm = r.q + int64_t(m) * D;
    const float* qsm = r.qs + int64_t(m) * nb;
    for (int j = 0; j < nk; ++j) {
      if (m == 0) pf_step(pfq);
      const int8_t* kj = k + int64_t(j) * krow;
      float s = 0.f;
      for (int b = 0; b < nb; ++b) {
        int32_t dot = 0;
        for (int e = 0; e < kBlock; ++e) dot += int32_t(qm[b * kBlock + e]) * int32_t(kj[b * kBlock + e]);
        s += float(dot) * (qsm[b] * ksf[j * nb + b]);
      }
      logits[int64_t(m) * NK + j] = s;
    }
  }
}
#endif

// ------------------------------------------------------------------------------------------------------------
// P·V: acc[m][:] += sum_j p[m][j] * V[j][:], V dequantized once per (chunk of W dims, key) and reused by MR rows
// held in registers.
enum VKind { kVF32, kVF16, kVQ8, kVQ4, kVQ6 };

// One vector of V row j at dims d0.. (q4_0 / q6_0 only on the portable path: the SIMD paths decode whole blocks).
template <int KIND>
static inline vf load_v(const void* v, const float* vsf, int64_t j, int d0, int D, int64_t vrow) {
  if constexpr (KIND == kVF32) return vload(static_cast<const float*>(v) + j * vrow + d0);
  if constexpr (KIND == kVF16) return vload_h(static_cast<const uint16_t*>(v) + j * vrow + d0);
  const float s = vsf[j * (D / kBlock) + d0 / kBlock];
  if constexpr (KIND == kVQ8) return vmul(vload_i8(static_cast<const int8_t*>(v) + j * vrow + d0), vset1(s));
#if !defined(__AVX512F__) && !defined(__AVX2__)
  if constexpr (KIND == kVQ4) return vmul(vload_q4(static_cast<const uint8_t*>(v) + j * vrow + d0 / 2), vset1(s));
  if constexpr (KIND == kVQ6)
    return vmul(vload_q6(static_cast<const uint8_t*>(v) + j * vrow + d0 / kBlock * kQ6BlockBytes, d0 % kBlock),
                vset1(s));
#endif
  return vzero();  // not reached: every KIND that calls this is handled above
}

// One pass covers a whole 32-dim block (CH vectors) so each broadcast of p[m][j] feeds CH FMAs; MR rows of
// accumulators stay in registers (AVX-512: 8 x 2 zmm; AVX2: 2 x 4 ymm; portable: 2 x 8).
constexpr int PV_CH = kBlock / W;
#if defined(__AVX512F__)
constexpr int PV_MR = 8;
#else
constexpr int PV_MR = 2;
#endif

// A whole 32-dim block of V row j (PV_CH vectors). q4_0 decodes its 16 bytes at once: nibbles split and
// interleaved back into element order with one unpack pair; (u - 8) * s = fma(u, s, -8 s) is exact. q6_0 adds its
// high bits in element order (q6_block_levels).
template <int KIND>
static inline void load_v_block(const void* v, const float* vsf, int64_t j, int d0, int D, int64_t vrow, vf* x) {
#if defined(__AVX2__) && !defined(__AVX512F__)  // AVX-512 decodes q4_0 in pv_tile_q (vnni_tiles.inl)
  if constexpr (KIND == kVQ4) {
    const float s = vsf[j * (D / kBlock) + d0 / kBlock];
    const __m128i b =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint8_t*>(v) + j * vrow + d0 / 2));
    const __m128i lo = _mm_and_si128(b, _mm_set1_epi8(0x0f));
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0f));
    const __m128i e0 = _mm_unpacklo_epi8(lo, hi);  // elements 0..15
    const __m128i e1 = _mm_unpackhi_epi8(lo, hi);  // elements 16..31
    const vf vs = vset1(s), voff = vset1(-8.f * s);
    x[0] = vfma(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(e0)), vs, voff);
    x[1] = vfma(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(e0, 8))), vs, voff);
    x[2] = vfma(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(e1)), vs, voff);
    x[3] = vfma(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(e1, 8))), vs, voff);
  } else if constexpr (KIND == kVQ6) {
    __m128i e0, e1;
    q6_block_levels(static_cast<const uint8_t*>(v) + j * vrow + d0 / kBlock * kQ6BlockBytes, e0, e1);
    const vf vs = vset1(vsf[j * (D / kBlock) + d0 / kBlock]);
    x[0] = vmul(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(e0)), vs);
    x[1] = vmul(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(e0, 8))), vs);
    x[2] = vmul(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(e1)), vs);
    x[3] = vmul(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(e1, 8))), vs);
  } else
#endif
  {
    for (int c = 0; c < PV_CH; ++c) x[c] = load_v<KIND>(v, vsf, j, d0 + c * W, D, vrow);
  }
}

template <int KIND, int MR>
static inline void pv_rows(const float* p, int m0, const void* v, const float* vsf, int nk, int D, int64_t vrow,
                           float* acc, PrefetchQueue& pfq) {
  for (int d0 = 0; d0 < D; d0 += kBlock) {
    vf a[MR][PV_CH];
    for (int r = 0; r < MR; ++r)
      for (int c = 0; c < PV_CH; ++c) a[r][c] = vload(acc + int64_t(m0 + r) * D + d0 + c * W);
    for (int j = 0; j < nk; ++j) {
      if ((j & 3) == 0) pf_step(pfq);
      vf x[PV_CH];
      load_v_block<KIND>(v, vsf, j, d0, D, vrow, x);
      for (int r = 0; r < MR; ++r) {
        const vf pb = vset1(p[int64_t(m0 + r) * NK + j]);
        for (int c = 0; c < PV_CH; ++c) a[r][c] = vfma(pb, x[c], a[r][c]);
      }
    }
    for (int r = 0; r < MR; ++r)
      for (int c = 0; c < PV_CH; ++c) vstore(acc + int64_t(m0 + r) * D + d0 + c * W, a[r][c]);
  }
}

// Remainder rows (fewer than PV_MR): picks pv_rows<KIND, rest> at compile time.
template <int KIND, int MR>
static inline void pv_rest(int rest, const float* p, int m0, const void* v, const float* vsf, int nk, int D,
                           int64_t vrow, float* acc, PrefetchQueue& pfq) {
  if constexpr (MR > 0) {
    if (rest == MR) pv_rows<KIND, MR>(p, m0, v, vsf, nk, D, vrow, acc, pfq);
    else pv_rest<KIND, MR - 1>(rest, p, m0, v, vsf, nk, D, vrow, acc, pfq);
  }
}

template <int KIND>
static void pv_tile(const float* p, int M, const void* v, const float* vsf, int nk, int D, int64_t vrow, float* acc,
                    PrefetchQueue& pfq) {
  int m0 = 0;
  for (; m0 + PV_MR <= M; m0 += PV_MR) pv_rows<KIND, PV_MR>(p, m0, v, vsf, nk, D, vrow, acc, pfq);
  pv_rest<KIND, PV_MR - 1>(M - m0, p, m0, v, vsf, nk, D, vrow, acc, pfq);
}

#if defined(__AVX512VNNI__)
#include "cpu/vnni_tiles.inl"  // qk_tile_t (transposed K) and pv_tile_q (scale-folded q8_0 / q4_0 P·V)
#endif

// ------------------------------------------------------------------------------------------------------------
// Masks of one tile (keys k0 .. k0+nk) for the rows that need them.
static void mask_tile(const AttendRows& r, const AttendMask& mask, int64_t k0, int nk, float* logits) {
  constexpr float kLog2e = 1.4426950408889634f;
  for (int m = 0; m < r.M; ++m) {
    float* row = logits + int64_t(m) * NK;
    if (mask.kind != MaskKind::kNone) {
      const int64_t off = r.mask_off[m] + k0 * mask.stride_j;
      if (mask.kind == MaskKind::kBool) {
        const uint8_t* mb = static_cast<const uint8_t*>(mask.base) + off;
        for (int j = 0; j < nk; ++j)
          if (!mb[j * mask.stride_j]) row[j] = kNegInf;
      } else if (mask.half) {  // -inf hides the key even when its logit is NaN (NaN + -inf would poison the row)
        const uint16_t* mh = static_cast<const uint16_t*>(mask.base) + off;
        for (int j = 0; j < nk; ++j) {
          const float a = half_to_float(mh[j * mask.stride_j]);
          row[j] = a == kNegInf ? kNegInf : row[j] + a * kLog2e;
        }
      } else {
        const float* mf = static_cast<const float*>(mask.base) + off;
        for (int j = 0; j < nk; ++j) {
          const float a = mf[j * mask.stride_j];
          row[j] = a == kNegInf ? kNegInf : row[j] + a * kLog2e;
        }
      }
    }
    if (r.k_limit) {  // after the mask: a NaN / +inf mask value on a causally hidden key must not reach the row
      const int64_t visible = std::clamp<int64_t>(r.k_limit[m] - k0, 0, nk);
      for (int j = int(visible); j < nk; ++j) row[j] = kNegInf;
    }
  }
}

// Online softmax over one tile: logits -> p (in place); rescales the state's l and acc when the max moves.
static void softmax_tile(int M, int D, int nk, float* logits, AttendState& st) {
  for (int m = 0; m < M; ++m) {
    float* row = logits + int64_t(m) * NK;
    float mx = kNegInf;
    int j0 = 0;
    if (nk >= W) {
      vf vm = vload(row);
      for (j0 = W; j0 + W <= nk; j0 += W) vm = vmax(vm, vload(row + j0));
      mx = vhmax(vm);
    }
    for (int j = j0; j < nk; ++j) mx = std::max(mx, row[j]);
    const float m_old = st.m[m];
    const float m_new = std::max(m_old, mx);
    if (m_new == kNegInf) {  // nothing visible to this row yet, unless a visible logit is NaN (max skips NaN)
      bool poisoned = false;
      for (int j = 0; j < nk; ++j) poisoned |= row[j] != row[j];
      std::fill(row, row + nk, 0.f);
      if (poisoned) st.m[m] = st.l[m] = std::numeric_limits<float>::quiet_NaN();  // NaN stays: max(NaN, x) = NaN
      continue;
    }
    // p = 2^(logit - max) and its sum in one pass.
    float sum = 0.f;
    int j1 = 0;
#if defined(__AVX512F__) || defined(__AVX2__)
    if (nk >= W) {
      vf vs = vzero();
      const vf mv = vset1(m_new);
      for (; j1 + W <= nk; j1 += W) {
        const vf x = vexp2(vload(row + j1) - mv);
        vstore(row + j1, x);
        vs = vs + x;
      }
      sum = vhsum(vs);
    }
#endif
    for (int j = j1; j < nk; ++j) sum += row[j] = std::exp2(row[j] - m_new);
    if (m_new != m_old) {
      const float alpha = m_old == kNegInf ? 0.f : std::exp2(m_old - m_new);
      float* a = st.acc + int64_t(m) * D;
      for (int d = 0; d < D; ++d) a[d] *= alpha;
      st.l[m] *= alpha;
      st.m[m] = m_new;
    }
    st.l[m] += sum;
  }
}

// q8_0 / q4_0 / q6_0 P·V: the VNNI build's scale-folded kernel (vnni_tiles.inl), the generic one elsewhere.
template <int KIND>
static inline void pv_tile_quant(const float* p, int M, const void* v, const float* vsf, int nk, int D, int64_t vrow,
                                 float* acc, PrefetchQueue& pfq) {
#if defined(__AVX512VNNI__)
  pv_tile_q<KIND>(p, M, v, vsf, nk, D, vrow, acc, pfq);
#else
  pv_tile<KIND>(p, M, v, vsf, nk, D, vrow, acc, pfq);
#endif
}

// One value of V row j at dim d, dequantized (the slow path below; the tile loops decode whole vectors).
static inline float v_value(int kind, const void* v, const float* vsf, int64_t j, int d, int D, int64_t vrow) {
  switch (kind) {
    case kVF32: return static_cast<const float*>(v)[j * vrow + d];
    case kVF16: return half_to_float(static_cast<const uint16_t*>(v)[j * vrow + d]);
    case kVQ8: return float(static_cast<const int8_t*>(v)[j * vrow + d]) * vsf[j * (D / kBlock) + d / kBlock];
    case kVQ6: {
      const uint8_t* block = static_cast<const uint8_t*>(v) + j * vrow + d / kBlock * kQ6BlockBytes;
      return float(q6_level(block, d % kBlock)) * vsf[j * (D / kBlock) + d / kBlock];
    }
    default: {
      const uint8_t b = static_cast<const uint8_t*>(v)[j * vrow + d / 2];
      return float(((d & 1) ? b >> 4 : b & 15) - 8) * vsf[j * (D / kBlock) + d / kBlock];
    }
  }
}

// Whether any of n floats is NaN or +-Inf (exponent all ones), as integer ops the compiler vectorises.
static inline bool any_nonfinite(const float* x, int64_t n) {
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t b;
    std::memcpy(&b, x + i, 4);
    bad |= uint32_t((b & 0x7f800000u) == 0x7f800000u);
  }
  return bad != 0;
}

static inline bool quantized_v(int kind) { return kind == kVQ8 || kind == kVQ4 || kind == kVQ6; }

// Whether the tile's V (nk rows) holds a non-finite value: a NaN scale (q8_0 / q4_0 / q6_0, vsf already converted)
// or NaN / Inf in float V.
static bool v_tile_nonfinite(int kind, const void* v, const float* vsf, int nk, int D, int64_t vrow) {
  if (quantized_v(kind)) return any_nonfinite(vsf, int64_t(nk) * (D / kBlock));
  uint32_t bad = 0;
  for (int j = 0; j < nk; ++j) {
    if (kind == kVF16) {
      const uint16_t* row = static_cast<const uint16_t*>(v) + j * vrow;
      for (int d = 0; d < D; ++d) bad |= uint32_t((row[d] & 0x7c00u) == 0x7c00u);
    } else {
      bad |= uint32_t(any_nonfinite(static_cast<const float*>(v) + j * vrow, D));
    }
  }
  return bad != 0;
}

// Non-finite policy, P·V side: the tile loops multiply every key by its p, so a key hidden from a row (p = 0)
// whose V holds NaN / Inf (or a NaN V scale) would still poison it (0 * NaN). On tiles with hidden keys whose V
// may be non-finite, the rows' accumulators are copied before P·V, and a row whose accumulator turned non-finite
// is redone from its copy with the visible keys only (visible: mask_tile leaves a NaN base untouched instead of
// writing -inf). Rare, so the slow path is scalar.
static void redo_hidden_v_poison(const AttendRows& r, const AttendMask& mask, int64_t k0, int nk, int kind,
                                 const void* vt, const float* vsf, int64_t vrow, const float* p,
                                 const float* acc_before, float* acc) {
  const int D = r.D;
  thread_local std::vector<float> vis;
  bool vis_ready = false;
  for (int m = 0; m < r.M; ++m) {
    float* a = acc + int64_t(m) * D;
    const float* a0 = acc_before + int64_t(m) * D;
    // Turned non-finite in this tile? (A row already non-finite saw a poisoned key before: it is NaN anyway.)
    if (!any_nonfinite(a, D) || any_nonfinite(a0, D)) continue;
    if (!vis_ready) {
      vis.assign(size_t(r.M) * NK, std::numeric_limits<float>::quiet_NaN());
      mask_tile(r, mask, k0, nk, vis.data());
      vis_ready = true;
    }
    std::copy(a0, a0 + D, a);
    for (int j = 0; j < nk; ++j) {
      if (vis[size_t(m) * NK + j] == kNegInf) continue;  // hidden from row m
      const float pj = p[int64_t(m) * NK + j];
      for (int d = 0; d < D; ++d) a[d] += pj * v_value(kind, vt, vsf, j, d, D, vrow);
    }
  }
}

static void attend(const AttendRows& r, const AttendKv& kv, const AttendMask& mask, int64_t k_begin,
                   int64_t k_end, AttendState& st) {
  const int D = r.D, nb = D / kBlock, M = r.M;
  thread_local std::vector<float> logits_buf, ksf_buf, vsf_buf, acc_before;
  logits_buf.resize(size_t(M) * NK);
  ksf_buf.resize(size_t(NK) * nb);
  vsf_buf.resize(size_t(NK) * nb);
  float* logits = logits_buf.data();
  float* ksf = ksf_buf.data();
  float* vsf = vsf_buf.data();
#if defined(__AVX512VNNI__)
  thread_local std::vector<int32_t> qcorr;
  q_corrections(r, qcorr);
#endif
  // Tiles that end at or before every row's causal limit, without an explicit mask, need no masking at all.
  int64_t clean_end = k_end;
  if (r.k_limit) {
    for (int m = 0; m < M; ++m) clean_end = std::min(clean_end, r.k_limit[m]);
  }
  const bool has_mask = mask.kind != MaskKind::kNone;
  const int kind = kv.format == VFormat::kQ8_0   ? kVQ8
                   : kv.format == VFormat::kQ4_0 ? kVQ4
                   : kv.format == VFormat::kQ6_0 ? kVQ6
                   : kv.v_half                   ? kVF16
                                                 : kVF32;
  // Rows may be strided (the packed cache): kv.v_stride elements of V, kv.k_stride bytes of K, kv.*s_stride halves.
  const int64_t v_elem = kind == kVF32 ? 4 : kind == kVF16 ? 2 : 1;
  const int64_t v_row_bytes = kv.v_stride * v_elem;
  const int64_t v_dense_bytes = kind == kVF32 ? 4 * D : kind == kVF16 ? 2 * D : payload_bytes(D, kv.format);
  PrefetchQueue pfq;
  // Strided K scales inside the K rows come with them; elsewhere (the pair layout's V rows) they take a line each.
  const int64_t ks_off = reinterpret_cast<const char*>(kv.ks) - reinterpret_cast<const char*>(kv.k);
  const bool ks_in_k_rows = kv.ks_stride * 2 == kv.k_stride && ks_off >= 0 && ks_off < kv.k_stride;
  // A float V tile (16 KB at D = 128 in f16) plus the next K tile crowd a 32 KB L1: prefetch those into L2
  // (single thread, 16k keys from DRAM: ~10 % less time per key and KV head than into L1); q8_0 / q4_0 / q6_0 go
  // to L1.
  pfq.to_l1 = v_dense_bytes <= D;
  for (int64_t k0 = k_begin; k0 < k_end; k0 += NK) {
    const int nk = int(std::min<int64_t>(NK, k_end - k0));
    // Q·K phase: this tile's V and V scales.
    pfq.clear();
    pfq.add(static_cast<const char*>(kv.v) + k0 * v_row_bytes, nk * v_row_bytes);
    if (kv.vs && kv.vs_stride == nb) pfq.add(kv.vs + k0 * nb, int64_t(nk) * nb * 2);  // else inside the V rows
    pfq.spread_over(qk_prefetch_steps(nb, nk));
    scales_to_floats(kv.ks + k0 * kv.ks_stride, kv.ks_stride, nb, nk, ksf);
#if defined(__AVX512VNNI__)
    qk_tile_t(r, qcorr.data(), kv.k + k0 * kv.k_stride, kv.k_stride, ksf, nk, logits, pfq);
#else
    qk_tile(r, kv.k + k0 * kv.k_stride, kv.k_stride, ksf, nk, logits, pfq);
#endif
    const bool hides_keys = has_mask || k0 + nk > clean_end;
    if (hides_keys) mask_tile(r, mask, k0, nk, logits);
    softmax_tile(M, D, nk, logits, st);
    const void* vt = static_cast<const char*>(kv.v) + k0 * v_row_bytes;
    if (quantized_v(kind)) scales_to_floats(kv.vs + k0 * kv.vs_stride, kv.vs_stride, nb, nk, vsf);
    // A hidden key with a non-finite V must not reach the rows it is hidden from. Checking the tile's V costs
    // nk x D reads (float V) or nk x D/32 (scales); copying the rows' accumulators M x D: take the cheaper guard.
    const bool guard_v = hides_keys && ((kind == kVF32 || kind == kVF16) && M * 2 < NK
                                            ? true
                                            : v_tile_nonfinite(kind, vt, vsf, nk, D, kv.v_stride));
    if (guard_v) acc_before.assign(st.acc, st.acc + int64_t(M) * D);
    // P·V phase: the next tile's K and K scales, one step per (32-block, 4 keys) of the first row pass.
    pfq.clear();
    if (k0 + NK < k_end) {
      const int64_t k1 = k0 + NK;
      const int nk1 = int(std::min<int64_t>(NK, k_end - k1));
      pfq.add(kv.k + k1 * kv.k_stride, int64_t(nk1) * kv.k_stride);
      if (kv.ks_stride == nb) pfq.add(kv.ks + k1 * nb, int64_t(nk1) * nb * 2);
      else if (!ks_in_k_rows) pfq.add_strided(kv.ks + k1 * kv.ks_stride, nk1, kv.ks_stride * 2);  // in other rows
    }
    pfq.spread_over(int64_t(nb) * ((nk + 3) / 4));
    switch (kind) {
      case kVF32: pv_tile<kVF32>(logits, M, vt, nullptr, nk, D, kv.v_stride, st.acc, pfq); break;
      case kVF16: pv_tile<kVF16>(logits, M, vt, nullptr, nk, D, kv.v_stride, st.acc, pfq); break;
      case kVQ8:
        pv_tile_quant<kVQ8>(logits, M, vt, vsf, nk, D, kv.v_stride, st.acc, pfq);
        break;
      case kVQ4:
        pv_tile_quant<kVQ4>(logits, M, vt, vsf, nk, D, kv.v_stride, st.acc, pfq);
        break;
      default:
        pv_tile_quant<kVQ6>(logits, M, vt, vsf, nk, D, kv.v_stride, st.acc, pfq);
        break;
    }
    if (guard_v) redo_hidden_v_poison(r, mask, k0, nk, kind, vt, vsf, kv.v_stride, logits, acc_before.data(), st.acc);
  }
}
