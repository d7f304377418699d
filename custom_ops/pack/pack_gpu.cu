// PackK / PackV on the GPU (CUDA or HIP through gpu/vendor.h): bit-for-bit the CPU contract (common/quantize.h).
// One group of 32 lanes per 32-element block, one lane per element: the block max by shuffles, then the
// same float32 division, round-half-even and clamp as the CPU. Grid-stride over blocks with 64-bit indices.
#include <type_traits>

#include "gpu/vendor.h"
#include "pack/pack_params.h"
#include "pack/v_block_gpu.cuh"

namespace dot4attn {
namespace {

// F: PackV's format (q8_0 also PackK's).
template <typename T, QFormat F>
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
    // NaN scale / 65504 saturation; q4_0 / q6_0: all 16 / 64 levels (s = fp16(v / -8) / fp16(v / -32), v the signed
    // max: pack/v_block_gpu.cuh)
    constexpr float kHalf = F == QFormat::kQ4_0 ? 8.f : 32.f;
    const uint16_t sh = F == QFormat::kQ8_0 ? gpu::block_scale_half(amax, 127.f, s)
                                            : gpu::signed_block_scale_half(v, amax, kHalf, s);
    float q = s == 0.f ? 0.f : rintf(gpu::div_rn(v, s));
    q = F == QFormat::kQ8_0 ? fminf(fmaxf(q, -127.f), 127.f) : fminf(fmaxf(q, -kHalf), kHalf - 1.f);
    if constexpr (F == QFormat::kQ4_0) {
      gpu::store_q4_block(payload + blk * 16, lane, int(q) + 8);
    } else if constexpr (F == QFormat::kQ6_0) {
      gpu::store_q6_block(payload + blk * 24, lane, int(q) + 32);
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
  auto launch = [&](auto* x) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(x)>>;
    auto* sc = p.scales;
    switch (p.format) {
      case QFormat::kQ4_0: return pack_kernel<T, QFormat::kQ4_0><<<grid, threads, 0, s>>>(x, nblocks, p.d, pay, sc);
      case QFormat::kQ6_0: return pack_kernel<T, QFormat::kQ6_0><<<grid, threads, 0, s>>>(x, nblocks, p.d, pay, sc);
      default: return pack_kernel<T, QFormat::kQ8_0><<<grid, threads, 0, s>>>(x, nblocks, p.d, pay, sc);
    }
  };
  if (p.x_is_f16) launch(static_cast<const uint16_t*>(p.x));
  else launch(static_cast<const float*>(p.x));
  D4A_GPU_CHECK(gpuGetLastError());
}

}  // namespace dot4attn
