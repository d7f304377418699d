// NVIDIA tensor-core and shared-memory primitives (sm_80+) shared by the tensor-core prefill (prefill_mma.cuh)
// and decode (decode_mma.cuh) kernels: ldmatrix, the int8 and f16 mma.sync shapes they use, ex2 and half2 helpers.
// CUDA only; HIP builds never include the kernels that use them.
#pragma once

#include <cstdint>

#include "gpu/vendor.h"

#if defined(D4A_CUDA)

namespace dot4attn {
namespace gpu {

// The int32 Q.K accumulator starts at these bits (the float 1.5 * 2^23): |dot| <= 32*127*127 < 2^22, so the bits
// read as a float are exactly 1.5*2^23 + dot, and fma(c, sk, -1.5*2^23*sk) == dot*sk rounded once (sk is fp16, so
// 1.5*2^23*sk is exact): int->float conversion (quarter rate) and two multiplies become two full-rate FFMAs.
constexpr int kMagicI = 0x4B400000;
constexpr float kMagicF = 12582912.0f;

__device__ __forceinline__ unsigned smem_u32(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldsm_x4(unsigned addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}

__device__ __forceinline__ void ldsm_x4_t(unsigned addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}

// c (int32, starts at the magic bias) += A(16x32 s8, row) * B(32x8 s8, col)
__device__ __forceinline__ void mma_s8(int (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// d (f32) += A(16x16 f16, row) * B(16x8 f16, col)
__device__ __forceinline__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float ex2(float x) {  // 2^x, -inf -> +0
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ uint32_t pack_h2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

__device__ __forceinline__ uint32_t hmul2_u(uint32_t a, __half2 s) {
  __half2 x = *reinterpret_cast<const __half2*>(&a);
  x = __hmul2(x, s);
  return *reinterpret_cast<const uint32_t*>(&x);
}

// (x & M) | O (LUT 0xEA) or (x & M) ^ O (LUT 0x6A) as one LOP3. Written in C, ptxas keeps the two operations as two
// LOP3s (a LOP3 takes one immediate); one PTX lop3 with both immediates makes it hold one of them in a register.
template <uint32_t M, uint32_t O, int LUT>
__device__ __forceinline__ uint32_t lop3_imm(uint32_t x) {
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, %4;\n" : "=r"(r) : "r"(x), "n"(M), "n"(O), "n"(LUT));
  return r;
}

__device__ __forceinline__ uint32_t hsub2_u(uint32_t a, uint32_t b) {
  __half2 x = *reinterpret_cast<const __half2*>(&a);
  const __half2 y = *reinterpret_cast<const __half2*>(&b);
  x = __hsub2(x, y);
  return *reinterpret_cast<const uint32_t*>(&x);
}

}  // namespace gpu
}  // namespace dot4attn

#endif  // D4A_CUDA
