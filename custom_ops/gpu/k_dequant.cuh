// Packed K dequantized once into float16 rows before the Hopper prefill whose Q.K runs on f16 wgmma
// (GpuPlan::k_dequant, prefill_mma.cuh's QK16 instances).
//
// Why: the int8 Q.K has to scale every 32-block's partial dot product by its own Q and K scales in registers, two
// FFMAs per logit and block (256 per warp and 64-key tile at D = 128), more than half of the instructions cuDNN
// spends on a whole tile; that stream, not the tensor cores, bounds the int8 prefill (docs/performance.md). With K as
// float16 rows the Q.K is one f16 wgmma chain per tile, and the per-block scaling is gone. The copy costs one pass over
// K (the packed rows read, 2 D bytes per key written), small next to a long prefill that reads each K tile once per
// block of query rows.
//
// Values: k * sk, one float16 rounding. Where a (batch, KV head) holds a K scale past 515.5 (only K packed from
// float32 values beyond float16's range: 127 * 515.5 is the largest product below float16's 65520), every value of
// that head is stored times 2^-8 (the same float16 values shifted, but for the few that fall into float16's subnormal
// range) and the prefill multiplies that head's logits by 2^8 (flags[bh] != 0): nothing is clamped. A NaN scale makes its 32
// values NaN, so the key's logit is NaN in every row that sees it, as the int8 Q.K makes it (docs/ops.md,
// "Non-finite and out-of-range values").
#pragma once

#include <cstdint>

#include "gpu/attention_tile.cuh"
#include "gpu/v_scan.cuh"

#if defined(D4A_CUDA)
namespace dot4attn {
namespace gpu {

// The largest K scale whose values (|k| <= 127) stay finite in float16: 515.5 (float16 bits 0x6007).
constexpr uint32_t kKScaleLimitBits = 0x6007u;

// Block x covers keys [kVScanKeys * (x % nblk), ...) of (b, kv head) x / nblk: flags[bh] = 1 where a finite K scale is
// past the limit. flags: B * Hkv ints, zeroed before.
__global__ void __launch_bounds__(kScanThreads) k_scale_scan_kernel(const TileArgs a, int64_t nblk, int* flags) {
  const int64_t bid = int64_t(blockIdx.x);
  const int64_t bh = bid / nblk;
  const int64_t j0 = (bid % nblk) * kVScanKeys;
  const int64_t nk = a.Sk - j0 < kVScanKeys ? a.Sk - j0 : kVScanKeys;
  const uint16_t* rows = a.ks + (bh * a.kv_rows + j0) * a.ks_stride;
  bool big = false;
  for (int u = threadIdx.x; u < int(nk) * a.nb; u += kScanThreads) {
    const int j = u / a.nb, blk = u - j * a.nb;
    const uint32_t m = rows[j * a.ks_stride + blk] & 0x7fffu;  // |scale| bits: ordered like the values
    big |= m > kKScaleLimitBits && m < 0x7c00u;
  }
  if (__syncthreads_or(big) && threadIdx.x == 0) flags[bh] = 1;
}

// One thread per 8 values (16 output bytes) of a key's row. Rows keep the K layout (key j of (b, kv head) bh is row
// bh * kv_rows + j); only keys < Sk are read and written. out rows are 2 * D bytes apart.
__global__ void __launch_bounds__(kScanThreads) k_dequant_kernel(const TileArgs a, const int* flags, uint8_t* out) {
  const int per_row = a.D / 8;
  const int64_t n = a.B * a.Hkv * a.Sk * per_row;
  for (int64_t i = int64_t(blockIdx.x) * kScanThreads + threadIdx.x; i < n; i += int64_t(gridDim.x) * kScanThreads) {
    const int c = int(i % per_row);
    const int64_t key = i / per_row, j = key % a.Sk, bh = key / a.Sk;
    const int64_t r = bh * a.kv_rows + j;
    const uint16_t sb = a.ks[r * a.ks_stride + c / 4];  // 8 values of block (8 c) / 32
    uint4 o;
    if (half_nonfinite(sb)) {
      o = make_uint4(0x7e007e00u, 0x7e007e00u, 0x7e007e00u, 0x7e007e00u);
    } else {
      // k * sk (* 2^-8) is exact in float32 (7 + 11 significant bits); one rounding to float16
      const float s = h2f(sb) * (flags[bh] != 0 ? 0.00390625f : 1.f);
      const uint2 w = *reinterpret_cast<const uint2*>(a.k + r * a.k_stride + 8 * c);
      uint32_t h[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const uint32_t x = u < 2 ? w.x : w.y;
        const int sh = 16 * (u & 1);
        const float lo = float(int8_t(x >> sh)) * s, hi = float(int8_t(x >> (sh + 8))) * s;
        const __half2 p = __floats2half2_rn(lo, hi);
        h[u] = *reinterpret_cast<const uint32_t*>(&p);
      }
      o = make_uint4(h[0], h[1], h[2], h[3]);
    }
    *reinterpret_cast<uint4*>(out + r * (2 * a.D) + 16 * c) = o;
  }
}

// Enqueues the scan and the conversion of a's K into out (float16 rows in K's layout) and flags (B * Hkv ints).
inline void dequant_k(const TileArgs& a, uint8_t* out, int* flags, gpuStream_t s) {
  D4A_GPU_CHECK(gpuMemsetAsync(flags, 0, size_t(a.B * a.Hkv) * sizeof(int), s));
  const int64_t nblk = (a.Sk + kVScanKeys - 1) / kVScanKeys;
  k_scale_scan_kernel<<<unsigned(a.B * a.Hkv * nblk), kScanThreads, 0, s>>>(a, nblk, flags);
  D4A_GPU_CHECK(gpuGetLastError());
  const int64_t n = a.B * a.Hkv * a.Sk * (a.D / 8);
  const unsigned grid = unsigned(n / kScanThreads + 1 < (1 << 20) ? n / kScanThreads + 1 : (1 << 20));
  k_dequant_kernel<<<grid, kScanThreads, 0, s>>>(a, flags, out);
  D4A_GPU_CHECK(gpuGetLastError());
}

}  // namespace gpu
}  // namespace dot4attn
#endif  // D4A_CUDA
