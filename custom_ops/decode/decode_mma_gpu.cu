// The decode route's tensor-core decode-kernel instances (gpu/decode_mma.cuh: CUDA sm_80+, float16 T, D 64 / 128 /
// 256): every (V format, D, staging), cluster and not, dense and strided rows (bulk staging: strided quantized V only;
// q6_0: cp.async and bulk staging).
#include <cstring>
#include <stdexcept>

#include "decode/decode_instances.h"
#include "gpu/decode_mma.cuh"

#if defined(D4A_HAS_DECODE_MMA)
namespace dot4attn {
namespace gpu {

namespace {

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

// A non-cluster launch; a.pdl: as the programmatic dependent of the stream's previous kernel (the kernel waits for
// it before reading what it writes).
template <class Kernel>
void launch_mma(Kernel kern, const GpuPlan& pl, gpuStream_t s, const TileArgs& a, const TmaMaps& tm) {
  if (!a.pdl) return launch_planned(kern, pl, s, a, tm);
  launch_planned_dependent(kern, pl, s, a, tm);
}

// The plan's instance with dense (SR false) or strided (SR true) row addressing.
template <int VK, int D, bool SR>
bool mma_rows(const GpuPlan& pl, const TileArgs& a, const TmaMaps& tm, gpuStream_t s) {
  using namespace dmma;
  if constexpr (VK != kVQ6) {  // q6_0: cp.async or bulk staging only
    if (pl.staging == kStageTma) {
      launch_mma(decode_mma_kernel<VK, D, kStageTma, false, SR>, pl, s, a, tm);
      return true;
    }
  }
  if constexpr (SR && VK != kVF16) {
    if (pl.staging == kStageBulk) {
      launch_mma(decode_mma_kernel<VK, D, kStageBulk, false, true>, pl, s, a, tm);
      return true;
    }
  }
  constexpr int kAuto = auto_staging(VK, D);
  if constexpr (kAuto != kStageCpAsync) {
    if (pl.staging == kAuto) {
      launch_mma(decode_mma_kernel<VK, D, kAuto, false, SR>, pl, s, a, tm);
      return true;
    }
  }
  if (pl.staging != kStageCpAsync) no_instance(pl);
  if (pl.cluster) return launch_cluster(decode_mma_kernel<VK, D, kStageCpAsync, true, SR>, pl, a, tm, s);
  launch_mma(decode_mma_kernel<VK, D, kStageCpAsync, false, SR>, pl, s, a, tm);
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

}  // namespace

bool run_decode_mma(const GpuPlan& pl, const TileArgs& a, gpuStream_t s) {
  switch (a.vk) {
    case kVF16: return mma_vk<kVF16>(pl, a, s);
    case kVQ8: return mma_vk<kVQ8>(pl, a, s);
    case kVQ4: return mma_vk<kVQ4>(pl, a, s);
    case kVQ6: return mma_vk<kVQ6>(pl, a, s);
    default: no_instance(pl);
  }
}

}  // namespace gpu
}  // namespace dot4attn
#endif
