// Dot4Attention prefill route on the GPU (Sq > 8): tiled FlashAttention in one launch. Executes a launch plan
// (gpu/launch_plan.h) of one of two kernels:
//   * the tensor-core prefill (gpu/prefill_mma.cuh; CUDA sm_80+, float16 T, D 64 / 128 / 256): int8 mma Q.K, f16
//     mma.sync P.V, or on sm_90a wgmma P.V from TMA tiles; with float16 V a long wgmma call first scans V once for
//     NaN / Inf (gpu/v_scan.cuh), then runs the unflagged heads on an instance without the V check and the flagged
//     ones on the checked instance; a long q8_0 / q4_0 V call first converts V once into float16 rows
//     (gpu/v_dequant.cuh) and runs the float16-V instance on them; with k_dequant (long calls on sm_90a) K is
//     converted once into float16 rows too (gpu/k_dequant.cuh: one pass for K's copy, V's copy and V's scan) and the
//     QK16 instance runs the Q.K on f16 wgmma (D 64 / 128), or at D = 256 the kernel with Q in shared memory
//     (gpu/prefill_wg.cuh);
//   * the tile kernel (gpu/attention_tile.cuh; every other case, and HIP): a block owns 64 rows of one (batch, KV
//     head) row space and walks the keys in 64-key tiles (32-key tiles, and 32 rows at D = 256, where that block does
//     not fit the shared memory: AMD's 64 KB LDS); with causal masking it stops at the last key its rows can
//     see, tiles that every row sees fully run without any check, only the causal tail (and explicit masks) is
//     masked per element, and the heaviest row chunks launch first. Q.K by 4-way int8 dot products, P.V in float32.
#include <atomic>
#include <stdexcept>

#include "gpu/attention_gpu_internal.h"
#include "gpu/k_dequant.cuh"
#include "gpu/prefill_mma.cuh"
#include "gpu/prefill_wg.cuh"
#include "gpu/prefill_ws.cuh"
#include "gpu/v_dequant.cuh"
#include "gpu/v_scan.cuh"

namespace dot4attn {
namespace gpu {

namespace {

// 64 rows of 64-key tiles; where that block does not fit the shared memory (AMD's 64 KB LDS), 32-key tiles of 64 rows
// (D <= 128) or 32 rows (D = 256) (launch_plan.cu, plan_tile).
template <int VK>
void tile_d(const GpuPlan& pl, const TileArgs& a, gpuStream_t s) {
  const int rb = pl.rows_per_block;
  if (pl.key_tile == kTileKeys && rb == 64) {
    if (a.D <= 64) return launch_planned(attn_tile_kernel<VK, 64, 64, 16, 2>, pl, s, a);
    if (a.D <= 128) return launch_planned(attn_tile_kernel<VK, 128, 64, 16, 2>, pl, s, a);
    return launch_planned(attn_tile_kernel<VK, 256, 64, 16, 2>, pl, s, a);
  }
  if (pl.key_tile == 32 && rb == 64 && a.D <= 64)
    return launch_planned(attn_tile_kernel<VK, 64, 64, 16, 2, 32>, pl, s, a);
  if (pl.key_tile == 32 && rb == 64 && a.D <= 128)
    return launch_planned(attn_tile_kernel<VK, 128, 64, 16, 2, 32>, pl, s, a);
  if (pl.key_tile == 32 && rb == 32 && a.D > 128)
    return launch_planned(attn_tile_kernel<VK, 256, 32, 16, 2, 32>, pl, s, a);
  no_instance(pl);
}

#if defined(D4A_HAS_PREFILL_MMA)
// Marks the code the runtime loads for the current device: 16 bytes of static shared memory where it was compiled
// with wgmma (sm_90a), none elsewhere (sm_80, plain sm_90, compute_90 PTX). Never launched, only asked for its
// attributes (wgmma_in_binary).
__global__ void wgmma_marker_kernel(int* p) {
#if defined(D4A_WGMMA)
  __shared__ int marker[4];
  if (p) {  // a store the compiler cannot drop, so the array stays in the attributes
    marker[threadIdx.x & 3] = 1;
    __syncthreads();
    *p = marker[0];
  }
#else
  (void)p;
#endif
}

// The tensor maps of a TMA plan's K tiles (rows of k_row bytes: int8 K, or its float16 copy) and V tiles.
inline TmaMaps kv_maps(const TileArgs& a, int k_row, int v_row) {
  TmaMaps tm{};
  if (!tma_map_rows(&tm.k, a.k, k_row, a.k_stride, a.kv_rows, a.Sk, a.B * a.Hkv, pmma::kKeys) ||
      !tma_map_rows(&tm.v, a.v, v_row, a.v_stride, a.kv_rows, a.Sk, a.B * a.Hkv, pmma::kKeys))
    throw std::runtime_error("Dot4Attention GPU: the driver refused the K / V tensor maps of a TMA plan");
  return tm;
}

// A float16-V plan with the V scan: the scan into the flags in scratch, then the unflagged heads on `unchecked` (the
// instance without the V check) and the flagged ones on `checked`; each launch's other blocks return at once.
template <typename Unchecked, typename Checked>
void launch_v_scanned(Unchecked unchecked, Checked checked, const GpuPlan& pl, const TileArgs& a, void* scratch,
                      const TmaMaps& tm, gpuStream_t s) {
  TileArgs b = a;
  b.v_flags = static_cast<const int*>(scratch);
  scan_v_nonfinite(b, static_cast<int*>(scratch), s);
  launch_planned(unchecked, pl, s, b, pl.causal_tiles, tm);
  launch_planned(checked, pl, s, b, pl.causal_tiles, tm);
}

// One planned instance: TMA tiles (sm_90, 2+ blocks per SM of the pipelined layout), with the wgmma P.V where the
// plan says so, or cp.async tiles.
// scratch: the V scan's flags (pl.v_scan: float16 V, wgmma, 3 blocks per SM; the only instances compiled without
// the V check).
template <int VK, int D, int MT, int MINB>
void mma_inst(const GpuPlan& pl, const TileArgs& a, void* scratch, gpuStream_t s) {
  using Tr = pmma::Traits<VK, D, MT>;
  TmaMaps tm{};
  if constexpr (Tr::kPipe && MINB >= 2) {
    if (pl.tma) {
      tm = kv_maps(a, D, Tr::VROW);
      if constexpr (Tr::kWgmma && VK == kVF16 && MT == 1 && MINB == 2) {
        if (pl.qk_wgmma) {  // the int8 Q.K on wgmma (S8W), 2 blocks per SM (no V scan there)
          if (pl.v_scan || !pl.wgmma) no_instance(pl);
          return launch_planned(pmma::prefill_mma_kernel<VK, D, MT, MINB, true, true, true, false, true>, pl, s, a,
                                pl.causal_tiles, tm);
        }
      }
      if constexpr (Tr::kWgmma) {
        if constexpr (VK == kVF16 && MINB == 3) {
          if (pl.wgmma && pl.v_scan)
            return launch_v_scanned(pmma::prefill_mma_kernel<VK, D, MT, MINB, true, true, false>,
                                    pmma::prefill_mma_kernel<VK, D, MT, MINB, true, true>, pl, a, scratch, tm, s);
        }
        if (pl.wgmma && !pl.v_scan)
          return launch_planned(pmma::prefill_mma_kernel<VK, D, MT, MINB, true, true>, pl, s, a, pl.causal_tiles, tm);
      }
      if (pl.v_scan) no_instance(pl);  // the planner scans only where the unchecked instance exists
      return launch_planned(pmma::prefill_mma_kernel<VK, D, MT, MINB, true, false>, pl, s, a, pl.causal_tiles, tm);
    }
  }
  if (pl.tma || pl.wgmma || pl.v_scan || pl.qk_wgmma) no_instance(pl);
  launch_planned(pmma::prefill_mma_kernel<VK, D, MT, MINB, false, false>, pl, s, a, pl.causal_tiles, tm);
}

// The QK16 instances (float16 V, TMA, wgmma) on a's K, already the float16 copy (rows of 2 D bytes): 3 blocks per SM,
// with the V scan's two launches where the plan scans V, or 2 blocks per SM, the schedule that overlaps the softmax
// with the next tile's Q.K.
template <int D>
void mma_qk16(const GpuPlan& pl, const TileArgs& a, void* scratch, gpuStream_t s) {
  const TmaMaps tm = kv_maps(a, 2 * D, pmma::Traits<kVF16, D, 1>::VROW);
  if (pl.min_blocks == 2) {
    if (pl.v_scan) no_instance(pl);
    return launch_planned(pmma::prefill_mma_kernel<kVF16, D, 1, 2, true, true, true, true>, pl, s, a, pl.causal_tiles,
                          tm);
  }
  if (pl.v_scan)
    return launch_v_scanned(pmma::prefill_mma_kernel<kVF16, D, 1, 3, true, true, false, true>,
                            pmma::prefill_mma_kernel<kVF16, D, 1, 3, true, true, true, true>, pl, a, scratch, tm, s);
  launch_planned(pmma::prefill_mma_kernel<kVF16, D, 1, 3, true, true, true, true>, pl, s, a, pl.causal_tiles, tm);
}

// The D = 256 QK16 kernel (prefill_wg.cuh; NWG warpgroups per block) on a's K, already the float16 copy, and V as
// float16 rows (V itself or its copy), with the V scan's two launches where the plan scans V.
template <int NWG>
void wg_qk16(const GpuPlan& pl, const TileArgs& a, void* scratch, gpuStream_t s) {
  const TmaMaps tm = kv_maps(a, 2 * 256, 2 * 256);
  if (pl.v_scan)
    return launch_v_scanned(pwg::prefill_wg_kernel<256, NWG, false>, pwg::prefill_wg_kernel<256, NWG, true>, pl, a,
                            scratch, tm, s);
  launch_planned(pwg::prefill_wg_kernel<256, NWG, true>, pl, s, a, pl.causal_tiles, tm);
}

// The warp-specialized QK16 kernel (prefill_ws.cuh, D 64 / 128 / 256) on b's K and V as float16 rows, V scanned into
// b.v_flags: the unflagged heads on it (a block per SM walking the work items, or a block per item) and the flagged
// ones on prefill_wg.cuh's checked instance (two warpgroups of the same 128 rows per block, a block per SM striding
// over the items; its own block size and shared memory). V is scanned in K's pass (copy_kv), or with ws_late_scan
// behind the kernel, which then runs every head, the flagged ones again on the checked instance after the scan (the
// call's own float16 V). All launch as programmatic dependents: each kernel's launch overlaps the end of the one
// before.
// Why: at 2k keys the gaps between the five launches were ~12 us of 122; overlapped, 1.036x (docs/performance.md).
template <int D, int NK>
void ws_qk16(const GpuPlan& pl, const TileArgs& b, gpuStream_t s) {
  using I = pws::Inst<D, NK>;
  const TmaMaps tm = kv_maps(b, 2 * D, 2 * D);
  const int order = int(pl.ws_snake) | (pl.ws_group << 1);  // the kernel's `order`: the deal, the KV-head groups
  // ws_late_scan: V scanned after the kernel, which then skips no head: its flags are the zeros after the scan's (a
  // null pointer and a check in the kernel's item lookup made the D = 64 kernel 4.5 % slower, H100)
  TileArgs w = b;
  if (pl.ws_late_scan) w.v_flags = b.v_flags + b.B * b.Hkv;
  launch_planned_dependent(pws::prefill_ws_kernel<D, NK, I::SK, I::SV>, pl, s, w, pl.causal_tiles, pl.ws_items, order,
                           tm);
  if (pl.ws_late_scan) scan_v_after(b, const_cast<int*>(b.v_flags), s);
  GpuPlan c = pl;  // a block per SM, striding over the work items (most return at once: their head is unflagged)
  c.blocks = pl.ws_checked_blocks;
  c.threads = 256;
  c.smem_bytes = pwg::Layout<D, 2>::bytes;
  launch_planned_dependent(pwg::prefill_wg_kernel<D, 2, true, true>, c, s, b, pl.causal_tiles, tm);
}

void ws_d(const GpuPlan& pl, const TileArgs& a, gpuStream_t s) {
  const bool wide = pl.key_tile == 128;
  if (a.D == 64) return wide ? ws_qk16<64, 128>(pl, a, s) : ws_qk16<64, 64>(pl, a, s);
  if (a.D == 128) return wide ? ws_qk16<128, 128>(pl, a, s) : ws_qk16<128, 64>(pl, a, s);
  if (a.D == 256 && !wide) return ws_qk16<256, 64>(pl, a, s);
  no_instance(pl);
}

template <int VK>
void mma_vk(const GpuPlan& pl, const TileArgs& a, void* scratch, gpuStream_t s) {
  const int mt = pl.m_tiles, minb = pl.min_blocks;
  if (a.D == 64 && mt == 2 && minb == 1) return mma_inst<VK, 64, 2, 1>(pl, a, scratch, s);
  if (a.D == 64 && mt == 1 && minb == 3) return mma_inst<VK, 64, 1, 3>(pl, a, scratch, s);
  if (a.D == 64 && mt == 1 && minb == 2) return mma_inst<VK, 64, 1, 2>(pl, a, scratch, s);
  if (a.D == 128 && mt == 2 && minb == 1) return mma_inst<VK, 128, 2, 1>(pl, a, scratch, s);
  if (a.D == 128 && mt == 1 && minb == 3) return mma_inst<VK, 128, 1, 3>(pl, a, scratch, s);
  if (a.D == 128 && mt == 1 && minb == 2) return mma_inst<VK, 128, 1, 2>(pl, a, scratch, s);
  if (a.D == 256 && mt == 1 && minb == 1) return mma_inst<VK, 256, 1, 1>(pl, a, scratch, s);
  no_instance(pl);
}
#endif

}  // namespace

// A build for plain sm_90 (no 90a) runs the wgmma instances' mma.sync fallback, which wants 2 blocks per SM, not 3:
// the planner asks this. Cached per device; no launch, no sync.
bool wgmma_in_binary() {
#if defined(D4A_HAS_PREFILL_MMA)
  static std::atomic<int> known[64];  // 0 unknown, 1 yes, 2 no
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  std::atomic<int>* slot = dev >= 0 && dev < 64 ? &known[dev] : nullptr;
  if (slot) {
    const int k = slot->load(std::memory_order_relaxed);
    if (k != 0) return k == 1;
  }
  cudaFuncAttributes fa{};
  const bool yes = cudaFuncGetAttributes(&fa, wgmma_marker_kernel) == cudaSuccess && fa.sharedSizeBytes > 0;
  if (slot) slot->store(yes ? 1 : 2, std::memory_order_relaxed);
  return yes;
#else
  return false;
#endif
}

void run_prefill(const GpuPlan& pl, const TileArgs& a, void* scratch, gpuStream_t s) {
  if (pl.kernel == KernelKind::kTile) {
    switch (a.vk) {
      case kVF32: return tile_d<kVF32>(pl, a, s);
      case kVF16: return tile_d<kVF16>(pl, a, s);
      case kVQ8: return tile_d<kVQ8>(pl, a, s);
      case kVQ6: return tile_d<kVQ6>(pl, a, s);
      default: return tile_d<kVQ4>(pl, a, s);
    }
  }
#if defined(D4A_HAS_PREFILL_MMA)
  if (pl.kernel == KernelKind::kPrefillMma) {
    uint8_t* sc = static_cast<uint8_t*>(scratch);  // [V copy][K copy, K flags][V scan flags], as the plan sized them
    TileArgs b = a;
    uint8_t* v_copy = nullptr;
    if (pl.v_dequant) {  // q8_0 / q4_0 / q6_0 V into float16 rows first (v_dequant.cuh), then a float16-V instance
      v_copy = sc;
      if (!pl.k_dequant) dequant_v(a, pl.v_source, v_copy, s);  // else in K's pass
      b.vk = kVF16;
      b.v = sc;
      b.vs = nullptr;
      b.v_stride = 2 * a.D;
      b.vs_stride = 0;
      sc += pl.v_dequant_bytes;
    }
    if (pl.k_dequant) {  // K into float16 rows (k_dequant.cuh), then the QK16 instance
      uint8_t* k_copy = sc;
      int* kflags = reinterpret_cast<int*>(sc + pl.k_dequant_bytes);
      sc += pl.k_dequant_bytes + pl.k_flag_bytes;
      int* vflags = pl.ws ? reinterpret_cast<int*>(sc) : nullptr;  // ws: V's flags (and zeros), zeroed in the K pass
      // with V's copy and scan (unless V is scanned after the ws kernel: ws_late_scan), one pass
      copy_kv(a, k_copy, kflags, vflags, !pl.ws_late_scan, v_copy, pl.v_source, s);
      b.k = reinterpret_cast<const int8_t*>(k_copy);
      b.k_stride = 2 * a.D;
      b.ks = nullptr;
      b.ks_stride = 0;
      b.k_flags = kflags;
      if (pl.ws) {
        b.v_flags = vflags;
        return ws_d(pl, b, s);
      }
      if (a.D == 64) return mma_qk16<64>(pl, b, sc, s);
      if (a.D == 128) return mma_qk16<128>(pl, b, sc, s);
      if (a.D == 256) return pl.warps == 4 ? wg_qk16<1>(pl, b, sc, s) : wg_qk16<2>(pl, b, sc, s);
      no_instance(pl);
    }
    if (pl.v_dequant) return mma_vk<kVF16>(pl, b, sc, s);
    switch (a.vk) {
      case kVF16: return mma_vk<kVF16>(pl, a, scratch, s);
      case kVQ8: return mma_vk<kVQ8>(pl, a, scratch, s);
      case kVQ4: return mma_vk<kVQ4>(pl, a, scratch, s);
      default: break;
    }
  }
#endif
  no_instance(pl);
}

}  // namespace gpu
}  // namespace dot4attn
