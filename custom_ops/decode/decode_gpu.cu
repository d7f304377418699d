// Dot4Attention decode route on the GPU (Sq <= 8), also split_k's stage 1 (a.part_acc set: partial outputs).
// Executes a launch plan (gpu/launch_plan.h) of one of three kernels: the tensor-core decode kernel
// (gpu/decode_mma.cuh: CUDA sm_80+, float16 T, D 64 / 128 / 256), the SIMT decode kernel (gpu/decode_kernel.cuh)
// or the tile kernel (gpu/attention_tile.cuh). Each (kernel, V format, D, row tile[, staging]) below is one
// compiled instance; the planner only names instances that exist here.
#include <cstring>
#include <stdexcept>

#include "gpu/attention_gpu_internal.h"
#include "gpu/decode_kernel.cuh"
#include "gpu/decode_mma.cuh"

namespace dot4attn {
namespace gpu {

namespace {

[[noreturn]] void no_instance(const GpuPlan& pl) {
  throw std::runtime_error(std::string("Dot4Attention GPU: no compiled instance for the plan ") + plan_json(pl));
}

// ---- the tile kernel (decode rows of 4 / 8 / 16, 3 stages at most) ------------------------------------------------
template <int VK, int DMAX>
void tile_rb(const GpuPlan& pl, const TileArgs& a, gpuStream_t s) {
  switch (pl.rows_per_block) {
    case 4: return launch_planned(attn_tile_kernel<VK, DMAX, 4, 4, 3>, pl, s, a);
    case 8: return launch_planned(attn_tile_kernel<VK, DMAX, 8, 8, 3>, pl, s, a);
    case 16: return launch_planned(attn_tile_kernel<VK, DMAX, 16, 16, 3>, pl, s, a);
    default: no_instance(pl);
  }
}

template <int VK>
void tile_d(const GpuPlan& pl, const TileArgs& a, gpuStream_t s) {
  if (a.D <= 64) tile_rb<VK, 64>(pl, a, s);
  else if (a.D <= 128) tile_rb<VK, 128>(pl, a, s);
  else tile_rb<VK, 256>(pl, a, s);
}

// Whether K / V are dense tensors (Sk rows per head, rows the dense widths): such launches run the kernels' dense
// instances (SR false), which are today's dense code; the rest the strided ones.
template <int VK, int D>
bool dense_rows(const TileArgs& a) {
  constexpr int NB = D / 32;
  return a.kv_rows == a.Sk && a.k_stride == D && a.v_stride == v_row_bytes(VK, D) && a.ks_stride == NB &&
         (!(VK == kVQ8 || VK == kVQ4) || a.vs_stride == NB);
}

// ---- the SIMT decode kernel ---------------------------------------------------------------------------------------
template <int VK, int D, int RB>
void simt_launch(const GpuPlan& pl, const TileArgs& a, gpuStream_t s) {
  if (dense_rows<VK, D>(a)) launch_planned(decode_kernel<VK, D, RB, kDecodeMaxStages, false>, pl, s, a);
  else launch_planned(decode_kernel<VK, D, RB, kDecodeMaxStages, true>, pl, s, a);
}

template <int VK, int RB>
void simt_d(const GpuPlan& pl, const TileArgs& a, gpuStream_t s) {
  switch (a.D) {
    case 32: return simt_launch<VK, 32, RB>(pl, a, s);
    case 64: return simt_launch<VK, 64, RB>(pl, a, s);
    case 96: return simt_launch<VK, 96, RB>(pl, a, s);
    case 128: return simt_launch<VK, 128, RB>(pl, a, s);
    case 160: return simt_launch<VK, 160, RB>(pl, a, s);
    case 192: return simt_launch<VK, 192, RB>(pl, a, s);
    case 224: return simt_launch<VK, 224, RB>(pl, a, s);
    case 256: return simt_launch<VK, 256, RB>(pl, a, s);
    default: no_instance(pl);
  }
}

template <int VK>
void simt_rb(const GpuPlan& pl, const TileArgs& a, gpuStream_t s) {
  switch (pl.rows_per_block) {
    case 1: return simt_d<VK, 1>(pl, a, s);
    case 4: return simt_d<VK, 4>(pl, a, s);
    case 8: return simt_d<VK, 8>(pl, a, s);
    default: no_instance(pl);
  }
}

// ---- the tensor-core decode kernel ----------------------------------------------------------------------------------
#if defined(D4A_HAS_DECODE_MMA)
// One cluster launch: the plan's clusters of pl.cluster consecutive blocks (a (row chunk, batch, KV head)'s splits).
// False when the device refuses the configuration.
template <class Kernel>
bool launch_cluster(Kernel kern, const GpuPlan& pl, const TileArgs& a, const TmaMaps& tm, gpuStream_t s) {
  set_dynamic_smem(reinterpret_cast<const void*>(kern), pl.smem_bytes);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(pl.blocks));
  cfg.blockDim = dim3(unsigned(pl.threads));
  cfg.dynamicSmemBytes = size_t(pl.smem_bytes);
  cfg.stream = s;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeClusterDimension;
  at[0].val.clusterDim.x = unsigned(pl.cluster);
  at[0].val.clusterDim.y = 1;
  at[0].val.clusterDim.z = 1;
  cfg.attrs = at;
  cfg.numAttrs = 1;
  if (cudaLaunchKernelEx(&cfg, kern, a, tm) != cudaSuccess) {
    (void)cudaGetLastError();  // a refused configuration is not sticky
    return false;
  }
  return true;
}

// The plan's instance with dense (SR false) or strided (SR true) row addressing.
template <int VK, int D, bool SR>
bool mma_rows(const GpuPlan& pl, const TileArgs& a, const TmaMaps& tm, gpuStream_t s) {
  using namespace dmma;
  if (pl.staging == kStageTma) {
    launch_planned(decode_mma_kernel<VK, D, kStageTma, false, SR>, pl, s, a, tm);
    return true;
  }
  constexpr int kAuto = auto_staging(VK, D);
  if constexpr (kAuto != kStageCpAsync) {
    if (pl.staging == kAuto) {
      launch_planned(decode_mma_kernel<VK, D, kAuto, false, SR>, pl, s, a, tm);
      return true;
    }
  }
  if (pl.staging != kStageCpAsync) no_instance(pl);
  if (pl.cluster) return launch_cluster(decode_mma_kernel<VK, D, kStageCpAsync, true, SR>, pl, a, tm, s);
  launch_planned(decode_mma_kernel<VK, D, kStageCpAsync, false, SR>, pl, s, a, tm);
  return true;
}

template <int VK, int D>
bool mma_d(const GpuPlan& pl, const TileArgs& a, gpuStream_t s) {
  using namespace dmma;
  TmaMaps tm;
  std::memset(static_cast<void*>(&tm), 0, sizeof(tm));
  if (pl.staging == kStageTma &&
      (!tma_map_rows(&tm.k, a.k, D, a.k_stride, a.kv_rows, a.Sk, a.B * a.Hkv, kKC) ||
       !tma_map_rows(&tm.v, a.v, Layout<VK, D>::VROW, a.v_stride, a.kv_rows, a.Sk, a.B * a.Hkv, kKC)))
    throw std::runtime_error("Dot4Attention GPU: the driver refused the K / V tensor maps of a TMA plan");
  return dense_rows<VK, D>(a) ? mma_rows<VK, D, false>(pl, a, tm, s) : mma_rows<VK, D, true>(pl, a, tm, s);
}

template <int VK>
bool mma_vk(const GpuPlan& pl, const TileArgs& a, gpuStream_t s) {
  switch (a.D) {
    case 64: return mma_d<VK, 64>(pl, a, s);
    case 128: return mma_d<VK, 128>(pl, a, s);
    case 256: return mma_d<VK, 256>(pl, a, s);
    default: no_instance(pl);
  }
}
#endif

}  // namespace

bool run_decode(const GpuPlan& pl, const TileArgs& a, gpuStream_t s) {
  switch (pl.kernel) {
    case KernelKind::kTile:
      switch (a.vk) {
        case kVF32: tile_d<kVF32>(pl, a, s); break;
        case kVF16: tile_d<kVF16>(pl, a, s); break;
        case kVQ8: tile_d<kVQ8>(pl, a, s); break;
        default: tile_d<kVQ4>(pl, a, s); break;
      }
      return true;
    case KernelKind::kDecodeSimt:
      switch (a.vk) {
        case kVF32: simt_rb<kVF32>(pl, a, s); break;
        case kVF16: simt_rb<kVF16>(pl, a, s); break;
        case kVQ8: simt_rb<kVQ8>(pl, a, s); break;
        default: simt_rb<kVQ4>(pl, a, s); break;
      }
      return true;
#if defined(D4A_HAS_DECODE_MMA)
    case KernelKind::kDecodeMma:
      switch (a.vk) {
        case kVF16: return mma_vk<kVF16>(pl, a, s);
        case kVQ8: return mma_vk<kVQ8>(pl, a, s);
        case kVQ4: return mma_vk<kVQ4>(pl, a, s);
        default: no_instance(pl);
      }
#endif
    default: no_instance(pl);
  }
}

}  // namespace gpu
}  // namespace dot4attn
