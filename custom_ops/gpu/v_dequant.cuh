// A q8_0 / q4_0 V dequantized once into float16 rows before a long tensor-core prefill (GpuPlan::v_dequant); q6_0 V
// before every tensor-core prefill (that kernel has no q6_0 conversion of its own).
//
// The wgmma prefill multiplies P by float16 V from shared memory, so with a q8_0 / q4_0 V every block converts each
// V tile it reads, and a long causal prefill reads each tile in hundreds of blocks: the conversion costs that kernel
// about a fifth of its time. This kernel converts V once, with the prefill's own conversion (prefill_mma.cuh:
// cvt_q8 / cvt_q4, level * scale rounded once to float16, clamped to +-65504 where the scale is past the float16
// limit), into rows the float16-V instance reads instead; a non-finite scale makes its 32 values NaN, which the
// float16 path treats as the quantized one treats that scale (the key is V-poisoned, vendor.h "The V side"). So the
// output is the same as the quantized instance's, bit for bit.
#pragma once

#include <cstdint>

#include "gpu/attention_tile.cuh"
#include "gpu/prefill_mma.cuh"

#if defined(D4A_HAS_PREFILL_MMA)  // CUDA: the conversion is the tensor-core prefill's
namespace dot4attn {
namespace gpu {

constexpr int kDequantThreads = 256;

// 8 f16 values (one 16-byte store): elements 8 cb .. 8 cb + 7 of the q6_0 block at blk (common/formats.h: 4 bytes of
// low nibbles from byte 4 cb, high pairs from bytes 16..23 at bit 2 cb), level * s with one f16 rounding (the
// tensor-core decode's dequantization).
__device__ __forceinline__ uint4 cvt_q6(const uint8_t* blk, int cb, __half2 s) {
  const uint32_t lo = *reinterpret_cast<const uint32_t*>(blk + 4 * cb);
  const uint2 hw = *reinterpret_cast<const uint2*>(blk + 16);
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

// One thread per 8 values (16 output bytes) of a key's row. Rows keep the K layout (key j of (b, kv head) bh is
// row bh * kv_rows + j); only keys < Sk are read and written. out rows are 2 * D bytes apart.
template <int VK>
__global__ void __launch_bounds__(kDequantThreads) v_dequant_kernel(const TileArgs a, uint8_t* out) {
  const int per_row = a.D / 8;
  const int64_t n = a.B * a.Hkv * a.Sk * per_row;
  for (int64_t i = int64_t(blockIdx.x) * kDequantThreads + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * kDequantThreads) {
    const int c = int(i % per_row);
    const int64_t key = i / per_row, j = key % a.Sk, bh = key / a.Sk;
    const int64_t r = bh * a.kv_rows + j;
    const uint8_t* src = static_cast<const uint8_t*>(a.v) + r * a.v_stride;
    const uint16_t sb = a.vs[r * a.vs_stride + c / 4];  // 8 values of block (8 c) / 32
    uint4 o;
    if (half_nonfinite(sb)) {
      o = make_uint4(0x7e007e00u, 0x7e007e00u, 0x7e007e00u, 0x7e007e00u);
    } else {
      const __half2 s2 = __half2half2(__ushort_as_half(sb));
      if constexpr (VK == kVQ8) {
        const uint2 w = *reinterpret_cast<const uint2*>(src + 8 * c);
        o = pmma::cvt_q8(w.x, w.y, s2);
      } else if constexpr (VK == kVQ6) {
        o = cvt_q6(src + 24 * (c / 4), c % 4, s2);
      } else {
        o = pmma::cvt_q4(*reinterpret_cast<const uint32_t*>(src + 4 * c), s2);
      }
      if (scales_past_limit<VK>(uint32_t(sb))) o = pmma::hclamp4(o);
    }
    *reinterpret_cast<uint4*>(out + r * (2 * a.D) + 16 * c) = o;
  }
}

// Enqueues the conversion of a's V (kind `source`, kVQ8, kVQ4 or kVQ6) into out.
inline void dequant_v(const TileArgs& a, int source, uint8_t* out, gpuStream_t s) {
  const int64_t n = a.B * a.Hkv * a.Sk * (a.D / 8);
  const unsigned grid = unsigned(n / kDequantThreads + 1 < (1 << 20) ? n / kDequantThreads + 1 : (1 << 20));
  if (source == kVQ8) v_dequant_kernel<kVQ8><<<grid, kDequantThreads, 0, s>>>(a, out);
  else if (source == kVQ6) v_dequant_kernel<kVQ6><<<grid, kDequantThreads, 0, s>>>(a, out);
  else v_dequant_kernel<kVQ4><<<grid, kDequantThreads, 0, s>>>(a, out);
  D4A_GPU_CHECK(gpuGetLastError());
}

}  // namespace gpu
}  // namespace dot4attn

#endif  // D4A_HAS_PREFILL_MMA
