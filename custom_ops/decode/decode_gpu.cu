// Dot4Attention decode route on the GPU (Sq <= 8), also split_k's stage 1 (a.n_splits > 1, partial outputs).
// Runs the tensor-core decode kernel (gpu/decode_mma.cuh: CUDA sm_80+, float16 T, D 64 / 128 / 256) or else the
// SIMT decode kernel (gpu/decode_kernel.cuh): one block per (batch, KV head, split) holding all
// g x Sq rows (chunks of 8 rows beyond 8, adjacent in launch order so they share K/V through L2), warps streaming
// their own key chunks. Configurations the decode kernel cannot take (misaligned pointers, no shared-memory fit)
// and DOT4ATTN_GPU_DECODE=tile run the tile kernel (gpu/attention_tile.cuh) as before.
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "gpu/attention_gpu_internal.h"
#include "gpu/decode_kernel.cuh"
#include "gpu/decode_mma.cuh"

namespace dot4attn {
namespace gpu {

namespace {

// ---- the tile-kernel path (fallback) ------------------------------------------------------------------------
template <int VK, int DMAX>
void launch_rb(const TileArgs& a, int rb, gpuStream_t s) {
  if (rb == 4) launch_tile<VK, DMAX, 4, 4, 3>(a, s);
  else if (rb == 8) launch_tile<VK, DMAX, 8, 8, 3>(a, s);
  else launch_tile<VK, DMAX, 16, 16, 3>(a, s);
}

template <int VK>
void launch_d(const TileArgs& a, int rb, gpuStream_t s) {
  if (a.D <= 64) launch_rb<VK, 64>(a, rb, s);
  else if (a.D <= 128) launch_rb<VK, 128>(a, rb, s);
  else launch_rb<VK, 256>(a, rb, s);
}

void launch_tile_path(const TileArgs& a0, gpuStream_t s) {
  TileArgs a = a0;
  const int64_t rows = a.g * a.Sq;
  const int rb = rows <= 4 ? 4 : rows <= 8 ? 8 : 16;
  a.n_chunks = (rows + rb - 1) / rb;
  a.reverse_chunks = 0;
  switch (a.vk) {
    case kVF32: launch_d<kVF32>(a, rb, s); break;
    case kVF16: launch_d<kVF16>(a, rb, s); break;
    case kVQ8: launch_d<kVQ8>(a, rb, s); break;
    default: launch_d<kVQ4>(a, rb, s); break;
  }
}

// ---- the decode-kernel path -----------------------------------------------------------------------------------
int warp_size() { return device_attribute(gpuDevAttrWarpSize, 32); }

// Launches the decode kernel for one (VK, D, RB); false when no configuration fits the shared memory.
template <int VK, int D, int RB>
bool launch_decode_cfg(TileArgs a, int ws, gpuStream_t s) {
  const int want = decode_warps_wanted(a, ws, kDecodeMaxThreads / ws);
  // Stages: 2 (a chunk in flight per warp while another is computed; 3 only cost occupancy), else 1.
  int nw = 0, nst = 0;
  auto bytes = [&](int w, int st) { return DecodeLayout(VK, D, RB, ws, w, st).total; };
  if (!pick_warps_stages(want, 2, max_shared_bytes(), bytes, nw, nst)) return false;
  a.nst = nst;
  launch_decode_grid(decode_kernel<VK, D, RB, kDecodeMaxStages>, a, nw * ws, bytes(nw, nst), s);
  return true;
}

template <int VK, int RB>
bool launch_decode_d(const TileArgs& a, int ws, gpuStream_t s) {
  switch (a.D) {
    case 32: return launch_decode_cfg<VK, 32, RB>(a, ws, s);
    case 64: return launch_decode_cfg<VK, 64, RB>(a, ws, s);
    case 96: return launch_decode_cfg<VK, 96, RB>(a, ws, s);
    case 128: return launch_decode_cfg<VK, 128, RB>(a, ws, s);
    case 160: return launch_decode_cfg<VK, 160, RB>(a, ws, s);
    case 192: return launch_decode_cfg<VK, 192, RB>(a, ws, s);
    case 224: return launch_decode_cfg<VK, 224, RB>(a, ws, s);
    case 256: return launch_decode_cfg<VK, 256, RB>(a, ws, s);
    default: return false;
  }
}

template <int VK>
bool launch_decode_rb(const TileArgs& a, int rb, int ws, gpuStream_t s) {
  if (rb == 1) return launch_decode_d<VK, 1>(a, ws, s);
  if (rb == 4) return launch_decode_d<VK, 4>(a, ws, s);
  return launch_decode_d<VK, 8>(a, ws, s);
}

bool launch_decode_kernel(const TileArgs& a0, gpuStream_t s) {
  if (decode_env().tile) return false;
  // cp.async wants 16-byte aligned K/V rows and 4-byte aligned scale runs (ORT's buffers always are).
  auto al = [](const void* p, uintptr_t n) { return (reinterpret_cast<uintptr_t>(p) & (n - 1)) == 0; };
  if (!al(a0.k, 16) || !al(a0.v, 16) || !al(a0.ks, 4) || (a0.vs != nullptr && !al(a0.vs, 4))) return false;
#if defined(D4A_HAS_DECODE_MMA)
  if (dmma::try_decode_mma(a0, s)) return true;  // tensor cores: sm_80+, float16 T, D 64 / 128 / 256
#endif
  const int ws = warp_size();
  if (ws != 32 && ws != 64) return false;
  TileArgs a = a0;
  const int64_t rows = a.g * a.Sq;
  const int rb = rows == 1 ? 1 : rows <= 4 ? 4 : 8;
  a.n_chunks = (rows + rb - 1) / rb;
  a.reverse_chunks = 0;
  switch (a.vk) {
    case kVF32: return launch_decode_rb<kVF32>(a, rb, ws, s);
    case kVF16: return launch_decode_rb<kVF16>(a, rb, ws, s);
    case kVQ8: return launch_decode_rb<kVQ8>(a, rb, ws, s);
    default: return launch_decode_rb<kVQ4>(a, rb, ws, s);
  }
}

}  // namespace

void launch_decode_tiles(const TileArgs& a, gpuStream_t s) {
  if (!launch_decode_kernel(a, s)) launch_tile_path(a, s);
}

void run_decode(const AttentionParams& p, gpuStream_t s) {
  TileArgs a = make_tile_args(p);
  launch_decode_tiles(a, s);
}

}  // namespace gpu
}  // namespace dot4attn
