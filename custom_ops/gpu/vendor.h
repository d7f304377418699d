// The GPU portability layer: one kernel source compiled as CUDA (nvcc) or HIP (hipcc / clang -x hip).
//
// Only the few things that differ between the vendors live here: runtime API names, the warp (wavefront) size,
// warp shuffles, the 4-way int8 dot product, half <-> float conversion, and the asynchronous global->shared
// copy (cp.async on NVIDIA sm_80+, a plain synchronous copy elsewhere). Kernels include this header and use
// the gpu* / d4a_* names only; no kernel exists twice.
#pragma once

#include <cstdint>

#if defined(__HIP_PLATFORM_AMD__) || defined(__HIPCC__) || defined(DOT4ATTN_WITH_HIP)
#define D4A_HIP 1
#include <hip/hip_runtime.h>
#else
#define D4A_CUDA 1
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#endif

// ---- runtime API ---------------------------------------------------------------------------------------------
#if defined(D4A_HIP)
using gpuStream_t = hipStream_t;
using gpuDeviceAttr_t = hipDeviceAttribute_t;
using gpuError_t = hipError_t;
#define gpuSuccess hipSuccess
#define gpuGetLastError hipGetLastError
#define gpuGetErrorString hipGetErrorString
#define gpuGetDevice hipGetDevice
#define gpuDeviceGetAttribute hipDeviceGetAttribute
#define gpuDevAttrMultiProcessorCount hipDeviceAttributeMultiprocessorCount
#define gpuDevAttrWarpSize hipDeviceAttributeWarpSize
#define gpuDevAttrMaxSharedMemoryPerBlockOptin hipDeviceAttributeSharedMemPerBlockOptin
#define gpuMemsetAsync hipMemsetAsync
#define gpuMemset2DAsync hipMemset2DAsync
#define gpuMemcpy2DAsync hipMemcpy2DAsync
#define gpuMemcpyDeviceToDevice hipMemcpyDeviceToDevice
#define gpuMemcpyAsync hipMemcpyAsync
#define gpuMemcpyDeviceToHost hipMemcpyDeviceToHost
#define gpuStreamSynchronize hipStreamSynchronize
#define gpuFuncSetAttribute(f, attr, v) hipFuncSetAttribute(reinterpret_cast<const void*>(f), attr, v)
#define gpuFuncAttributeMaxDynamicSharedMemorySize hipFuncAttributeMaxDynamicSharedMemorySize
#else
using gpuStream_t = cudaStream_t;
using gpuDeviceAttr_t = cudaDeviceAttr;
using gpuError_t = cudaError_t;
#define gpuSuccess cudaSuccess
#define gpuGetLastError cudaGetLastError
#define gpuGetErrorString cudaGetErrorString
#define gpuGetDevice cudaGetDevice
#define gpuDeviceGetAttribute cudaDeviceGetAttribute
#define gpuDevAttrMultiProcessorCount cudaDevAttrMultiProcessorCount
#define gpuDevAttrWarpSize cudaDevAttrWarpSize
#define gpuDevAttrMaxSharedMemoryPerBlockOptin cudaDevAttrMaxSharedMemoryPerBlockOptin
#define gpuMemsetAsync cudaMemsetAsync
#define gpuMemset2DAsync cudaMemset2DAsync
#define gpuMemcpy2DAsync cudaMemcpy2DAsync
#define gpuMemcpyDeviceToDevice cudaMemcpyDeviceToDevice
#define gpuMemcpyAsync cudaMemcpyAsync
#define gpuMemcpyDeviceToHost cudaMemcpyDeviceToHost
#define gpuStreamSynchronize cudaStreamSynchronize
#define gpuFuncSetAttribute(f, attr, v) cudaFuncSetAttribute(f, attr, v)
#define gpuFuncAttributeMaxDynamicSharedMemorySize cudaFuncAttributeMaxDynamicSharedMemorySize
#endif

// ---- warp size -----------------------------------------------------------------------------------------------
// CDNA (gfx9) runs wave64; RDNA (gfx10+) is compiled for wave32 by HIP's default; NVIDIA is always 32.
// Kernels only use D4A_WARP in device code (the host never needs it: block sizes are fixed at 256 threads).
#if defined(D4A_HIP) && (defined(__GFX9__) || defined(__gfx908__) || defined(__gfx90a__) || \
                         defined(__gfx940__) || defined(__gfx941__) || defined(__gfx942__) || defined(__gfx950__))
#define D4A_WARP 64
#else
#define D4A_WARP 32
#endif

namespace dot4attn {
namespace gpu {

// ---- shuffles ------------------------------------------------------------------------------------------------
__device__ __forceinline__ float shfl_xor(float v, int lane_mask) {
#if defined(D4A_HIP)
  return __shfl_xor(v, lane_mask, D4A_WARP);
#else
  return __shfl_xor_sync(0xffffffffu, v, lane_mask, 32);
#endif
}

__device__ __forceinline__ int shfl_xor(int v, int lane_mask) {
#if defined(D4A_HIP)
  return __shfl_xor(v, lane_mask, D4A_WARP);
#else
  return __shfl_xor_sync(0xffffffffu, v, lane_mask, 32);
#endif
}

// Value of `v` in lane `src` of the warp (indexed shuffle).
__device__ __forceinline__ float shfl(float v, int src) {
#if defined(D4A_HIP)
  return __shfl(v, src, D4A_WARP);
#else
  return __shfl_sync(0xffffffffu, v, src, 32);
#endif
}

// Barrier + shared-memory ordering among the lanes of one warp (wavefront): a warp's lanes exchange data through
// shared memory without a block barrier.
__device__ __forceinline__ void warp_sync() {
#if defined(D4A_HIP)
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront");
  __builtin_amdgcn_wave_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront");
#else
  __syncwarp();
#endif
}

// Max over each aligned group of 32 lanes (the same on wave32 and wave64).
__device__ __forceinline__ float group32_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, shfl_xor(v, o));
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = D4A_WARP / 2; o > 0; o >>= 1) v = fmaxf(v, shfl_xor(v, o));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = D4A_WARP / 2; o > 0; o >>= 1) v += shfl_xor(v, o);
  return v;
}

// A 64-bit value the compiler cannot see through: addresses derived from it are computed where they are used instead
// of being hoisted out of a loop into registers held for the whole loop (a loop-invariant stride times each unrolled
// piece index would otherwise cost a register pair per piece). Uniform values only (an SGPR on AMD).
__device__ __forceinline__ int64_t opaque(int64_t x) {
#if defined(D4A_HIP)
  asm volatile("" : "+s"(x));
#else
  asm volatile("" : "+l"(x));
#endif
  return x;
}

// ---- 4-way int8 dot product: c + sum_k a.i8[k] * b.i8[k] ------------------------------------------------------
__device__ __forceinline__ int dot4(int a, int b, int c) {
#if defined(D4A_CUDA)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 610
  return __dp4a(a, b, c);
#else
  for (int k = 0; k < 4; ++k) c += int(int8_t(a >> (8 * k))) * int(int8_t(b >> (8 * k)));
  return c;
#endif
#elif defined(__gfx1100__) || defined(__gfx1101__) || defined(__gfx1102__) || defined(__gfx1103__) || \
    defined(__gfx1150__) || defined(__gfx1151__) || defined(__gfx1200__) || defined(__gfx1201__)
  return __builtin_amdgcn_sudot4(true, a, true, b, c, false);  // RDNA3 / RDNA4: v_dot4_i32_iu8
#elif defined(__gfx906__) || defined(__gfx908__) || defined(__gfx90a__) || defined(__gfx940__) || \
    defined(__gfx941__) || defined(__gfx942__) || defined(__gfx950__) || defined(__gfx1030__)
  return __builtin_amdgcn_sdot4(a, b, c, false);  // CDNA / RDNA2: v_dot4_i32_i8
#else
  for (int k = 0; k < 4; ++k) c += int(int8_t(a >> (8 * k))) * int(int8_t(b >> (8 * k)));
  return c;
#endif
}

// ---- half <-> float (IEEE, round to nearest even: bit-exact with common/fp16.h) -------------------------------
__device__ __forceinline__ float h2f(uint16_t h) {
#if defined(D4A_HIP)
  _Float16 x;
  __builtin_memcpy(&x, &h, 2);
  return float(x);
#else
  return __half2float(__ushort_as_half(h));
#endif
}

__device__ __forceinline__ uint16_t f2h(float f) {
#if defined(D4A_HIP)
  _Float16 x = _Float16(f);
  uint16_t h;
  __builtin_memcpy(&h, &x, 2);
  return h;
#else
  return __half_as_ushort(__float2half_rn(f));
#endif
}

// Two packed halves (low = element 0) -> two floats.
__device__ __forceinline__ void h2x2f(uint32_t w, float& lo, float& hi) {
  lo = h2f(uint16_t(w & 0xffffu));
  hi = h2f(uint16_t(w >> 16));
}

// True IEEE float32 division (the contract: not a multiply by a reciprocal), whatever the fast-math flags.
__device__ __forceinline__ float div_rn(float a, float b) {
#if defined(D4A_HIP)
  return a / b;  // HIP: correctly rounded by default (-fhip-fp32-correctly-rounded-divide-sqrt)
#else
  return __fdiv_rn(a, b);
#endif
}

// Levels rint(x / dv) of a block's values (dv > 0 finite, |x / dv| <= 127 (1 + 2^-24): dv = div_rn(amax, 127), |x| <=
// amax), bit for bit those of rintf(div_rn(x, dv)), at a multiply each: with inv = dv's correctly rounded reciprocal,
// x inv is within 2^-16 of x / dv and div_rn's quotient within 2^-17, so both round to the same integer unless x inv
// lies within 2^-13 of a half-integer; then (under 1 value in 1000) all N take the true division. Why: the prefill
// kernels quantize Q inside their work items (the warp-specialized one between two items, on its consumers' path),
// where a division with its slow-path branch per value made a 16-byte piece ~245 instructions in a chain of branches;
// with this rule and the block max on the halves' bits (prefill_wg.cuh) about half as many, and the prefill
// 1.02x / 1.04x faster at 8k / 2k keys (docs/performance.md). The decode kernels (one row per head) and the tile
// kernel (the fallback) keep the division.
// tests/ops/test_q_level_rule.py checks the rule against the division on every float16 value;
// test_prefill_q_levels_are_the_contracts (tests/gpu/test_kernels.py) the kernels' levels.
template <int N>
__device__ __forceinline__ void q_levels(const float (&x)[N], float dv, float (&q)[N]) {
#if defined(D4A_HIP)
  const float inv = 1.f / dv;  // correctly rounded under HIP's defaults (div_rn)
#else
  const float inv = __frcp_rn(dv);
#endif
  bool near = false;
#pragma unroll
  for (int u = 0; u < N; ++u) {
#if defined(D4A_HIP)
    const float r = x[u] * inv;
#else
    const float r = __fmul_rn(x[u], inv);
#endif
    q[u] = rintf(r);
    near |= fabsf(fabsf(r - q[u]) - 0.5f) < 0x1p-13f;
  }
  if (near) {
#pragma unroll
    for (int u = 0; u < N; ++u) q[u] = rintf(div_rn(x[u], dv));
  }
}

// A Q block's stored levels: 0 for a non-finite block (q_block_scale's dv = 0), else q_levels clamped to +-127 (the
// bound can be passed by 2^-24 relative, see above). One place for the prefill kernels' two Q quantizers.
template <int N>
__device__ __forceinline__ void q_block_levels(const float (&x)[N], float dv, float (&q)[N]) {
  if (dv == 0.f) {
#pragma unroll
    for (int u = 0; u < N; ++u) q[u] = 0.f;
    return;
  }
  q_levels<N>(x, dv, q);
#pragma unroll
  for (int u = 0; u < N; ++u) q[u] = fminf(fmaxf(q[u], -127.f), 127.f);
}

// ---- non-finite policy (docs/ops.md, "Non-finite and out-of-range values"), the CPU's common/quantize.h -------
// |x| for a block max that is +inf exactly when the block holds a NaN or +-Inf (fmaxf alone drops a NaN).
__device__ __forceinline__ float abs_or_inf(float x) {
  const float a = fabsf(x);
  return a == a ? a : INFINITY;
}

// The float16 scale bits of a block with max |x| = amax (abs_or_inf): NaN (0x7e00) for a non-finite block, 65504
// when the scale would round to inf; `div` is what the payload divides by (0: q = 0).
__device__ __forceinline__ uint16_t block_scale_half(float amax, float qmax, float& div) {
  if (amax == INFINITY) {
    div = 0.f;
    return uint16_t(0x7e00u);
  }
  uint16_t sh = f2h(div_rn(amax, qmax));
  if (sh == 0x7c00u) sh = uint16_t(0x7bffu);
  div = h2f(sh);
  return sh;
}

// A Q block's float32 scale: NaN for a non-finite block (every logit of its row is then NaN), `div` 0 (q = 0).
__device__ __forceinline__ float q_block_scale(float amax, float& div) {
  div = amax == INFINITY ? 0.f : div_rn(amax, 127.f);
  return amax == INFINITY ? __int_as_float(0x7fc00000) : div;
}

// The V side. A key is V-poisoned when its V row holds a non-finite value: a NaN V scale (q8_0 / q4_0; an infinite
// scale is outside the format and counts too), a NaN / +-Inf element of float V. Every kernel does two things for
// such a key: its logit becomes NaN in the rows that see it (after masking: fold_v_poison), so those rows turn NaN
// exactly as a poisoned K makes them; and its V enters P.V as zeros, so rows that do not see it stay untouched
// (p = 0 times NaN would poison them). Both only on tiles that hold such a key (a uniform branch), so the common
// path pays for the detection alone.
__device__ __forceinline__ bool half_nonfinite(uint16_t h) { return (h & 0x7c00u) == 0x7c00u; }
// Nonzero when either float16 half of w is non-finite (exponent all ones: + 0x0400 carries into bit 15).
__device__ __forceinline__ uint32_t halves_nonfinite(uint32_t w) {
  return ((w & 0x7c007c00u) + 0x04000400u) & 0x80008000u;
}
__device__ __forceinline__ bool float_nonfinite(float x) { return !(fabsf(x) <= 3.402823466e38f); }
// The logit x (after masking: -inf is a hidden key) of a key whose V is poisoned (`bad`): NaN where the key is seen.
__device__ __forceinline__ float fold_v_poison(float x, bool bad) {
  return bad && x != -INFINITY ? __int_as_float(0x7fc00000) : x;
}

// A row's value o / l: 0 where no key was visible (l = 0), NaN where a poisoned key was (l NaN).
__device__ __forceinline__ float normalise(float o, float l) { return l == 0.f ? 0.f : o / l; }

// float16 outputs: finite values saturate at +-65504 (never inf from a finite row), NaN stays NaN.
__device__ __forceinline__ float sat_half(float y) { return y == y ? fminf(fmaxf(y, -65504.f), 65504.f) : y; }
__device__ __forceinline__ uint16_t f2h_out(float y) { return f2h(sat_half(y)); }

// ---- programmatic dependent launch (sm_90+) ---------------------------------------------------------------------
// A kernel launched as a programmatic dependent (launch_dependent, below) may start while the kernel before it in the
// stream still runs: pdl_wait waits until that kernel has completed and its writes are visible (at once for a kernel
// launched without the attribute; empty off sm_90); pdl_launch_dependents lets the next such kernel start launching
// its blocks (its own pdl_wait still waits for this kernel's end).
__device__ __forceinline__ void pdl_wait() {
#if defined(D4A_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(D4A_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// ---- asynchronous 16-byte global -> shared copy ----------------------------------------------------------------
// cp.async on NVIDIA sm_80+ (zero-fills when `valid` is false); elsewhere a plain copy, so that the same
// multi-stage pipeline code is correct everywhere (only without the overlap).
#if defined(D4A_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define D4A_HAS_CP_ASYNC 1
#endif

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
#if defined(D4A_HAS_CP_ASYNC)
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes));
#else
  *reinterpret_cast<uint4*>(smem) = valid ? *reinterpret_cast<const uint4*>(gmem) : make_uint4(0, 0, 0, 0);
#endif
}

// 4-byte global -> shared copy of `bytes` (0, 2 or 4) bytes, the rest zero-filled; both addresses 4-byte aligned.
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem, int bytes) {
#if defined(D4A_HAS_CP_ASYNC)
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(gmem), "r"(bytes));
#else
  const uint16_t* g = static_cast<const uint16_t*>(gmem);
  uint16_t* d = static_cast<uint16_t*>(smem);
  d[0] = bytes >= 2 ? g[0] : uint16_t(0);
  d[1] = bytes >= 4 ? g[1] : uint16_t(0);
#endif
}

// N-byte (4, 8 or 16) global -> shared copy, zero-filled when `valid` is false; both addresses N-byte aligned.
template <int N>
__device__ __forceinline__ void cp_async_n(void* smem, const void* gmem, bool valid) {
  static_assert(N == 4 || N == 8 || N == 16, "cp.async copies 4, 8 or 16 bytes");
#if defined(D4A_HAS_CP_ASYNC)
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int src_bytes = valid ? N : 0;
  if constexpr (N == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes));
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(s), "l"(gmem), "n"(N), "r"(src_bytes));
#else
  uint32_t* d = static_cast<uint32_t*>(smem);
  const uint32_t* g = static_cast<const uint32_t*>(gmem);
  for (int i = 0; i < N / 4; ++i) d[i] = valid ? g[i] : 0u;
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if defined(D4A_HAS_CP_ASYNC)
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(D4A_HAS_CP_ASYNC)
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

// Waits for the oldest of the groups an nst-stage pipeline keeps in flight (nst - 1 may stay pending);
// MAXST: the kernel's compile-time stage bound (nst <= MAXST).
template <int MAXST>
__device__ __forceinline__ void cp_async_wait_stages(int nst) {
  if (MAXST >= 3 && nst >= 3) cp_async_wait<MAXST >= 3 ? 2 : 0>();
  else if (nst == 2) cp_async_wait<1>();
  else cp_async_wait<0>();
}

}  // namespace gpu
}  // namespace dot4attn

// Host-side launch check: a runtime error becomes an ORT_FAIL status naming the call (never exits the process).
#include <stdexcept>
#include <string>
#define D4A_GPU_CHECK(expr)                                                                             \
  do {                                                                                                  \
    const gpuError_t e_ = (expr);                                                                       \
    if (e_ != gpuSuccess)                                                                               \
      throw std::runtime_error(std::string("dot4attn GPU: ") + #expr + ": " + gpuGetErrorString(e_));   \
  } while (0)

#if defined(D4A_CUDA)
namespace dot4attn {
namespace gpu {
// Launches kern as a programmatic dependent of the previous kernel in stream s (sm_90): it may start before that
// kernel ends, so it must call pdl_wait before it reads that kernel's results.
template <class Kernel, class... Args>
void launch_dependent(Kernel kern, unsigned grid, unsigned block, size_t smem, cudaStream_t s, const Args&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(block);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = at;
  cfg.numAttrs = 1;
  D4A_GPU_CHECK(cudaLaunchKernelEx(&cfg, kern, args...));
}
}  // namespace gpu
}  // namespace dot4attn
#endif
