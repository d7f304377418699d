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
// One pass (kv_copy_kernel) reads every K row once: it writes the copy, checks the K scales (below), and in the same
// pass converts a q8_0 / q4_0 / q6_0 V into its float16 copy (v_dequant.cuh's conversion) and scans V (or that copy)
// for NaN / Inf (v_scan.cuh's check) where the plan asks. Why one pass: these were three launches (V copy, scan, K
// copy, the K copy waiting for the scan's flags), each with a ramp and a tail of its own, and the V copy written,
// then read back by the scan. With a quantized V the passes now take a fifth to a quarter less (8k keys, (32, 8,
// 128): 24.0 us against 29.1, H100); with float16 V the pass moves the same bytes as the scan and copy did and takes
// the same time (docs/performance.md, "One pass before the prefill"), so the warp-specialized prefill's float16 V is
// scanned behind that kernel instead (v_scan.cuh, scan_v_after) and its pass copies K alone.
//
// Values: k * sk, one float16 rounding. Where a (batch, KV head) holds a K scale past 515.5 (only K packed from
// float32 values beyond float16's range: 127 * 515.5 is the largest product below float16's 65520), every value of
// that head is stored times 2^-8 (the same float16 values shifted, but for the few that fall into float16's subnormal
// range) and the prefill multiplies that head's logits by 2^8 (flags[bh] != 0): nothing is clamped. A NaN scale
// makes its 32 values NaN, so the key's logit is NaN in every row that sees it, as the int8 Q.K makes it
// (docs/ops.md, "Non-finite and out-of-range values"). Whether a head holds such a scale is only known once all of
// its keys are read, so the pass writes every head unshifted and the last block to finish a head's runs (a counter
// per head) rewrites that head's copy shifted where one of them found such a scale: a second read of that head's K,
// by one block, only for K that float16 cannot hold.
#pragma once

#include <cstdint>

#include "gpu/attention_tile.cuh"
#include "gpu/kv_rows.cuh"
#include "gpu/v_dequant.cuh"
#include "gpu/v_scan.cuh"

#if defined(D4A_HAS_PREFILL_MMA)  // CUDA: V's conversion is the tensor-core prefill's
namespace dot4attn {
namespace gpu {

// The largest K scale whose values (|k| <= 127) stay finite in float16: 515.5 (float16 bits 0x6007).
constexpr uint32_t kKScaleLimitBits = 0x6007u;

// Whether a finite K scale (float16 bits) is past the limit.
__device__ __forceinline__ bool k_scale_big(uint32_t sb) {
  const uint32_t m = sb & 0x7fffu;  // |scale| bits: ordered like the values
  return m > kKScaleLimitBits && m < 0x7c00u;
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

// Piece c of K row r: its 8 int8 values (x, y) and the scale of their block (8 c) / 32 (z).
__device__ __forceinline__ uint4 k_piece_bytes(const TileArgs& a, int64_t r, int c) {
  const uint2 w = *reinterpret_cast<const uint2*>(a.k + r * a.k_stride + 8 * c);
  return make_uint4(w.x, w.y, a.ks[r * a.ks_stride + c / 4], 0u);
}

// The bytes of a V piece as the pass loads them: a float16 V's 16 bytes (w), or a quantized V's bytes and scale.
struct VRaw {
  uint4 w;
  uint16_t sb;
};

// Blocks per SM the pass is compiled for. Why: each thread loads all its pieces of a run before it stores any, so the
// bytes in flight per SM, and with them the pass's speed, grow with the blocks that fit; at the default register
// budget K's copy alone (float16 V scanned elsewhere) held 123 registers at D = 128, 2 blocks per SM. These are the
// most blocks that compile without spills (ptxas: K alone 56 / 64 registers at D 64 / 128, with V 60-80, D = 256 128).
template <int D, int VK, bool READ_V>
constexpr int kKvCopyMinBlocks = D == 256 ? 2 : (VK == kVF16 && !READ_V) ? 4 : 3;

// K (into k_out, float16 rows in K's layout, 2 D bytes apart) and V: with VK = kVF16 V is read only with READ_V, and
// scanned into vflags; with a quantized VK (READ_V) it is converted into v_out (float16 rows in the same layout) and
// the converted rows scanned where vflags is set. flags: kflags (B Hkv ints: the head's copy is K times 2^-8), then B
// Hkv run counters, all zeroed before; vflags (B Hkv ints, zeroed) or null.
template <int D, int VK, bool READ_V>
__global__ void __launch_bounds__(kScanThreads, kKvCopyMinBlocks<D, VK, READ_V>)
    kv_copy_kernel(const TileArgs a, int* kflags, int* vflags, uint8_t* k_out, uint8_t* v_out) {
  static_assert(READ_V || VK == kVF16, "a quantized V is always read: its float16 copy is the prefill's V");
  pdl_launch_dependents();  // the prefill's blocks may launch now (they wait for this kernel's end)
  constexpr int PR = D / 8, N = kRunPieces<PR>;
  const int64_t runs = (a.Sk + kRowKeys - 1) / kRowKeys;  // per (batch, KV head)
  unsigned* runs_done = reinterpret_cast<unsigned*>(kflags + a.B * a.Hkv);
  __shared__ bool last;
  for_each_key_run(a, [&](int64_t bh, int64_t r0, int nk) {
    // every load of the run before any store (the compiler cannot tell the buffers apart: a store between two loads
    // would hold the second back, kv_rows.cuh)
    uint4 kr[N];
    VRaw vr[READ_V ? N : 1];
    for_each_run_piece<PR>(nk, [&](int i, int j, int c) {
      kr[i] = k_piece_bytes(a, r0 + j, c);
      if constexpr (READ_V) {
        const uint8_t* src = static_cast<const uint8_t*>(a.v) + (r0 + j) * a.v_stride;
        if constexpr (VK == kVF16) vr[i] = VRaw{*reinterpret_cast<const uint4*>(src + 16 * c), 0};
        else vr[i] = VRaw{v_piece_bytes<VK>(src, c), a.vs[(r0 + j) * a.vs_stride + c / 4]};
      }
    });
    bool k_big = false;
    uint32_t nf = 0;
    for_each_run_piece<PR>(nk, [&](int i, int j, int c) {
      const uint32_t sb = kr[i].z;
      k_big |= k_scale_big(sb);
      *reinterpret_cast<uint4*>(k_out + (r0 + j) * (2 * D) + 16 * c) =
          k_piece_f16(make_uint2(kr[i].x, kr[i].y), uint16_t(sb), 1.f);
      if constexpr (VK == kVF16) {
        if constexpr (READ_V) nf = v_nonfinite_acc<kVF16>(nf, vr[i].w);
      } else {
        const uint4 o = v_piece_f16<VK>(vr[i].w, c, vr[i].sb);
        *reinterpret_cast<uint4*>(v_out + (r0 + j) * (2 * D) + 16 * c) = o;
        nf = v_nonfinite_acc<kVF16>(nf, o);
      }
    });
    if (k_big) kflags[bh] = 1;
    if (vflags != nullptr && v_nonfinite(nf)) vflags[bh] = 1;
    // The last block to finish a run of head bh sees every flag store and copy store of the head's other runs (each
    // block's stores, then its counter increment behind a fence) and, where a run found a scale past the limit,
    // writes the head's copy again times 2^-8 (over the unshifted rows: ordered after them by the same fences).
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      last = atomicAdd(&runs_done[bh], 1u) == unsigned(runs - 1);
      if (last) __threadfence();
    }
    __syncthreads();
    if (last && *static_cast<volatile int*>(kflags + bh) != 0) {
      for (int64_t j0 = 0; j0 < a.Sk; j0 += kRowKeys) {
        const int64_t q0 = bh * a.kv_rows + j0;
        const int n = int(a.Sk - j0 < kRowKeys ? a.Sk - j0 : kRowKeys);
        run_to_f16<D>(
            k_out, q0, n, [&](int64_t r, int c) { return k_piece_bytes(a, r, c); },
            [](const uint4& raw, int) { return k_piece_f16(make_uint2(raw.x, raw.y), uint16_t(raw.z), 0.00390625f); });
      }
    }
  });
}

// Enqueues the pass over a's K and V (a: the call's own arguments): K into k_out and kflags (B Hkv ints, the run
// counters after them in the same scratch); with v_out, a's quantized V (kind v_source) into v_out; with vflags (B Hkv
// ints after the counters in the same scratch) zeroed: with scan_v V or its copy scanned into them (scan_v_nonfinite's
// flags), else B Hkv ints after them zeroed too (the flags of a ws kernel that skips no head: ws_late_scan).
inline void copy_kv(const TileArgs& a, uint8_t* k_out, int* kflags, int* vflags, bool scan_v, uint8_t* v_out,
                    int v_source, gpuStream_t s) {
  const size_t heads = size_t(a.B * a.Hkv);
  // one memset over the flags and counters (vflags follows the counters after their padding)
  const size_t vwords = size_t(scan_v ? 1 : 2) * heads;  // the V flags, and without the scan the ws kernel's zeros
  const size_t zero = vflags ? size_t(reinterpret_cast<uint8_t*>(vflags + vwords) - reinterpret_cast<uint8_t*>(kflags))
                             : 2 * heads * sizeof(int);
  D4A_GPU_CHECK(gpuMemsetAsync(kflags, 0, zero, s));
  const unsigned grid = row_pass_blocks(a);
  const int vk = v_out ? v_source : kVF16;
  int* const vscan = scan_v ? vflags : nullptr;
  with_head_dim(a.D, [&](auto d) {
    constexpr int D = decltype(d)::value;
    const auto go = [&](auto kern) { kern<<<grid, kScanThreads, 0, s>>>(a, kflags, vscan, k_out, v_out); };
    if (vk == kVF16) return vscan ? go(kv_copy_kernel<D, kVF16, true>) : go(kv_copy_kernel<D, kVF16, false>);
    if (vk == kVQ8) return go(kv_copy_kernel<D, kVQ8, true>);
    if (vk == kVQ4) return go(kv_copy_kernel<D, kVQ4, true>);
    go(kv_copy_kernel<D, kVQ6, true>);
  });
  D4A_GPU_CHECK(gpuGetLastError());
}

}  // namespace gpu
}  // namespace dot4attn
#endif  // D4A_HAS_PREFILL_MMA
