// NVIDIA tensor-core and shared-memory primitives (sm_80+) shared by the tensor-core prefill (prefill_mma.cuh)
// and decode (decode_mma.cuh) kernels: ldmatrix, the int8 and f16 mma.sync shapes they use, ex2 and half2 helpers,
// and the row maximum of an m16n8 C fragment (tree_max, also the warp-specialized prefill's).
// CUDA only; HIP builds never include the kernels that use them.
#pragma once

#include <cstdint>

#include "gpu/vendor.h"

#if defined(D4A_CUDA)

namespace dot4attn {
namespace gpu {

// The int32 Q.K accumulator starts at these bits (the float M = 1.5 * 2^23): |dot| <= 32*127*127 < 2^22, so the
// bits read as a float c are exactly M + dot, and fma(c, q, -M q) == q * dot rounded once when -M q is exact
// (q_scale23): int->float conversion (quarter rate) and two multiplies become two full-rate FFMAs, the second
// times the key's scale. The M term rides with the query scale (a register for the whole key walk) rather than
// with the key scale (then every key's (sk, -M sk) pair would be loaded from shared memory: twice the bytes).
constexpr int kMagicI = 0x4B400000;
constexpr float kMagicF = 12582912.0f;

// A query block scale (times scale * log2 e) with its last significand bit cleared: a 2^-23 relative change, far
// below the f16 rounding of P, that makes M q exact (q then has <= 23 significant bits, 1.5 q <= 24).
__device__ __forceinline__ float q_scale23(float x) { return __uint_as_float(__float_as_uint(x) & ~1u); }

// The K scales one Q.K lane needs for a 16-key step np of 32-block blk, j = 16 np + 2 tig: keys j, j + 1 (its n tile
// 2 np) and j + 8, j + 9 (n tile 2 np + 1), from an fp16 scale run [keys][NB]. Both kernels' K scale tables hold
// one of these per (block, step, lane), so the Q.K loads one float4 per step. Key rows STEP halves apart (the
// decode's bulk staging reads them inside the K rows).
template <int NB, int STEP = NB>
__device__ __forceinline__ float4 k_scale_quad(const uint16_t* kst, int blk, int j) {
  return make_float4(h2f(kst[j * STEP + blk]), h2f(kst[(j + 1) * STEP + blk]), h2f(kst[(j + 8) * STEP + blk]),
                     h2f(kst[(j + 9) * STEP + blk]));
}

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

// ---- wgmma (sm_90a only: the arch-specific feature set; a plain sm_90 or compute_90 build has no wgmma, and the
// kernels then keep mma.sync, see D4A_WGMMA) ----
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define D4A_WGMMA 1

// Shared-memory matrix descriptors as two 32-bit words: the low one holds the start address >> 4 (bits 0-13) and LBO
// >> 4 (bits 16-29), the high one SBO >> 4 and the swizzle mode (bits 30-31). The wg_desc_* builders below put a whole
// descriptor together; a kernel that issues a chain of wgmma over one tile (prefill_wg.cuh, kDescWords) takes the
// tile's low word once and adds each k step's byte offset >> 4 to it: one add per operand instead of the mask, shift
// and or that ptxas computes in vector registers and moves to uniform ones per wgmma (6-9 instructions each; 4-6
// that way). Shared addresses of a block are below 2^18 (228 KB), so neither the word nor a step into the same tile
// carries out of the 14-bit address field.
__device__ __forceinline__ uint32_t wg_desc_lo(unsigned addr, unsigned lbo) { return (addr >> 4) | ((lbo >> 4) << 16); }
__device__ __forceinline__ uint64_t wg_desc(uint32_t lo, uint32_t hi) { return (uint64_t(hi) << 32) | lo; }
constexpr uint32_t kDescHiSw128 = (1024u >> 4) | (1u << 30);  // SBO 1024 (8-row atoms), the 128-byte swizzle
constexpr unsigned kDescLboK = 16;  // a K-major operand's LBO (unused by the layout: 1 in the field by convention)

// Shared-memory matrix descriptor of an MN-major operand in the 128-byte swizzle (the TMA's CU_TENSOR_MAP_SWIZZLE_128B:
// rows of 128 bytes = 64 f16 of the N dimension, 8-row atoms of 1024 bytes, 1024-byte aligned). In that canonical
// layout LBO is the byte distance between 64-column groups of N and SBO the distance between 8-row groups of K.
__device__ __forceinline__ uint64_t wg_desc_mn_sw128(unsigned addr, unsigned lbo, unsigned sbo) {
  return wg_desc(wg_desc_lo(addr & 0x3FFFFu, lbo), (sbo >> 4) | (1u << 30));
}

// Register writes (accumulators, A fragments) before the next wgmma; commit the issued wgmmas as one group; wait
// until at most N groups are in flight. All are warpgroup-wide (every thread of the 4 warps).
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving reads or writes of an accumulator register across a wgmma wait.
__device__ __forceinline__ void wg_reg_fence(float& r) { asm volatile("" : "+f"(r)::"memory"); }

// d (f32, m64nN: this warp's 16 rows in the mma.sync m16n8 C layout per 8 columns) += A (64x16 f16 from registers, the
// mma.sync m16n8k16 A layout per warp) * B (16xN f16, MN-major, transposed in the instruction's terms: imm-trans-b 1).
__device__ __forceinline__ void wgmma_f16_n64(float (&d)[8][4], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "n"(1));
}

__device__ __forceinline__ void wgmma_f16_n128(float (&d)[16][4], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
        "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
        "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
        "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
        "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
        "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
        "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "n"(1));
}

// Shared-memory matrix descriptor of a K-major operand in the 128-byte swizzle: rows of 128 bytes (64 f16 of the K
// dimension) as the TMA's CU_TENSOR_MAP_SWIZZLE_128B lands them, 8-row atoms of 1024 bytes (SBO) on a 1024-byte aligned
// base; LBO is unused by this layout (1 by convention). A 16-column step along K inside a 128-byte row is the start
// address plus 32 bytes: the hardware applies the swizzle to the computed addresses, as it did to the TMA's.
__device__ __forceinline__ uint64_t wg_desc_k_sw128(unsigned addr) {
  return wg_desc(wg_desc_lo(addr & 0x3FFFFu, kDescLboK), kDescHiSw128);
}

// Byte offset of k step ks (16 f16 columns) in such a K-major tile of `rows` rows: slab ks / 4 (rows x 128 bytes
// each), 32 (ks % 4) bytes in.
__device__ __forceinline__ constexpr unsigned kmajor_step(int rows, int ks) {
  return unsigned((ks / 4) * (rows * 128) + (ks % 4) * 32);
}

// Shared-memory matrix descriptor of a K-major operand in the 64-byte swizzle (rows of 64 bytes as the TMA's
// CU_TENSOR_MAP_SWIZZLE_64B lands them, 8-row atoms of 512 bytes); a 32-byte step along K is the start address + 32.
__device__ __forceinline__ uint64_t wg_desc_k_sw64(unsigned addr) {
  return wg_desc(wg_desc_lo(addr & 0x3FFFFu, kDescLboK), (512u >> 4) | (2u << 30));
}

// d (s32, m64n64, the f32 accumulator layout) += A (64x32 s8 from registers, the mma.sync m16n8k32 A layout per warp)
// * B (N = 64 rows x 32 s8, K-major). d starts at whatever the caller put there (the int8 Q.K's magic bias).
__device__ __forceinline__ void wgmma_s8_n64(int (&d)[8][4], const uint32_t (&a)[4], uint64_t desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p;\n}\n"
      : "+r"(d[0][0]), "+r"(d[0][1]), "+r"(d[0][2]), "+r"(d[0][3]), "+r"(d[1][0]), "+r"(d[1][1]), "+r"(d[1][2]), "+r"(d[1][3]),
          "+r"(d[2][0]), "+r"(d[2][1]), "+r"(d[2][2]), "+r"(d[2][3]), "+r"(d[3][0]), "+r"(d[3][1]), "+r"(d[3][2]), "+r"(d[3][3]),
          "+r"(d[4][0]), "+r"(d[4][1]), "+r"(d[4][2]), "+r"(d[4][3]), "+r"(d[5][0]), "+r"(d[5][1]), "+r"(d[5][2]), "+r"(d[5][3]),
          "+r"(d[6][0]), "+r"(d[6][1]), "+r"(d[6][2]), "+r"(d[6][3]), "+r"(d[7][0]), "+r"(d[7][1]), "+r"(d[7][2]), "+r"(d[7][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
}
__device__ __forceinline__ void wg_reg_fence_i(int& r) { asm volatile("" : "+r"(r)::"memory"); }

// d (f32, m64n64) (+)= A (64x16 f16 from registers, the mma.sync m16n8k16 A layout per warp) * B (N = 64 rows x 16 f16,
// K-major: imm-trans-b 0). ACC = false writes d (scale-d false) instead of adding to it, so d needs no zeroing.
template <bool ACC>
__device__ __forceinline__ void wgmma_f16_n64_kmajor(float (&d)[8][4], const uint32_t (&a)[4], uint64_t desc) {
  if constexpr (ACC) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
          "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 0, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
        : "=f"(d[0][0]), "=f"(d[0][1]), "=f"(d[0][2]), "=f"(d[0][3]), "=f"(d[1][0]), "=f"(d[1][1]), "=f"(d[1][2]), "=f"(d[1][3]),
          "=f"(d[2][0]), "=f"(d[2][1]), "=f"(d[2][2]), "=f"(d[2][3]), "=f"(d[3][0]), "=f"(d[3][1]), "=f"(d[3][2]), "=f"(d[3][3]),
          "=f"(d[4][0]), "=f"(d[4][1]), "=f"(d[4][2]), "=f"(d[4][3]), "=f"(d[5][0]), "=f"(d[5][1]), "=f"(d[5][2]), "=f"(d[5][3]),
          "=f"(d[6][0]), "=f"(d[6][1]), "=f"(d[6][2]), "=f"(d[6][3]), "=f"(d[7][0]), "=f"(d[7][1]), "=f"(d[7][2]), "=f"(d[7][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
  }
}
// d (f32, m64n64) (+)= A (64x16 f16, K-major in shared memory: desc a) * B (N = 64 rows x 16 f16, K-major: desc b), both
// operands in the 128-byte swizzle (wg_desc_k_sw128). ACC = false writes d instead of adding to it. For Q.K products
// whose Q fragments would not fit registers beside a wide O accumulator (prefill_wg.cuh, D = 256).
template <bool ACC>
__device__ __forceinline__ void wgmma_f16_n64_ss(float (&d)[8][4], uint64_t a, uint64_t b) {
  if constexpr (ACC) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "%32, %33, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
          "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
        : "l"(a), "l"(b));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 0, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "%32, %33, p, 1, 1, 0, 0;\n}\n"
        : "=f"(d[0][0]), "=f"(d[0][1]), "=f"(d[0][2]), "=f"(d[0][3]), "=f"(d[1][0]), "=f"(d[1][1]), "=f"(d[1][2]), "=f"(d[1][3]),
          "=f"(d[2][0]), "=f"(d[2][1]), "=f"(d[2][2]), "=f"(d[2][3]), "=f"(d[3][0]), "=f"(d[3][1]), "=f"(d[3][2]), "=f"(d[3][3]),
          "=f"(d[4][0]), "=f"(d[4][1]), "=f"(d[4][2]), "=f"(d[4][3]), "=f"(d[5][0]), "=f"(d[5][1]), "=f"(d[5][2]), "=f"(d[5][3]),
          "=f"(d[6][0]), "=f"(d[6][1]), "=f"(d[6][2]), "=f"(d[6][3]), "=f"(d[7][0]), "=f"(d[7][1]), "=f"(d[7][2]), "=f"(d[7][3])
        : "l"(a), "l"(b));
  }
}

// The same with N = 128 rows of B (128 keys per Q.K tile: prefill_ws.cuh's wide tiles).
template <bool ACC>
__device__ __forceinline__ void wgmma_f16_n128_ss(float (&d)[16][4], uint64_t a, uint64_t b) {
  if constexpr (ACC) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "%64, %65, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
          "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
          "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
          "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
          "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
          "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
        : "l"(a), "l"(b));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 0, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "%64, %65, p, 1, 1, 0, 0;\n}\n"
        : "=f"(d[0][0]), "=f"(d[0][1]), "=f"(d[0][2]), "=f"(d[0][3]), "=f"(d[1][0]), "=f"(d[1][1]), "=f"(d[1][2]), "=f"(d[1][3]),
          "=f"(d[2][0]), "=f"(d[2][1]), "=f"(d[2][2]), "=f"(d[2][3]), "=f"(d[3][0]), "=f"(d[3][1]), "=f"(d[3][2]), "=f"(d[3][3]),
          "=f"(d[4][0]), "=f"(d[4][1]), "=f"(d[4][2]), "=f"(d[4][3]), "=f"(d[5][0]), "=f"(d[5][1]), "=f"(d[5][2]), "=f"(d[5][3]),
          "=f"(d[6][0]), "=f"(d[6][1]), "=f"(d[6][2]), "=f"(d[6][3]), "=f"(d[7][0]), "=f"(d[7][1]), "=f"(d[7][2]), "=f"(d[7][3]),
          "=f"(d[8][0]), "=f"(d[8][1]), "=f"(d[8][2]), "=f"(d[8][3]), "=f"(d[9][0]), "=f"(d[9][1]), "=f"(d[9][2]), "=f"(d[9][3]),
          "=f"(d[10][0]), "=f"(d[10][1]), "=f"(d[10][2]), "=f"(d[10][3]), "=f"(d[11][0]), "=f"(d[11][1]), "=f"(d[11][2]), "=f"(d[11][3]),
          "=f"(d[12][0]), "=f"(d[12][1]), "=f"(d[12][2]), "=f"(d[12][3]), "=f"(d[13][0]), "=f"(d[13][1]), "=f"(d[13][2]), "=f"(d[13][3]),
          "=f"(d[14][0]), "=f"(d[14][1]), "=f"(d[14][2]), "=f"(d[14][3]), "=f"(d[15][0]), "=f"(d[15][1]), "=f"(d[15][2]), "=f"(d[15][3])
        : "l"(a), "l"(b));
  }
}

// Warp specialization (sm_90a): a warpgroup gives registers back to the block's pool (dec) or takes them from it (inc),
// so a producer warpgroup that only issues copies runs on few and the consumers' accumulators get the rest. Every
// thread of the warpgroup executes it; N is a multiple of 8 in [24, 256].
template <int N>
__device__ __forceinline__ void wg_regs_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void wg_regs_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// Named barrier `id` (1..15; 0 is __syncthreads') of n threads (a multiple of 32): sync waits for n arrivals in all,
// counting its own warps; arrive adds this warp's and goes on. Two warpgroups take turns with a pair of them.
__device__ __forceinline__ void named_bar_sync(int id, int n) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int n) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
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

// q8_0 / q4_0 / q6_0 V dequantized in float16 (level * scale, one rounding) overflows past the largest scale whose
// levels (|level| <= 127 / 8 / 32) stay below float16's 65520: 515.5 (q8_0, bits 0x6007), 8188 (q4_0, 0x6FFF) and
// 2047 (q6_0, 0x67FF). float16 V blocks of +-65504 pack to 516 (127 x 516 = 65532 -> inf, and p = 0 times inf is
// NaN), float32 V up to 65504.
// VK: kVQ8 (2), kVQ4 (3) or kVQ6 (4) of gpu/attention_tile.cuh.
template <int VK>
__device__ __forceinline__ constexpr float v_scale_limit() { return VK == 2 ? 515.5f : VK == 4 ? 2047.f : 8188.f; }
// Whether either V scale of the pair w is past that limit, or NaN (the compare is false for NaN).
template <int VK>
__device__ __forceinline__ bool scales_past_limit(uint32_t w) {
  constexpr unsigned short kLim = VK == 2 ? 0x6007u : VK == 4 ? 0x67FFu : 0x6FFFu;
  const __half2 x = *reinterpret_cast<const __half2*>(&w);
  return !__hble2(__habs2(x), __halves2half2(__ushort_as_half(kLim), __ushort_as_half(kLim)));
}
// Both halves clamped to +-65504 (an overflowed +-inf becomes +-65504).
__device__ __forceinline__ uint32_t hclamp_u(uint32_t a) {
  const __half2 big = __halves2half2(__ushort_as_half(0x7BFFu), __ushort_as_half(0x7BFFu));
  __half2 x = *reinterpret_cast<const __half2*>(&a);
  x = __hmax2(__hmin2(x, big), __hneg2(big));
  return *reinterpret_cast<const uint32_t*>(&x);
}

__device__ __forceinline__ uint32_t hsub2_u(uint32_t a, uint32_t b) {
  __half2 x = *reinterpret_cast<const __half2*>(&a);
  const __half2 y = *reinterpret_cast<const __half2*>(&b);
  x = __hsub2(x, y);
  return *reinterpret_cast<const uint32_t*>(&x);
}

// The largest of s[n][e], s[n][e + 1] over the N groups of an m16n8 C fragment row (e = 0: the thread's first row,
// 2: its second), as a tree. Why: it is the softmax's first step after the Q.K, on a tile's critical path (in
// prefill_ws.cuh while only the other consumer warpgroup's GEMMs run); a chain (what ptxas makes of a loop of fmaxf)
// waits about N times for the max before, the tree log2(2 N) times. Same result: fmaxf drops a NaN whatever the
// order, and a row of NaN logits (all its keys poisoned) gives NaN where the chain from -inf gave -inf, which the
// softmaxes treat alike (no compare with it holds, fmaxf with it keeps the running max). 1-2 % at 8k keys (D 64 /
// 128) in prefill_ws.cuh, level at 32k and at D = 256 (docs/performance.md, "A tree for the row maximum").
template <int W, int N>
__device__ __forceinline__ void fold_max(float (&x)[N]) {  // x[n] = max(x[n], x[n + W]), then W / 2, ... 1
  if constexpr (W >= 1) {
#pragma unroll
    for (int n = 0; n < W; ++n) x[n] = fmaxf(x[n], x[n + W]);
    fold_max<W / 2>(x);
  }
}

template <int N>
__device__ __forceinline__ float tree_max(const float (&s)[N][4], int e) {
  static_assert((N & (N - 1)) == 0, "tree_max: a power of two of groups");
  float x[N];
#pragma unroll
  for (int n = 0; n < N; ++n) x[n] = fmaxf(s[n][e], s[n][e + 1]);
  fold_max<N / 2>(x);
  return x[0];
}

}  // namespace gpu
}  // namespace dot4attn

#endif  // D4A_CUDA
