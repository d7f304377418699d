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

// Whether one of this thread's K scales of the run at r0 (nk keys) is finite and past the limit.
template <int D>
__device__ __forceinline__ bool k_run_scales_big(const TileArgs& a, int64_t r0, int nk) {
  bool big = false;
  for_each_run_piece<D / 32>(nk, [&](int, int j, int blk) {
    const uint32_t m = a.ks[(r0 + j) * a.ks_stride + blk] & 0x7fffu;  // |scale| bits: ordered like the values
    big |= m > kKScaleLimitBits && m < 0x7c00u;
  });
  return big;
}

// kflags[bh] = 1 where a finite K scale of (b, kv head) bh is past the limit; with vflags, the V scan (v_scan.cuh) in
// the same pass: one launch where there were two. Flags: B * Hkv ints each, zeroed before.
template <int D>
__global__ void __launch_bounds__(kScanThreads) kv_scan_kernel(const TileArgs a, int* kflags, int* vflags) {
  pdl_launch_dependents();  // the K copy's blocks may launch now (they wait for this kernel's end)
  for_each_key_run(a, [&](int64_t bh, int64_t r0, int nk) {
    // both checks before either store: a flag store between the K scales' loads and V's would hold V's loads back
    // (the compiler cannot tell the buffers apart), two round trips to memory per run instead of one
    const bool k_big = k_run_scales_big<D>(a, r0, nk);
    const bool v_bad = vflags != nullptr && v_run_nonfinite<D>(a, r0, nk);
    if (k_big) kflags[bh] = 1;
    if (v_bad) vflags[bh] = 1;
  });
}

// 8 values of K (one 16-byte piece of the float16 row): k * sk (* 2^-8), exact in float32 (7 + 11 significant bits),
// one rounding to float16; a NaN / Inf scale: NaN.
__device__ __forceinline__ uint4 k_piece_f16(uint2 w, uint16_t sb, float mul) {
  if (half_nonfinite(sb)) return make_uint4(0x7e007e00u, 0x7e007e00u, 0x7e007e00u, 0x7e007e00u);
  const float s = h2f(sb) * mul;
  uint32_t h[4];
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const uint32_t x = u < 2 ? w.x : w.y;
    const int sh = 16 * (u & 1);
    const float lo = float(int8_t(x >> sh)) * s, hi = float(int8_t(x >> (sh + 8))) * s;
    const __half2 p = __floats2half2_rn(lo, hi);
    h[u] = *reinterpret_cast<const uint32_t*>(&p);
  }
  return make_uint4(h[0], h[1], h[2], h[3]);
}

// K rows into float16 rows (K's layout, 2 D bytes apart in out), times 2^-8 in a flagged head.
template <int D>
__global__ void __launch_bounds__(kScanThreads) k_dequant_kernel(const TileArgs a, const int* flags, uint8_t* out) {
  pdl_wait();  // a programmatic dependent of the scan (dequant_k): its flags are complete from here on
  pdl_launch_dependents();
  rows_to_f16<D>(
      a, out, [&](int64_t bh) { return flags[bh] != 0 ? 0.00390625f : 1.f; },
      [&](int64_t r, int c) {  // 8 int8 values and the scale of their block (8 c) / 32
        const uint2 w = *reinterpret_cast<const uint2*>(a.k + r * a.k_stride + 8 * c);
        return make_uint4(w.x, w.y, a.ks[r * a.ks_stride + c / 4], 0u);
      },
      [&](uint4 raw, int, float mul) { return k_piece_f16(make_uint2(raw.x, raw.y), uint16_t(raw.z), mul); });
}

// Enqueues the scan and the conversion of a's K into out (float16 rows in K's layout) and kflags (B * Hkv ints). With
// vflags (B * Hkv ints after kflags in the same scratch), a's float16 V is scanned in the scan's pass
// (scan_v_nonfinite's flags).
inline void dequant_k(const TileArgs& a, uint8_t* out, int* kflags, int* vflags, gpuStream_t s) {
  const size_t heads = size_t(a.B * a.Hkv);
  // one memset over both flag arrays (vflags follows kflags after its padding)
  const size_t zero = vflags ? size_t(reinterpret_cast<uint8_t*>(vflags + heads) - reinterpret_cast<uint8_t*>(kflags))
                             : heads * sizeof(int);
  D4A_GPU_CHECK(gpuMemsetAsync(kflags, 0, zero, s));
  const unsigned grid = row_pass_blocks(a);
  with_head_dim(a.D, [&](auto d) {
    constexpr int D = decltype(d)::value;
    kv_scan_kernel<D><<<grid, kScanThreads, 0, s>>>(a, kflags, vflags);
    D4A_GPU_CHECK(gpuGetLastError());
    launch_dependent(k_dequant_kernel<D>, grid, unsigned(kScanThreads), 0, s, a, static_cast<const int*>(kflags), out);
  });
}

}  // namespace gpu
}  // namespace dot4attn
#endif  // D4A_CUDA
