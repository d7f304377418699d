// A q8_0 / q4_0 V dequantized once into float16 rows before a long tensor-core prefill (GpuPlan::v_dequant); q6_0 V
// before every tensor-core prefill (that kernel has no q6_0 conversion of its own).
//
// The wgmma prefill multiplies P by float16 V from shared memory, so with a q8_0 / q4_0 V every block converts each
// V tile it reads, and a long causal prefill reads each tile in hundreds of blocks: the conversion costs that kernel
// about a fifth of its time. This kernel converts V once, with the prefill's own conversion (prefill_mma.cuh:
// cvt_q8 / cvt_q4, level * scale rounded once to float16, clamped to +-65504 where the scale is past the float16
// limit), into rows the float16-V instance reads instead; a non-finite scale makes its 32 values NaN, which the
// float16 path treats as the quantized one treats that scale (the key is V-poisoned, vendor.h "The V side"). So the
// output is the same as the quantized instance's, bit for bit. Where the plan copies K too (k_dequant), the same
// conversion (v_piece_f16) runs in K's pass instead (k_dequant.cuh, kv_copy_kernel) and this kernel does not.
#pragma once

#include <cstdint>

#include "gpu/attention_tile.cuh"
#include "gpu/prefill_mma.cuh"
#include "gpu/v_scan.cuh"

#if defined(D4A_HAS_PREFILL_MMA)  // CUDA: the conversion is the tensor-core prefill's
namespace dot4attn {
namespace gpu {

// 8 f16 values (one 16-byte store): elements 8 cb .. 8 cb + 7 of the q6_0 block at blk (common/formats.h: 4 bytes of
// low nibbles from byte 4 cb, high pairs from bytes 16..23 at bit 2 cb), level * s with one f16 rounding (the
// tensor-core decode's dequantization).
// lo, hw: the block's words at bytes 4 cb and 16.
__device__ __forceinline__ uint4 cvt_q6(uint32_t lo, uint2 hw, int cb, __half2 s) {
  const uint32_t h0 = (hw.x >> (2 * cb)) & 0x03030303u, h1 = (hw.y >> (2 * cb)) & 0x03030303u;
  uint32_t r[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {  // elements 2 i, 2 i + 1 -> 1024 + u exactly, minus 1056, times s
    const uint32_t hp = (i < 2 ? h0 : h1) >> (16 * (i & 1));
    const uint32_t u0 = ((lo >> (8 * i)) & 15u) | ((hp & 3u) << 4);
    const uint32_t u1 = ((lo >> (8 * i + 4)) & 15u) | (((hp >> 8) & 3u) << 4);
    __half2 x = __halves2half2(__ushort_as_half(uint16_t(0x6400u | u0)), __ushort_as_half(uint16_t(0x6400u | u1)));
    x = __hsub2(x, __halves2half2(__ushort_as_half(0x6420u), __ushort_as_half(0x6420u)));
    x = __hmul2(x, s);
    r[i] = *reinterpret_cast<const uint32_t*>(&x);
  }
  return make_uint4(r[0], r[1], r[2], r[3]);
}

// The bytes of V row `src` that piece c (8 values) of a VK row comes from: q8_0 8 bytes (x, y), q4_0 4 (x), q6_0 the
// low nibbles' 4 (x) and the block's 8 bytes of high pairs (z, w).
template <int VK>
__device__ __forceinline__ uint4 v_piece_bytes(const uint8_t* src, int c) {
  if constexpr (VK == kVQ8) {
    const uint2 w = *reinterpret_cast<const uint2*>(src + 8 * c);
    return make_uint4(w.x, w.y, 0u, 0u);
  } else if constexpr (VK == kVQ6) {
    const uint8_t* blk = src + 24 * (c / 4);
    const uint2 hw = *reinterpret_cast<const uint2*>(blk + 16);
    return make_uint4(*reinterpret_cast<const uint32_t*>(blk + 4 * (c % 4)), 0u, hw.x, hw.y);
  } else {
    return make_uint4(*reinterpret_cast<const uint32_t*>(src + 4 * c), 0u, 0u, 0u);
  }
}

// Piece c of a VK row from its bytes and scale bits sb, as the prefill converts it.
template <int VK>
__device__ __forceinline__ uint4 v_piece_f16(uint4 w, int c, uint16_t sb) {
  if (half_nonfinite(sb)) return make_uint4(0x7e007e00u, 0x7e007e00u, 0x7e007e00u, 0x7e007e00u);
  const __half2 s2 = __half2half2(__ushort_as_half(sb));
  uint4 o;
  if constexpr (VK == kVQ8) o = pmma::cvt_q8(w.x, w.y, s2);
  else if constexpr (VK == kVQ6) o = cvt_q6(w.x, make_uint2(w.z, w.w), c % 4, s2);
  else o = pmma::cvt_q4(w.x, s2);
  return scales_past_limit<VK>(uint32_t(sb)) ? pmma::hclamp4(o) : o;
}

// V rows into float16 rows (K's layout, 2 D bytes apart in out).
template <int VK, int D>
__global__ void __launch_bounds__(kScanThreads) v_dequant_kernel(const TileArgs a, uint8_t* out) {
  struct Raw {
    uint4 w;
    uint16_t sb;
  };
  rows_to_f16<D>(
      a, out, [](int64_t) { return 0; },
      [&](int64_t r, int c) {  // the piece's bytes and the scale of its block (8 c) / 32
        return Raw{v_piece_bytes<VK>(static_cast<const uint8_t*>(a.v) + r * a.v_stride, c),
                   a.vs[r * a.vs_stride + c / 4]};
      },
      [](const Raw& raw, int c, int) { return v_piece_f16<VK>(raw.w, c, raw.sb); });
}

// Enqueues the conversion of a's V (kind `source`, kVQ8, kVQ4 or kVQ6) into out.
inline void dequant_v(const TileArgs& a, int source, uint8_t* out, gpuStream_t s) {
  const unsigned grid = row_pass_blocks(a);
  with_head_dim(a.D, [&](auto d) {
    constexpr int D = decltype(d)::value;
    if (source == kVQ8) v_dequant_kernel<kVQ8, D><<<grid, kScanThreads, 0, s>>>(a, out);
    else if (source == kVQ6) v_dequant_kernel<kVQ6, D><<<grid, kScanThreads, 0, s>>>(a, out);
    else v_dequant_kernel<kVQ4, D><<<grid, kScanThreads, 0, s>>>(a, out);
  });
  D4A_GPU_CHECK(gpuGetLastError());
}

}  // namespace gpu
}  // namespace dot4attn

#endif  // D4A_HAS_PREFILL_MMA
