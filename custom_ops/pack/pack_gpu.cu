// PackK / PackV on the GPU (CUDA or HIP through gpu/vendor.h): bit-for-bit the CPU contract (common/quantize.h).
// One group of 32 lanes per 32-element block, one lane per element: the block max by shuffles, then the
// same float32 division, round-half-even and clamp as the CPU. Grid-stride over blocks with 64-bit indices.
#include "gpu/vendor.h"
#include "pack/pack_params.h"
#include "pack/q4_scale_gpu.cuh"

namespace dot4attn {
namespace {

template <typename T, bool Q4>
__global__ void __launch_bounds__(256) pack_kernel(const T* __restrict__ x, int64_t nblocks, int d,
                                                   uint8_t* __restrict__ payload, uint16_t* __restrict__ scales) {
  const int lane = threadIdx.x & 31;
  const int64_t groups = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t blk = int64_t(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5); blk < nblocks; blk += groups) {
    // All lanes of a 32-group run the same iterations (blk is uniform in the group), so shuffles are safe.
    float v;
    if constexpr (sizeof(T) == 2) {
      v = gpu::h2f(reinterpret_cast<const uint16_t*>(x)[blk * 32 + lane]);
    } else {
      v = x[blk * 32 + lane];
    }
    const float amax = gpu::group32_max(gpu::abs_or_inf(v));  // +inf for a NaN / Inf block, like block_absmax
    float s;
    // NaN scale / 65504 saturation; q4_0: 16 levels (s = fp16(v / -8), v the signed max: pack/q4_scale_gpu.cuh)
    const uint16_t sh = Q4 ? gpu::q4_block_scale_half(v, amax, s) : gpu::block_scale_half(amax, 127.f, s);
    float q = s == 0.f ? 0.f : rintf(gpu::div_rn(v, s));
    q = fminf(fmaxf(q, Q4 ? -8.f : -127.f), Q4 ? 7.f : 127.f);
    if constexpr (Q4) {
      const int u = int(q) + 8;
      const int hi = gpu::shfl_xor(u, 1);
      if ((lane & 1) == 0) payload[blk * 16 + (lane >> 1)] = uint8_t(u | (hi << 4));
    } else {
      payload[blk * 32 + lane] = uint8_t(int8_t(int(q)));
    }
    if (lane == 0) scales[blk] = sh;
  }
  (void)d;
}

}  // namespace

void pack_gpu(const PackParams& p, void* stream) {
  const int64_t nblocks = p.rows * (p.d / 32);
  if (nblocks <= 0) return;
  const int threads = 256;
  const int64_t want = (nblocks + threads / 32 - 1) / (threads / 32);
  const unsigned grid = unsigned(want < 65536 ? want : 65536);
  auto s = static_cast<gpuStream_t>(stream);
  auto* pay = static_cast<uint8_t*>(p.payload);
  const bool q4 = p.format == QFormat::kQ4_0;
  if (p.x_is_f16) {
    auto* x = static_cast<const uint16_t*>(p.x);
    if (q4) pack_kernel<uint16_t, true><<<grid, threads, 0, s>>>(x, nblocks, p.d, pay, p.scales);
    else pack_kernel<uint16_t, false><<<grid, threads, 0, s>>>(x, nblocks, p.d, pay, p.scales);
  } else {
    auto* x = static_cast<const float*>(p.x);
    if (q4) pack_kernel<float, true><<<grid, threads, 0, s>>>(x, nblocks, p.d, pay, p.scales);
    else pack_kernel<float, false><<<grid, threads, 0, s>>>(x, nblocks, p.d, pay, p.scales);
  }
  D4A_GPU_CHECK(gpuGetLastError());
}

}  // namespace dot4attn
