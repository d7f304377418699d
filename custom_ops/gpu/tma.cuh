// TMA (sm_90 tensor memory accelerator) pieces of the tensor-core decode's kStageTma staging (decode_mma.cuh) and of the
// tensor-core prefill's K / V tiles (prefill_mma.cuh):
// host-side tensor maps of the K / V caches, device-side tensor copies, mbarriers and the L2 evict-first policy.
// CUDA only; the device functions need sm_90 (the host launches kStageTma only there).
//
// Why: a chunk's K / V rows are read once. Copies that carry the L2 evict-first policy stream faster than cp.async
// (whose policy form CUDA 13.0's ptxas miscompiles: see StageMode in decode_mma.cuh), and a TMA copy moves a whole
// 32-key x 128-byte slab per instruction from one lane instead of one cp.async per 16 bytes and lane, with no
// registers held (the register staging's price).
#pragma once

#include <cstdint>

#include "gpu/vendor.h"

#if defined(D4A_CUDA)
#include <cuda.h>  // CUtensorMap and its enums (types only: the encoder comes through the runtime, no libcuda link)
#include <cudaTypedefs.h>

namespace dot4attn {
namespace gpu {

// The kernel parameter that carries the maps (__grid_constant__: the copies take the map's parameter address).
struct TmaMaps {
  CUtensorMap k, v;
};

// Host: the driver's cuTensorMapEncodeTiled through the runtime (null when the driver has none).
inline PFN_cuTensorMapEncodeTiled_v12000 tma_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      return PFN_cuTensorMapEncodeTiled_v12000(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

// Shared-memory sizes and bases that a swizzled TMA copy lands in are multiples of the swizzle period (1024 bytes).
__host__ __device__ constexpr int up1024(int x) { return (x + 1023) & ~1023; }

// Device: bytes that move the dynamic shared memory base `raw` up to the swizzle period (the launcher asks for 1024
// bytes of slack).
__device__ __forceinline__ unsigned smem_pad1024(const uint8_t* raw) {
  return (1024u - (static_cast<unsigned>(__cvta_generic_to_shared(raw)) & 1023u)) & 1023u;
}

// Slab width of rows of `row_bytes` bytes: a TMA box is `keys` rows x W bytes, W = min(row, 128) (the widest swizzle).
__host__ __device__ constexpr int tma_slab(int row_bytes) { return row_bytes < 128 ? row_bytes : 128; }

// Whether rows of `row_bytes` bytes at `base`, `row_stride` bytes apart, `head_rows` rows per head of which the first
// sk are read, fit the TMA's rules: 32 / 64 / 128-byte slab multiples, a 16-byte aligned base (null counts as
// aligned: a plan made without pointers) and row stride, at most 2^32 keys and heads, global strides below 2^40.
inline bool tma_rows_ok(const void* base, int64_t row_bytes, int64_t row_stride, int64_t head_rows, int64_t sk,
                        int64_t heads) {
  const int64_t w = row_bytes < 128 ? row_bytes : 128;  // the slab width (tma_slab)
  return (w == 32 || w == 64 || w == 128) && row_bytes % w == 0 && row_stride >= row_bytes && row_stride % 16 == 0 &&
         sk >= 1 && head_rows >= sk && heads >= 1 && sk <= 0xffffffffLL && heads <= 0xffffffffLL &&
         (reinterpret_cast<uintptr_t>(base) & 15) == 0 && row_stride <= ((int64_t(1) << 40) - 1) / head_rows;
}

// Host: a cache of `heads` x `head_rows` rows at `base`, `row_stride` bytes apart (row-major [B, H, head_rows, row],
// dense or with padded rows), of which the first `row_bytes` bytes of the first `sk` rows per head are read, as a
// 3-D byte tensor (row bytes, keys, heads) copied in boxes of `keys` rows x W bytes with the W-byte swizzle; keys
// past sk read as zeros (never the rows behind them). False when there is no encoder or the shape does not fit the
// TMA's rules (the planner checked both).
inline bool tma_map_rows(CUtensorMap* m, const void* base, int64_t row_bytes, int64_t row_stride, int64_t head_rows,
                         int64_t sk, int64_t heads, int keys) {
  const PFN_cuTensorMapEncodeTiled_v12000 fn = tma_encoder();
  if (fn == nullptr || !tma_rows_ok(base, row_bytes, row_stride, head_rows, sk, heads)) return false;
  const int64_t w = tma_slab(int(row_bytes));
  const cuuint64_t dims[3] = {cuuint64_t(row_bytes), cuuint64_t(sk), cuuint64_t(heads)};
  const cuuint64_t strides[2] = {cuuint64_t(row_stride), cuuint64_t(row_stride * head_rows)};
  const cuuint32_t box[3] = {cuuint32_t(w), cuuint32_t(keys), 1u};
  const cuuint32_t es[3] = {1u, 1u, 1u};
  const CUtensorMapSwizzle sw = w == 128 ? CU_TENSOR_MAP_SWIZZLE_128B
                                : w == 64 ? CU_TENSOR_MAP_SWIZZLE_64B
                                          : CU_TENSOR_MAP_SWIZZLE_32B;
  return fn(m, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, const_cast<void*>(base), dims, strides, box, es,
            CU_TENSOR_MAP_INTERLEAVE_NONE, sw, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// Device: byte b of row r in a shared-memory copy of rows of ROW bytes, as the TMA writes it: dense slabs of
// kRows x W bytes (W = min(ROW, 128), slab b / W), 16-byte piece c of row r at c ^ ((r W / 128) mod (W / 16))
// (CU_TENSOR_MAP_SWIZZLE_{W}B on slabs aligned to their 8 x W-byte period). ldmatrix's eight rows of one piece
// land in eight different bank groups, as with the padded rows of the cp.async layout.
template <int ROW, int kRows>
__device__ __forceinline__ int tma_row_byte(int r, int b) {
  constexpr int W = tma_slab(ROW);
  return (b / W) * (kRows * W) + r * W + ((((b % W) >> 4) ^ ((r * W >> 7) & (W / 16 - 1))) << 4) + (b & 15);
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define D4A_TMA_DEVICE 1
#endif

__device__ __forceinline__ uint64_t l2_evict_first_policy() {
  uint64_t p = 0;
#if defined(D4A_TMA_DEVICE)
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(p));
#endif
  return p;
}

__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
#if defined(D4A_TMA_DEVICE)
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#endif
}

// Makes initialised barriers visible to the TMA (the async proxy).
__device__ __forceinline__ void mbar_init_fence() {
#if defined(D4A_TMA_DEVICE)
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

// Arrives on the barrier and adds `bytes` to the transfers its current phase waits for.
__device__ __forceinline__ void mbar_arrive_expect(uint32_t bar, int bytes) {
#if defined(D4A_TMA_DEVICE)
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
#endif
}

// Arrives on the barrier (one of the arrivals its phase counts; no transfer bytes): a consumer giving a slot back.
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
#if defined(D4A_TMA_DEVICE)
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
#endif
}

// Waits until the phase with this parity has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
#if defined(D4A_TMA_DEVICE)
  asm volatile(
      "{\n.reg .pred p;\nD4A_MBAR_WAIT:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra D4A_MBAR_WAIT;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
#endif
}

// Orders this thread's generic-proxy shared-memory writes before later TMA writes to the same bytes.
__device__ __forceinline__ void fence_proxy_async_smem() {
#if defined(D4A_TMA_DEVICE)
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// Box (x bytes, y rows, z head) of the map into shared memory at dst; completes `bar`'s transfer bytes.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, int x, int y, int z, uint32_t bar,
                                            uint64_t policy) {
#if defined(D4A_TMA_DEVICE)
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%2, %3, %4}], [%5], %6;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(z), "r"(bar), "l"(policy)
      : "memory");
#else
  (void)dst; (void)map; (void)x; (void)y; (void)z; (void)bar; (void)policy;
  __trap();
#endif
}

// `bytes` (a multiple of 16) contiguous bytes at src (16-byte aligned) into shared memory at dst, with the L2 policy;
// completes `bar`'s transfer bytes. A packed cache's chunk of consecutive rows is one such run (kStageBulk).
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, int bytes, uint32_t bar, uint64_t policy) {
#if defined(D4A_TMA_DEVICE)
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;\n"
      ::"r"(dst), "l"(src), "r"(bytes), "r"(bar), "l"(policy)
      : "memory");
#else
  (void)dst; (void)src; (void)bytes; (void)bar; (void)policy;
  __trap();
#endif
}

// `bytes` (a multiple of 16) contiguous bytes at src (16-byte aligned) toward L2, with nothing to wait for: a load
// that comes later finds them there (the warp-specialized prefill's next Q rows).
__device__ __forceinline__ void bulk_prefetch_l2(const void* src, uint32_t bytes) {
#if defined(D4A_TMA_DEVICE)
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(src), "r"(bytes) : "memory");
#else
  (void)src; (void)bytes;
  __trap();
#endif
}

// The same copy without a cache hint (data that other blocks read again, as the prefill's K / V tiles).
__device__ __forceinline__ void tma_load_3d_plain(uint32_t dst, const CUtensorMap* map, int x, int y, int z,
                                                  uint32_t bar) {
#if defined(D4A_TMA_DEVICE)
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(z), "r"(bar)
      : "memory");
#else
  (void)dst; (void)map; (void)x; (void)y; (void)z; (void)bar;
  __trap();
#endif
}

}  // namespace gpu
}  // namespace dot4attn

#endif  // D4A_CUDA
