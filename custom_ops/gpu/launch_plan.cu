// The GPU planner (launch_plan.h): one pure function per route maps a call and the device's facts to the kernel and
// its configuration. Nothing here touches the GPU; the route files execute what it decides.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/fail.h"
#include "gpu/attention_tile.cuh"
#include "gpu/decode_kernel.cuh"
#include "gpu/decode_mma.cuh"
#include "gpu/launch_plan.h"
#include "gpu/prefill_mma.cuh"
#include "gpu/prefill_wg.cuh"
#include "gpu/prefill_ws.cuh"

namespace dot4attn {
namespace gpu {

namespace {

constexpr const char* kOp = "Dot4Attention GPU plan";
constexpr int64_t kMaxBlocks = 0x7fffffffLL;

bool aligned(const void* p, uintptr_t n) { return (reinterpret_cast<uintptr_t>(p) & (n - 1)) == 0; }

int vkind(const AttentionParams& p) {
  return p.v_format == VFormat::kQ8_0   ? kVQ8
         : p.v_format == VFormat::kQ4_0 ? kVQ4
         : p.v_format == VFormat::kQ6_0 ? kVQ6
         : p.half                       ? kVF16
                                        : kVF32;
}

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A planner step that does not take the call: records why, for the plan's fallback reason.
bool refuse(std::string& why, std::string reason) {
  why = std::move(reason);
  return false;
}

// The keys one block walks: a split, or every key.
int64_t block_keys(const GpuPlan& pl, const AttentionParams& p) {
  return pl.split_len > 0 && pl.split_len < p.Sk ? pl.split_len : p.Sk;
}

// The first (warps, stages) whose block fits `limit` bytes of shared memory, stages from st_first down to 1 (a
// forced count is kept, up to kDecodeMaxStages), warps from `want` down to 1; false when none fits.
template <class Bytes>
bool pick_warps_stages(int want, int st_first, int forced_stages, int limit, Bytes bytes, int& nw, int& nst) {
  for (int st = st_first; st >= 1; --st) {
    const int use = forced_stages > 0 ? std::min(forced_stages, kDecodeMaxStages) : st;
    for (int w = want; w >= 1; --w)
      if (bytes(w, use) <= limit) {
        nw = w;
        nst = use;
        return true;
      }
  }
  return false;
}

// Warps wanted in a decode block: no more than its key chunks (chunk = ws keys) nor max_warps; split_k's many
// short-lived blocks take at most 128 threads (more blocks per multiprocessor), the decode route's few blocks up to
// max_warps; a forced count wins.
int decode_warps_wanted(int64_t keys, bool split, int ws, int max_warps, int forced) {
  const int64_t chunks = cdiv(keys, ws);
  const int cap = split && 128 / ws < max_warps ? 128 / ws : max_warps;
  const int want = int(std::min<int64_t>(chunks, cap));
  return forced > 0 && forced <= max_warps ? forced : std::max(want, 1);
}

// The plan's grid: one block per (causal row tile, grouped head, batch, KV head), or per (row chunk, split, batch,
// KV head).
int64_t block_count(const GpuPlan& pl, const AttentionParams& p) {
  return pl.causal_tiles > 0 ? p.B * p.Hkv * p.group() * pl.causal_tiles : pl.n_chunks * pl.n_splits * p.B * p.Hkv;
}

void set_blocks(GpuPlan& pl, const AttentionParams& p) {
  pl.blocks = block_count(pl, p);
  if (pl.blocks > kMaxBlocks)
    fail(kOp, "the ", kernel_name(pl.kernel), " kernel would need ", pl.blocks, " blocks (more than 2^31 - 1) for B=",
         p.B, ", Hkv=", p.Hkv, ", Sq=", p.Sq);
}

#if defined(D4A_CUDA)
// Whether the K rows and the V rows (vrow bytes) fit tensor maps (tma.cuh): the TMA staging / tiles of the
// tensor-core kernels. Null pointers count as aligned (plans without pointers).
bool tma_kv_ok(const AttentionParams& p, int vrow) {
  const int64_t heads = p.B * p.Hkv;
  return tma_rows_ok(p.k, p.D, p.k_row(), p.head_rows(), p.Sk, heads) &&
         tma_rows_ok(p.v, vrow, v_stride_bytes(p), p.head_rows(), p.Sk, heads);
}
// K or V rows further apart than their width (a packed cache's padded rows).
bool padded_rows(const AttentionParams& p) { return p.k_row() != p.D || p.v_row() != p.v_dense_row(); }
constexpr const char* kTmaRows = "K / V rows do not fit a TMA tensor map (16-byte strides, heads < 2^40 bytes apart)";
#endif

// ---- the tile kernel (every route's fallback) ----------------------------------------------------------------------
// The tile kernel's block shapes (the instances of prefill_gpu.cu and decode_tile_gpu.cu), in order of preference:
// 64-key tiles with the route's row tile (prefill 64 rows, decode 4 / 8 / 16 as the rows need), else, where no stage
// count of that block fits the device's shared memory (AMD's 64 KB LDS: the 64-row prefill block takes 73,984 bytes
// at D = 64 and one stage, 120,576 at D = 256), 32-key tiles, which halve the K / V stages and the logit and
// probability buffers: prefill 64 rows at D <= 128, 32 rows at D = 256 (its 64-row float32 accumulators alone take
// 64 KB); decode 16 rows at D > 128 (at D <= 128 every decode row tile fits 64 KB with 64-key tiles). Each fits 64 KB
// for every V format, float32 V included, with one stage. The most stages that fit, up to the instances' depth; one
// on HIP (hip_stages).
struct TileShape {
  int rb, rpt, kt;
};

// HIP has no cp.async (vendor.h: a plain copy, which waits for its loads), so a second stage overlaps nothing there and
// only takes LDS that more waves could use: HIP plans take one stage unless forced.
int hip_stages(const DeviceFacts& dev, int stages) { return dev.hip ? 1 : stages; }

bool fit_tile(GpuPlan& pl, const AttentionParams& p, const DeviceFacts& dev, const PlanOverrides& ov, TileShape t,
              int max_st) {
  pl.rows_per_block = t.rb;
  pl.rows_per_thread = t.rpt;
  pl.key_tile = t.kt;
  pl.stages = ov.stages > 0 ? std::min(ov.stages, max_st) : hip_stages(dev, max_st);
  while (pl.stages > 1 && SmemLayout(pl.vk, p.D, t.rb, t.rpt, pl.stages, t.kt).total > dev.max_smem) --pl.stages;
  pl.smem_bytes = SmemLayout(pl.vk, p.D, t.rb, t.rpt, pl.stages, t.kt).total;
  return pl.smem_bytes <= dev.max_smem;
}

GpuPlan plan_tile(GpuPlan pl, const AttentionParams& p, const DeviceFacts& dev, const PlanOverrides& ov) {
  pl.kernel = KernelKind::kTile;
  const int64_t rows = p.group() * p.Sq;
  const bool prefill = pl.route == Route::kPrefill;
  const int max_st = prefill ? 2 : 3;  // the instances' pipeline depth (decode_tile_gpu.cu, prefill_gpu.cu)
  const int rb = prefill ? 64 : rows <= 4 ? 4 : rows <= 8 ? 8 : 16;
  const TileShape wide{rb, prefill ? 16 : rb, kTileKeys};
  const TileShape narrow = prefill ? TileShape{p.D <= 128 ? 64 : 32, 16, 32} : TileShape{16, 16, 32};
  const bool has_narrow = prefill || p.D > 128;
  if (!fit_tile(pl, p, dev, ov, wide, max_st) && (!has_narrow || !fit_tile(pl, p, dev, ov, narrow, max_st)))
    fail(kOp, "the tile kernel for D=", p.D, " needs ", pl.smem_bytes, " bytes of shared memory (", pl.rows_per_block,
         " rows, ", pl.key_tile, "-key tiles, one stage), the device has ", dev.max_smem);
  pl.n_chunks = cdiv(rows, pl.rows_per_block);
  pl.reverse_chunks = prefill && p.causal ? 1 : 0;
  pl.causal_tiles = 0;
  pl.threads = kThreads;
  pl.warps = kThreads / (dev.run_warp > 0 ? dev.run_warp : dev.warp_size);
  set_blocks(pl, p);
  return pl;
}

// ---- the SIMT decode kernel (decode route and split_k stage 1) -----------------------------------------------------
bool plan_decode_simt(GpuPlan& pl, const AttentionParams& p, const DeviceFacts& dev, const PlanOverrides& ov,
                      std::string& why) {
  const int ws = dev.warp_size;
  if (ws != 32 && ws != 64) return refuse(why, "SIMT decode: warp size " + std::to_string(ws));
  const int64_t rows = p.group() * p.Sq;
  const int rb = rows == 1 ? 1 : rows <= 4 ? 4 : 8;
  const bool split = pl.route == Route::kSplitK;
  const int want = decode_warps_wanted(block_keys(pl, p), split, ws, kDecodeMaxThreads / ws, ov.warps);
  // 2 stages: a chunk in flight per warp while another is computed (3 only cost occupancy); 1 on HIP (hip_stages)
  auto bytes = [&](int w, int st) { return DecodeLayout(pl.vk, p.D, rb, ws, w, st).total; };
  int nw = 0, nst = 0;
  if (!pick_warps_stages(want, hip_stages(dev, 2), ov.stages, dev.max_smem, bytes, nw, nst))
    return refuse(why, "SIMT decode: no block fits the shared memory");
  pl.kernel = KernelKind::kDecodeSimt;
  pl.rows_per_block = rb;
  pl.n_chunks = cdiv(rows, rb);
  pl.warps = nw;
  pl.stages = nst;
  pl.threads = nw * ws;
  pl.smem_bytes = bytes(nw, nst);
  // Run by warps of another width (a CUDA GPU running a wave64 device's plan, DeviceFacts::run_warp): the same
  // threads, rows, stages and splits; the kernel's key chunk is its warp, so the block holds threads / run_warp warps
  // of run_warp-key chunks, and its shared memory is laid out for them.
  const int rw = dev.run_warp > 0 ? dev.run_warp : ws;
  if (rw != ws) {
    pl.warps = pl.threads / rw;
    pl.smem_bytes = DecodeLayout(pl.vk, p.D, rb, rw, pl.warps, nst).total;
  }
  set_blocks(pl, p);
  return true;
}

// ---- the tensor-core decode kernel (CUDA sm_80+, float16 T, D 64 / 128 / 256) -------------------------------------
#if defined(D4A_HAS_DECODE_MMA)
// The decode route's cluster size on sm_90: when its (row chunk, batch, KV head) blocks leave most multiprocessors
// idle (short contexts, small batches), the keys split over up to 8 blocks of a cluster (about 4 key chunks each, so
// one or two per warp) and the blocks merge through distributed shared memory: no scratch, no second kernel.
int decode_cluster(const AttentionParams& p, const DeviceFacts& dev, const PlanOverrides& ov, int64_t n_chunks) {
  if (dev.cc_major < 9) return 1;
  const int64_t chunks = cdiv(p.Sk, dmma::kKC);
  const int64_t base = n_chunks * p.B * p.Hkv;
  int64_t cs = ov.cluster > 0 ? ov.cluster : std::min<int64_t>(dev.sms / std::max<int64_t>(1, base), (chunks + 3) / 4);
  cs = std::min<int64_t>(std::min<int64_t>(cs, dmma::kMaxCluster), chunks);
  return cs < 2 || base * cs > int64_t(dev.sms) * 2 ? 1 : int(cs);
}

// Whether strided K / V rows are a packed cache's rows [payload | scales | padding] D + 16 and VROW + 16 bytes
// apart (the tensor-core decode's padded stage layout; kStageBulk copies them as they are). Null pointers (a plan
// made without them) take the strides' word.
template <int VK, int D>
bool rows_carry_scales(const AttentionParams& p) {
  constexpr int kRow = dmma::Layout<VK, D>::VROW;
  const auto at = [](const void* base, const void* scales, int off) {
    return base == nullptr || scales == nullptr || static_cast<const uint8_t*>(base) + off == scales;
  };
  return v_quantized(VK) && p.k_row() == D + 16 && 2 * p.ks_row() == p.k_row() &&
         p.v_row() == kRow + 16 && 2 * p.vs_row() == p.v_row() && at(p.k, p.k_scales, D) &&
         at(p.v, p.v_scales, kRow);
}

// The block's shared-memory bytes (warps, stages) -> bytes of a staging mode's layout (decode_mma.cuh Layout).
template <int VK, int D>
constexpr int (*stage_bytes(int mode))(int, int) {
  return mode == kStageTma    ? dmma::Layout<VK, D, true>::total
         : mode == kStageBulk ? dmma::Layout<VK, D, false, true>::total
                              : dmma::Layout<VK, D>::total;
}

template <int VK, int D>
bool plan_mma_cfg(GpuPlan& pl, const AttentionParams& p, const DeviceFacts& dev, const PlanOverrides& ov) {
  using namespace dmma;
  const bool split = pl.route == Route::kSplitK;
  int want = decode_warps_wanted(block_keys(pl, p), split, kKC, kMaxThreads / 32, ov.warps);
  // Staging (walks of >= 3 chunks per warp; shorter walks gain nothing from either): TMA on sm_90 for D = 128 / 256
  // (q4_0 at D = 256 in 3-warp blocks, below); elsewhere q4_0 stages in registers, q8_0 at D = 128 its V, the rest
  // uses cp.async.
  const int64_t chunks = cdiv(block_keys(pl, p), kKC);
  constexpr int kAuto = auto_staging(VK, D);
  constexpr bool kTmaOk = VK != kVQ6;  // q6_0: cp.async or bulk staging (decode_mma.cuh)
  constexpr bool kTmaAuto = kTmaOk && D >= 128 && !(VK == kVQ4 && D == 256);
  const bool tma_dev = dev.cc_major >= 9 && dev.tma;
  // q4_0 at D = 256, split walks of >= 3 chunks per warp: TMA in 3-warp blocks (two stages, 90 KB: two blocks per
  // multiprocessor), where a 4-warp TMA block (118 KB) fits once; faster than 4-warp register staging on dense and
  // packed-cache rows alike, so both keep one summation order (H200 timings: docs/performance.md). Registers in
  // 3-warp blocks are slower, so without a tensor map the 4-warp plan stays; q8_0 at D = 256 is slower in 3 warps.
  const bool tma3 = VK == kVQ4 && D == 256 && split && tma_dev && ov.warps == 0 && ov.staging < 0 &&
                    cdiv(chunks, 3) >= 3 && tma_kv_ok(p, Layout<VK, D>::VROW);
  if (tma3) want = 3;
  const int64_t walk = cdiv(chunks, want);  // chunks per warp (at least)
  int mode = walk < 3 ? kStageCpAsync : (kTmaAuto || tma3) && tma_dev ? kStageTma : kAuto;
  if (ov.staging >= 0)
    mode = ov.staging == kAuto || ov.staging == kStageTma || ov.staging == kStageBulk ? ov.staging : kStageCpAsync;
  if (!kTmaOk && (ov.staging == kStageRegs || ov.staging == kStageRegsV))
    pl.fallback = std::string("tensor-core decode: q6_0 V has no ") + staging_name(ov.staging) + " staging, cp_async "
                  "staging";
  if (mode == kStageTma && !kTmaOk) {
    pl.fallback = "tensor-core decode: q6_0 V has no TMA staging, cp_async staging";
    mode = kStageCpAsync;
  }
  const bool bulk_rows = dev.cc_major >= 9 && rows_carry_scales<VK, D>(p);  // kStageBulk can take them
  if (mode == kStageBulk && !bulk_rows) {
    pl.fallback = std::string("tensor-core decode: bulk staging needs sm_90 and a packed cache's rows (quantized V, "
                              "scales in the rows), ") + staging_name(kAuto) + " staging";
    mode = kAuto;
  }
  // float16 V's long split walks take 8 warps: one block per multiprocessor instead of two, each warp walking half
  // as far.
  if (mode == kStageTma && VK == kVF16 && split && walk >= 24 && ov.warps == 0)
    want = int(std::min<int64_t>(chunks, kMaxThreads / 32));
  if (pl.cluster && mode != kStageCpAsync) return false;  // clusters take cp.async only (short walks)
  if (mode == kStageTma && !(tma_dev && tma_kv_ok(p, Layout<VK, D>::VROW))) {  // the best staging without TMA
    if (tma_dev) pl.fallback = std::string("tensor-core decode: ") + kTmaRows + ", " + staging_name(kAuto) + " staging";
    mode = kAuto;
  }
  // split_k: splits of equal chunk counts (one chunk apart at most) instead of split_len's multiples of 64 keys,
  // where the last split is short and the others longer than they need be
  pl.split_chunks = split && !pl.cluster ? cdiv(p.Sk, kKC) : 0;
  // full register staging needs one shared stage; one chunk per warp needs only its own in flight
  const int st_first = mode == kStageRegs ? 1 : split || walk <= 1 ? 2 : 3;
  int nw = 0, nst = 0;
  if (!pick_warps_stages(want, st_first, ov.stages, dev.max_smem, stage_bytes<VK, D>(mode), nw, nst)) return false;
  // Padded rows (a packed cache: row strides above the row widths) stream slower by TMA, whose 32-row boxes then
  // read rows that start off the 128-byte lines, than by the register staging (docs/performance.md).
  // q8_0 / q4_0 V take their staging without TMA where it fits the same warps, so the output keeps the dense plan's
  // bits (warps and splits fix the summation order; staging and stages do not). float16 V keeps TMA: its long walks
  // take 8 warps there. D = 256 keeps TMA too: its 272-byte rows stream no slower by TMA than by cp.async.
  if (mode == kStageTma && ov.staging != kStageTma && VK != kVF16 && D <= 128 && padded_rows(p)) {
    int nw2 = 0, nst2 = 0;
    const int st2 = kAuto == kStageRegs ? 1 : split || walk <= 1 ? 2 : 3;
    if (pick_warps_stages(nw, st2, ov.stages, dev.max_smem, stage_bytes<VK, D>(kAuto), nw2, nst2) && nw2 == nw) {
      pl.fallback = std::string("tensor-core decode: padded K / V rows, ") + staging_name(kAuto) + " staging (faster " +
                    "than TMA there)";
      mode = kAuto;
      nst = nst2;
    }
  }
  // A packed cache's rows on sm_90 (scales in the rows, D + 16 / VROW + 16 bytes apart): bulk copies, where they fit
  // the same warps (so the dense plan's bits); faster than the staging above for q8_0 and for short walks
  // (docs/performance.md). Not q4_0's long walks, which keep their registers: alone the bulk kernel is as fast or
  // faster, but inside the 7B model, launched after the prologue as its programmatic dependent, register staging
  // is faster; at D = 256 a two-stage bulk block (126 KB) also leaves one block per multiprocessor.
  if (ov.staging < 0 && bulk_rows && !pl.cluster && !(VK == kVQ4 && walk >= 3)) {
    int nw2 = 0, nst2 = 0;
    if (pick_warps_stages(nw, 2, ov.stages, dev.max_smem, stage_bytes<VK, D>(kStageBulk), nw2, nst2) && nw2 == nw) {
      mode = kStageBulk;
      nst = nst2;
      pl.fallback.clear();
    }
  }
  pl.kernel = KernelKind::kDecodeMma;
  pl.staging = mode;
  pl.warps = nw;
  pl.stages = nst;
  pl.threads = nw * 32;
  pl.smem_bytes = stage_bytes<VK, D>(mode)(nw, nst);
  return true;
}

template <int VK, int D>
bool plan_mma_d(GpuPlan& pl, const AttentionParams& p, const DeviceFacts& dev, const PlanOverrides& ov) {
  const int cs = pl.route == Route::kDecode ? decode_cluster(p, dev, ov, pl.n_chunks) : 1;
  if (cs > 1) {
    GpuPlan c = pl;
    const int64_t chunks = cdiv(p.Sk, dmma::kKC);
    c.split_len = cdiv(chunks, cs) * dmma::kKC;
    c.n_splits = cdiv(p.Sk, c.split_len);
    c.cluster = int(c.n_splits);
    if (c.n_splits > 1 && plan_mma_cfg<VK, D>(c, p, dev, ov)) {
      pl = c;
      return true;
    }
  }
  pl.cluster = 0;
  return plan_mma_cfg<VK, D>(pl, p, dev, ov);
}

template <int VK>
bool plan_mma_vk(GpuPlan& pl, const AttentionParams& p, const DeviceFacts& dev, const PlanOverrides& ov) {
  switch (p.D) {
    case 64: return plan_mma_d<VK, 64>(pl, p, dev, ov);
    case 128: return plan_mma_d<VK, 128>(pl, p, dev, ov);
    default: return plan_mma_d<VK, 256>(pl, p, dev, ov);
  }
}
#endif

bool plan_decode_mma(GpuPlan& pl, const AttentionParams& p, const DeviceFacts& dev, const PlanOverrides& ov,
                     std::string& why) {
#if defined(D4A_HAS_DECODE_MMA)
  // Scale rows move as one 2 NB-byte cp.async (or load) per key, so every row must start 2 NB-byte aligned: the
  // pointers and the row strides (a strided cache's rows are 16-byte multiples); Q rows are read as vectors of up to
  // 16 bytes per lane.
  const uintptr_t sal = uintptr_t(p.D / 32 * 2);
  if (dev.hip || dev.cc_major < 8) return refuse(why, "tensor-core decode: needs CUDA sm_80+");
  if (!p.half) return refuse(why, "tensor-core decode: float32 T keeps the SIMT kernel's float32 P.V");
  if (p.D != 64 && p.D != 128 && p.D != 256) return refuse(why, "tensor-core decode: D is not 64, 128 or 256");
  if (!aligned(p.k_scales, sal) || !aligned(p.v_scales, sal) || !aligned(p.q, 16))
    return refuse(why, "tensor-core decode: scale rows or the query not aligned");
  if ((p.ks_row() * 2) % int64_t(sal) != 0 || (p.v_format != VFormat::kFloat && (p.vs_row() * 2) % int64_t(sal) != 0))
    return refuse(why, "tensor-core decode: scale row strides not multiples of " + std::to_string(sal) + " bytes");
  pl.rows_per_block = dmma::kRB;
  pl.n_chunks = cdiv(p.group() * p.Sq, dmma::kRB);
  const bool ok = pl.vk == kVF16 ? plan_mma_vk<kVF16>(pl, p, dev, ov)
                : pl.vk == kVQ8  ? plan_mma_vk<kVQ8>(pl, p, dev, ov)
                : pl.vk == kVQ6  ? plan_mma_vk<kVQ6>(pl, p, dev, ov)
                                 : plan_mma_vk<kVQ4>(pl, p, dev, ov);
  if (!ok) return refuse(why, "tensor-core decode: no block fits the shared memory");
  set_blocks(pl, p);
  return true;
#else
  (void)pl; (void)p; (void)dev; (void)ov;
  why = "tensor-core decode: not in this build (CUDA only)";
  return false;
#endif
}

// Decode and split_k stage 1: the tensor-core kernel, else the SIMT kernel, else the tile kernel.
GpuPlan plan_decode(GpuPlan pl, const AttentionParams& p, const DeviceFacts& dev, const PlanOverrides& ov) {
  const int forced = ov.kernel;  // "mma" parses as kDecodeMma: the route's tensor-core kernel
  if (forced == int(KernelKind::kTile)) {
    pl.fallback = "forced";
    return plan_tile(pl, p, dev, ov);
  }
  // cp.async wants 16-byte aligned K / V rows and 4-byte aligned scale runs (ORT's buffers always are)
  std::string why;
  if (!aligned(p.k, 16) || !aligned(p.v, 16) || !aligned(p.k_scales, 4) || !aligned(p.v_scales, 4)) {
    why = "decode kernels: K / V rows not 16-byte or scales not 4-byte aligned";
  } else {
    GpuPlan m = pl;
    if (forced != int(KernelKind::kDecodeSimt) && plan_decode_mma(m, p, dev, ov, why)) return m;
    if (forced == int(KernelKind::kDecodeMma)) fail(kOp, "override kernel=mma cannot run this call: ", why);
    GpuPlan s = pl;
    std::string why_simt;
    if (plan_decode_simt(s, p, dev, ov, why_simt)) {
      s.fallback = forced >= 0 ? "forced" : why;
      return s;
    }
    why += why.empty() ? why_simt : "; " + why_simt;
  }
  if (forced >= 0) fail(kOp, "override kernel=", kernel_name(KernelKind(forced)), " cannot run this call: ", why);
  pl.fallback = why;
  return plan_tile(pl, p, dev, ov);
}

// ---- the tensor-core prefill (CUDA sm_80+, float16 T, D 64 / 128 / 256) --------------------------------------------
#if defined(D4A_HAS_PREFILL_MMA)
// The row chunks of a prefill of `rows` rows per block: with causal masking and Sq a multiple of them, position-major
// tiles (the heaviest chunk of every head first); else chunks of the row space, in reverse under causal masking.
void set_row_chunks(GpuPlan& pl, const AttentionParams& p, int rows) {
  pl.rows_per_block = rows;
  if (p.causal && p.Sq % rows == 0) {
    pl.causal_tiles = p.Sq / rows;
    pl.n_chunks = 1;
    pl.reverse_chunks = 0;
  } else {
    pl.causal_tiles = 0;
    pl.n_chunks = cdiv(p.group() * p.Sq, rows);
    pl.reverse_chunks = p.causal ? 1 : 0;
  }
}

// Whether a float16-V wgmma prefill scans V once per call for NaN / Inf (v_scan.cuh) instead of checking it once per
// tile and block: where every V tile is read by `reads` >= 8 blocks and the keys are enough for the scan and the
// second launch (the flagged heads', its other blocks returning at once) to cost less than the check's 6-8 %
// (v_scan=1: always).
bool v_scan_wanted(const AttentionParams& p, const PlanOverrides& ov, int64_t reads) {
  return ov.v_scan == 1 || (ov.v_scan != 0 && reads >= 8 && p.Sk >= 2048);
}

// Whether the float16 V rows a Q-in-shared-memory kernel (prefill_wg.cuh, prefill_ws.cuh) copies by tensor maps fit
// one: V's own rows, or its float16 copy (dense, always fits).
bool f16_v_maps_ok(const GpuPlan& pl, const AttentionParams& p) {
  return pl.v_dequant || tma_rows_ok(p.v, 2 * p.D, v_stride_bytes(p), p.head_rows(), p.Sk, p.B * p.Hkv);
}

// Scratch bytes of a float16 copy of K or V: rows in the K layout (kv_rows per (batch, KV head), so a cache's copy
// is its length), 256-byte rounded.
size_t f16_copy_bytes(const AttentionParams& p) {
  return (size_t(p.B * p.Hkv) * size_t(p.head_rows()) * size_t(p.D) * 2 + 255) / 256 * 256;
}

// The plan takes K's float16 copy (k_dequant.cuh) of `bytes`: then one flag and one run counter per (batch, KV head),
// after the V copy.
void take_k_copy(GpuPlan& pl, const AttentionParams& p, size_t bytes) {
  pl.k_dequant = true;
  pl.k_dequant_bytes = bytes;
  pl.k_flag_bytes = (2 * size_t(p.B * p.Hkv) * sizeof(int) + 255) / 256 * 256;
  pl.scratch_bytes += bytes + pl.k_flag_bytes;
}

template <int VK, int D, int MT, int MINB>
bool plan_prefill_inst(GpuPlan& pl, const AttentionParams& p, const DeviceFacts& dev, const PlanOverrides& ov,
                       bool wgmma_wanted, std::string& why) {
  using Tr = pmma::Traits<VK, D, MT>;
  // The kernel's key indices are int (and the tensor copies' key coordinates int32).
  if (p.Sk > 0x7fffffffLL - pmma::kKeys) return refuse(why, "tensor-core prefill: Sk >= 2^31 - 64");
  const int limit = dev.max_smem;
  pl.m_tiles = MT;
  pl.min_blocks = MINB;
  pl.tma = pl.wgmma = false;
  if constexpr (Tr::kPipe) {  // fixed layout: 2-slot K ring, one barrier per tile
    pl.stages = 2;
    pl.smem_bytes = Tr::pipe_bytes;
    // sm_90: K / V tiles by tensor copies, when both caches fit the TMA's rules
    const bool tma_wanted = MINB >= 2 && ov.tma != 0 && Tr::tma_bytes <= limit && dev.cc_major >= 9 && dev.tma &&
                            p.B * p.Hkv <= 0x7fffffffLL;
    if (tma_wanted && tma_kv_ok(p, Tr::VROW)) {
      pl.tma = true;
      pl.wgmma = Tr::kWgmma && wgmma_wanted;
      pl.smem_bytes = Tr::tma_bytes;
    } else if (tma_wanted) {
      pl.fallback = std::string("tensor-core prefill: ") + kTmaRows + ", cp.async tiles";
    }
  } else {
    // 2 stages, or 1 where 2 would leave a single block per SM (D = 256 with f16 V)
    int nst = ov.stages > 0 ? ov.stages : Tr::smem_bytes(2) + 1024 > limit / 2 ? 1 : 2;
    nst = std::clamp(nst, 1, 3);
    while (nst > 1 && Tr::smem_bytes(nst) > limit) --nst;
    pl.stages = nst;
    pl.smem_bytes = Tr::smem_bytes(nst);
  }
  if (pl.smem_bytes > limit) return refuse(why, "tensor-core prefill: no block fits the shared memory");
  set_row_chunks(pl, p, Tr::kRows);
  pl.threads = pmma::kThreads;
  pl.warps = pmma::kWarps;
  if (block_count(pl, p) > kMaxBlocks) return refuse(why, "tensor-core prefill: more than 2^31 - 1 blocks");
  pl.kernel = KernelKind::kPrefillMma;
  set_blocks(pl, p);
  // float16 V on the wgmma path (3 blocks per SM): the V check once per call where v_scan_wanted
  pl.v_scan = false;
  if constexpr (VK == kVF16 && MINB == 3) {
    if (!pl.wgmma || p.B * p.Hkv == 0) return true;
    pl.v_scan = v_scan_wanted(p, ov, pl.blocks / (p.B * p.Hkv));  // blocks reading each V tile of a (batch, KV head)
    if (pl.v_scan) pl.scratch_bytes = size_t(p.B * p.Hkv) * sizeof(int);
  }
  return true;
}

template <int VK>
bool plan_prefill_vk(GpuPlan& pl, const AttentionParams& p, const DeviceFacts& dev, const PlanOverrides& ov,
                     std::string& why) {
  // m tiles per warp 1 / 2 (D <= 128); 2 blocks per SM (up to 255 registers) or 3 (168 registers, MT = 1). With the
  // mma.sync P.V, 168 registers make ptxas spill and keep one ldmatrix fragment set, so 3 blocks are slower; the
  // wgmma P.V (D <= 128, sm_90a, TMA tiles) holds no V fragments and is fastest with 3.
  const int mt = ov.m_tiles == 2 ? 2 : 1;
  const bool wg_wanted = ov.wgmma != 0 && dev.cc_major == 9 && dev.wgmma;
  const bool wg = (p.D == 64 || p.D == 128) && ov.tma != 0 && wg_wanted && tma_kv_ok(p, v_row_bytes(VK, p.D));
  const bool cap = (ov.min_blocks > 0 ? ov.min_blocks : wg ? 3 : 2) >= 3;
  switch (p.D) {
    case 64:
      return mt == 2 ? plan_prefill_inst<VK, 64, 2, 1>(pl, p, dev, ov, wg_wanted, why)
             : cap   ? plan_prefill_inst<VK, 64, 1, 3>(pl, p, dev, ov, wg_wanted, why)
                     : plan_prefill_inst<VK, 64, 1, 2>(pl, p, dev, ov, wg_wanted, why);
    case 128:
      return mt == 2 ? plan_prefill_inst<VK, 128, 2, 1>(pl, p, dev, ov, wg_wanted, why)
             : cap   ? plan_prefill_inst<VK, 128, 1, 3>(pl, p, dev, ov, wg_wanted, why)
                     : plan_prefill_inst<VK, 128, 1, 2>(pl, p, dev, ov, wg_wanted, why);
    default: return plan_prefill_inst<VK, 256, 1, 1>(pl, p, dev, ov, wg_wanted, why);
  }
}
#endif

#if defined(D4A_HAS_PREFILL_MMA)
// The Q.K on f16 wgmma at D = 256 (prefill_wg.cuh: Q in shared memory, its own kernel): the device and call facts it
// needs, the K and V rows aside (sm_90a with the wgmma instances and tensor maps, float16 T, a positive finite scale,
// at most 2^31 - 1 (batch, KV head)s for the tensor copies' head coordinate; k_dequant, tma and wgmma not off).
bool qk16_wide_device(const AttentionParams& p, const DeviceFacts& dev, const PlanOverrides& ov) {
  return p.D == 256 && p.half && ov.k_dequant != 0 && ov.tma != 0 && ov.wgmma != 0 && dev.cc_major == 9 &&
         dev.wgmma && dev.tma && p.scale > 0.f && std::isfinite(p.scale) && p.B * p.Hkv > 0 &&
         p.B * p.Hkv <= 0x7fffffffLL && pwg::Layout<256, 1>::bytes <= dev.max_smem;
}
#endif

#if defined(D4A_HAS_PREFILL_MMA)
// q8_0 / q4_0 V on the wgmma path: every block converts each V tile it reads into float16 in shared memory, and a
// V tile of a long causal prefill is read by hundreds of blocks; converting V once into a float16 copy (one pass over
// it, v_dequant.cuh) and running the float16-V instance gives the same values (the same conversion) at float16 V's
// speed. Taken where that instance is the wgmma one, each V tile is read by 8 blocks or more over 2048+ keys, and the
// copy fits kMaxDequantBytes (rows in the K layout: kv_rows per (batch, KV head), so a cache's copy is its length).
// q6_0 V has no instance of its own in this kernel: it always runs on the copy (any instance, any length), which
// may then take up to kMaxDequantBytesQ6.
bool plan_v_dequant(GpuPlan& pl, const AttentionParams& p, const DeviceFacts& dev, const PlanOverrides& ov) {
  if (ov.v_dequant == 0 || pl.vk == kVF16 || p.B * p.Hkv == 0) return false;
  const bool q6 = pl.vk == kVQ6;
  AttentionParams f = p;  // V as the float16 copy: dense rows of D halves, 256-byte aligned scratch
  f.v_format = VFormat::kFloat;
  f.v = nullptr;
  f.v_scales = nullptr;
  f.kv_rows = p.head_rows();
  f.v_stride = p.D;
  f.vs_stride = 0;
  GpuPlan d = pl;
  d.vk = kVF16;
  std::string why;
  const size_t bytes = f16_copy_bytes(p);
  // v_dequant=1 drops the length rule only (as v_scan=1): where the wgmma instance does not run, nothing changes
  if (q6) {
    if (!plan_prefill_vk<kVF16>(d, f, dev, ov, why) || bytes > kMaxDequantBytesQ6) return false;
  } else {
    const bool ok = plan_prefill_vk<kVF16>(d, f, dev, ov, why) && (d.wgmma || qk16_wide_device(f, dev, ov)) &&
                    bytes <= kMaxDequantBytes;
    if (!ok || (ov.v_dequant != 1 && (d.blocks / (p.B * p.Hkv) < 8 || p.Sk < 2048))) return false;
  }
  d.v_dequant = true;
  d.v_source = pl.vk;
  d.v_dequant_bytes = bytes;
  d.scratch_bytes += bytes;
  pl = d;
  return true;
}
#endif

#if defined(D4A_HAS_PREFILL_MMA)
// Q.K on f16 wgmma from K dequantized once into float16 rows (k_dequant.cuh; prefill_mma.cuh, QK16): the int8 Q.K's
// per-block scaling (two FFMAs per logit and 32-block) is the largest part of the int8 prefill's instruction stream,
// and this instance is 1.26-1.43x the int8 one at D = 128 on the H200 and 1.16-1.40x at D = 64 on the H100
// (docs/performance.md). Its Q.K rounds Q and K to float16 (reference.dot4_logits(qk_f16=True)): the contract's
// documented deviation for this route (docs/ops.md). Taken by default where the plan is the float16-V wgmma instance
// with 3 blocks per SM at D = 64 or 128 (V float16, or its float16 copy), each K tile is read by 8 blocks or more
// over 2048+ keys (the copy is one pass over K: three times its bytes, paid back only where K is read many times),
// the scale is positive (the softmax multiplies unscaled dot products by it, and takes their max first) and the copy
// fits kMaxDequantBytes. k_dequant=1 drops the length rule and also takes 2 blocks per SM (the overlapped schedule:
// each tile's softmax over the next tile's Q.K, three ring slots; slower at both head sizes); k_dequant=0 keeps the
// contract's int8 Q.K.
template <int D>
int qk16_smem_bytes(int min_blocks) {
  using Tr = pmma::Traits<kVF16, D, 1>;
  return min_blocks == 2 ? Tr::qk16p_bytes : Tr::qk16_bytes;
}

// D = 256: the Q-in-shared-memory kernel (prefill_wg.cuh), NWG warpgroups of 64 rows per block sharing each K / V
// tile (2 by default; warps=4: one), one block per SM; under the rules of D 64 / 128 (the float16-V instance, V
// float16 or its float16 copy; by default each K tile read by 8+ blocks over 2048+ keys; V scanned once where the
// float16-V wgmma instance would scan it). Its K and V tiles come by tensor copies: V's own rows must fit a map.
void plan_qk16_wide(GpuPlan& pl, const AttentionParams& p, const DeviceFacts& dev, const PlanOverrides& ov) {
  if (pl.kernel != KernelKind::kPrefillMma || pl.vk != kVF16 || !qk16_wide_device(p, dev, ov)) return;
  if (!f16_v_maps_ok(pl, p)) return;
  const int nwg = ov.warps == 4 ? 1 : 2;
  GpuPlan w = pl;
  set_row_chunks(w, p, 64 * nwg);
  w.threads = 128 * nwg;
  w.warps = 4 * nwg;
  w.m_tiles = 1;
  w.min_blocks = 1;
  w.stages = 2;
  w.tma = w.wgmma = true;
  w.smem_bytes = nwg == 2 ? pwg::Layout<256, 2>::bytes : pwg::Layout<256, 1>::bytes;
  if (w.smem_bytes > dev.max_smem) return;
  if (block_count(w, p) > kMaxBlocks) return;
  set_blocks(w, p);
  const int64_t reads = w.blocks / (p.B * p.Hkv);  // blocks reading each K / V tile of a (batch, KV head)
  if (ov.k_dequant != 1 && (reads < 8 || p.Sk < 2048)) return;
  const size_t bytes = f16_copy_bytes(p);
  if (bytes > kMaxDequantBytes) return;
  take_k_copy(w, p, bytes);
  w.v_scan = v_scan_wanted(p, ov, reads);
  if (w.v_scan) w.scratch_bytes += size_t(p.B * p.Hkv) * sizeof(int);
  pl = w;
}

// The warp-specialized prefill's instance of a head size and key tile: its key tile, K slots, shared memory (and the
// checked companion's).
struct WsInst {
  int keys = 0, slots = 0, smem = 0, checked = 0;
};
template <int D, int NK>
WsInst ws_inst() {
  using I = pws::Inst<D, NK>;
  return {NK, I::SK, I::L::bytes, pwg::Layout<D, 2>::bytes};
}

// The warp-specialized f16 Q.K prefill (prefill_ws.cuh) in place of a k_dequant plan (D 64 / 128 / 256): work items
// of 128 rows (two consumer warpgroups) beside a producer warpgroup, one block per SM, persistent (a block per SM
// walking the items; ws_persist=0: a block per item), V scanned once per call (the kernel has no V check: the flagged
// heads run on prefill_wg.cuh's checked instance, a block per SM striding over the items, whose shared memory must fit
// too).
void plan_ws(GpuPlan& pl, const AttentionParams& p, const DeviceFacts& dev, const PlanOverrides& ov) {
  // default: D = 128 over kWsMinKeys+ keys, D = 64 over kWsMinKeysD64+ keys and D = 256 over kWsMinKeysD256+ keys,
  // where it measured faster than the QK16 instance with 3 blocks per SM, or prefill_wg.cuh at D = 256 (D = 128,
  // H100: 1.10x at 2k and 1.17x at 4k since the diagonal's mask, 1.04x at 8k, 1.24x at 32k, 1.34x for a 16k chunk
  // over 128k keys; below 2048 keys no plan takes k_dequant by default; D = 64: 1.06-1.09x at 32k (H100, H200),
  // 1.13-1.25x for a 16k chunk over 128k keys (H100), 1.01-1.03x at 8k and 16k since the diagonal's mask, 0.96x at
  // 2k; D = 256 since the snake deal and 32-bit index math: 1.09x at 2k, 1.04-1.12x at 4k, 1.10x at 8k, 1.13-1.18x
  // at 16k-32k, 0.97x at 1k (H100), docs/performance.md), unless an override asks for another instance or no V scan
  const bool other = ov.min_blocks != 0 || ov.m_tiles != 0 || ov.warps != 0 || ov.stages != 0 || ov.v_scan == 0;
  const int64_t from = p.D == 128 ? kWsMinKeys : p.D == 64 ? kWsMinKeysD64 : kWsMinKeysD256;
  const bool wanted = ov.ws == 1 || (ov.ws == -1 && !other && from > 0 && p.Sk >= from);
  if (!wanted || !pl.k_dequant || pl.vk != kVF16 || !dev.wgmma || !f16_v_maps_ok(pl, p)) return;
  if (p.group() * p.Sq >= (int64_t(1) << 31)) return;  // its index math is 32-bit (item_chunk / run_kminmax<uint32_t>)
  const bool narrow = ov.ws_keys == 64;  // D 64 / 128: the 64-key tiles (D = 256 has only those)
  const WsInst in = p.D == 64    ? (narrow ? ws_inst<64, 64>() : ws_inst<64, 128>())
                    : p.D == 128 ? (narrow ? ws_inst<128, 64>() : ws_inst<128, 128>())
                                 : ws_inst<256, 64>();
  if (std::max(in.smem, in.checked) > dev.max_smem) return;
  GpuPlan w = pl;
  set_row_chunks(w, p, pws::kConsumers * 64);
  w.threads = pws::kThreads;
  w.warps = pws::kThreads / 32;
  w.m_tiles = 1;
  w.min_blocks = 1;
  w.key_tile = in.keys;
  w.stages = in.slots;
  w.tma = w.wgmma = true;
  w.smem_bytes = in.smem;
  if (block_count(w, p) > kMaxBlocks) return;
  set_blocks(w, p);
  w.ws_items = w.blocks;
  w.persistent = ov.ws_persist != 0;
  if (w.persistent) w.blocks = std::min<int64_t>(w.ws_items, std::max(dev.sms, 1));  // one block per SM
  w.ws_checked_blocks = std::min<int64_t>(w.ws_items, std::max(dev.sms, 1));
  w.ws_snake = ov.ws_snake != 0;
  // Causal items over a past at least as long as the chunk (each weighs 1/2 to 1 of the heaviest) whose K and V
  // rows far exceed L2: one KV head's items after another (pws::item_at), so the blocks at work stream one head's rows
  // through L2, not all heads' (H100, (28, 4, 128): a 16k chunk over 96k-128k keys 1.03-1.04x, a 32k chunk over 128k
  // 1.06x; 16k over 64k within the rounds' spread). With Sq = Sk the deal needs all heads at once to stay balanced
  // ((32, 8, 128) 8k: 0.64x grouped; docs/performance.md).
  const int64_t kv_bytes = p.B * p.Hkv * p.Sk * p.D * 4;  // K's and V's float16 rows
  const bool grouped = w.causal_tiles > 0 && p.Sk - p.Sq >= p.Sq && kv_bytes >= kWsGroupMinBytes;
  w.ws_group = ov.ws_group >= 0 ? ov.ws_group : grouped ? 1 : 0;
  // The call's own float16 V: scanned behind the kernel, on the SMs its blocks leave at its end (the kernel runs every
  // head, and the checked companion runs the flagged ones again), not in K's pass before it, where reading V takes
  // ~40 % of the pass. A quantized V's copy is scanned in K's pass, in registers, as it is written (k_dequant.cuh).
  w.ws_late_scan = !w.v_dequant && ov.ws_late_scan != 0;
  if (!w.v_scan) w.scratch_bytes += size_t(p.B * p.Hkv) * sizeof(int);
  if (w.ws_late_scan) w.scratch_bytes += size_t(p.B * p.Hkv) * sizeof(int);  // the kernel's flags: zeros
  w.v_scan = true;
  w.ws = true;
  pl = w;
}

void plan_k_dequant(GpuPlan& pl, const AttentionParams& p, const DeviceFacts& dev, const PlanOverrides& ov) {
  if (p.D == 256) {
    plan_qk16_wide(pl, p, dev, ov);
    return plan_ws(pl, p, dev, ov);
  }
  if (ov.k_dequant == 0 || pl.kernel != KernelKind::kPrefillMma || pl.vk != kVF16 || !pl.tma || !pl.wgmma ||
      (pl.min_blocks != 3 && pl.min_blocks != 2) || pl.m_tiles != 1 || (p.D != 64 && p.D != 128) || !(p.scale > 0.f) ||
      !std::isfinite(p.scale) || p.B * p.Hkv == 0)
    return;
  const int64_t reads = pl.blocks / (p.B * p.Hkv);  // blocks reading each K tile of a (batch, KV head)
  if (ov.k_dequant != 1 && (pl.min_blocks != 3 || reads < 8 || p.Sk < 2048)) return;
  const int smem = p.D == 64 ? qk16_smem_bytes<64>(pl.min_blocks) : qk16_smem_bytes<128>(pl.min_blocks);
  const size_t bytes = f16_copy_bytes(p);
  if (smem > dev.max_smem || bytes > kMaxDequantBytes) return;
  pl.smem_bytes = smem;
  take_k_copy(pl, p, bytes);
  plan_ws(pl, p, dev, ov);
}
#endif

#if defined(D4A_HAS_PREFILL_MMA)
// The contract's int8 Q.K on wgmma (prefill_mma.cuh, S8W): the float16-V wgmma instance with 2 blocks per SM (the
// registers for the next block's wgmma in flight during this block's scaling FFMAs; at 3 blocks per SM ptxas spilled
// 152-160 bytes and serialized every wgmma, so that instance is not built) at D 64 / 128, where k_dequant is not
// taken. Only when asked (qk_wgmma=1, with min_blocks=2): on the H200 it ran at the speed of the int8 instance with 2
// blocks per SM, slower than the default 3 (docs/performance.md). At D = 64 it reloads Q's fragments before each tile's
// Q.K (prefill_mma.cuh, Traits::Q16_QH: kept in registers, ptxas 13.0 gave them to P there).
void plan_qk_wgmma(GpuPlan& pl, const AttentionParams& p, const PlanOverrides& ov) {
  if (ov.qk_wgmma == 1 && !pl.k_dequant && pl.kernel == KernelKind::kPrefillMma && pl.vk == kVF16 && pl.tma &&
      pl.wgmma && pl.min_blocks == 2 && pl.m_tiles == 1 && (p.D == 64 || p.D == 128))
    pl.qk_wgmma = true;
}
#endif

bool plan_prefill_mma(GpuPlan& pl, const AttentionParams& p, const DeviceFacts& dev, const PlanOverrides& ov,
                      std::string& why) {
#if defined(D4A_HAS_PREFILL_MMA)
  if (dev.hip || dev.cc_major < 8) return refuse(why, "tensor-core prefill: needs CUDA sm_80+");
  if (p.D != 64 && p.D != 128 && p.D != 256) return refuse(why, "tensor-core prefill: D is not 64, 128 or 256");
  // float32 T keeps float32 P.V (the tile kernel): routes must agree to float32 rounding, and f16 P and f16-staged V
  // would put this kernel ~4e-8 (NMSE) from the others. For float16 T that error is below the output's rounding.
  if (!p.half) return refuse(why, "tensor-core prefill: float32 T keeps the tile kernel's float32 P.V");
  if (!aligned(p.q, 16) || !aligned(p.k, 16) || !aligned(p.v, 16) || !aligned(p.k_scales, 4) ||
      !aligned(p.v_scales, 4) || !aligned(p.out, 4))
    return refuse(why, "tensor-core prefill: pointers not aligned");
  // scale rows move in 4-byte pieces, so every row must start 4-byte aligned; a tile's offsets are 32-bit
  if (p.ks_row() % 2 != 0 || (p.v_format != VFormat::kFloat && p.vs_row() % 2 != 0))
    return refuse(why, "tensor-core prefill: scale row strides not multiples of 4 bytes");
  if (p.ks_row() > 0x7fffffffLL / pmma::kKeys || p.vs_row() > 0x7fffffffLL / pmma::kKeys)
    return refuse(why, "tensor-core prefill: scale row strides of 2^25 halves or more");
  if (plan_v_dequant(pl, p, dev, ov)) {
    plan_k_dequant(pl, p, dev, ov);
    plan_qk_wgmma(pl, p, ov);
    return true;
  }
  if (pl.vk == kVQ6)
    return refuse(why, ov.v_dequant == 0 ? "tensor-core prefill: q6_0 V runs on its float16 copy (v_dequant=0)"
                                         : "tensor-core prefill: q6_0 V's float16 copy is larger than " +
                                               std::to_string(kMaxDequantBytesQ6 >> 20) + " MiB");
  const bool ok = pl.vk == kVF16 ? plan_prefill_vk<kVF16>(pl, p, dev, ov, why)
                  : pl.vk == kVQ8 ? plan_prefill_vk<kVQ8>(pl, p, dev, ov, why)
                                  : plan_prefill_vk<kVQ4>(pl, p, dev, ov, why);
  if (ok) {
    plan_k_dequant(pl, p, dev, ov);
    plan_qk_wgmma(pl, p, ov);
  }
  return ok;
#else
  (void)pl; (void)p; (void)dev; (void)ov;
  why = "tensor-core prefill: not in this build (CUDA only)";
  return false;
#endif
}

GpuPlan plan_prefill(GpuPlan pl, const AttentionParams& p, const DeviceFacts& dev, const PlanOverrides& ov) {
  const int forced = ov.kernel;
  if (forced == int(KernelKind::kDecodeSimt)) fail(kOp, "override kernel=simt: the prefill route has no SIMT kernel");
  if (forced == int(KernelKind::kTile)) {
    pl.fallback = "forced";
    return plan_tile(pl, p, dev, ov);
  }
  std::string why;
  GpuPlan m = pl;
  if (plan_prefill_mma(m, p, dev, ov, why)) return m;
  if (forced >= 0) fail(kOp, "override kernel=mma cannot run this call: ", why);
  pl.fallback = why;
  return plan_tile(pl, p, dev, ov);
}

// The K / V row layout every kernel can address: rows per head cover the keys, a row stride holds at least a dense
// row, and payload rows are 16-byte multiples apart (every kernel moves them in 16-byte pieces). Scale row strides
// may be anything from D/32 halves up; kernels that move whole scale rows in wider pieces ask for more themselves.
void check_layout(const AttentionParams& p) {
  if (p.kv_rows < 0 || p.k_stride < 0 || p.ks_stride < 0 || p.v_stride < 0 || p.vs_stride < 0)
    fail(kOp, "negative K / V layout: kv_rows=", p.kv_rows, " k_stride=", p.k_stride, " ks_stride=", p.ks_stride,
         " v_stride=", p.v_stride, " vs_stride=", p.vs_stride);
  if (p.head_rows() < p.Sk) fail(kOp, "kv_rows=", p.kv_rows, " is below Sk=", p.Sk, " (rows per head hold the keys)");
  if (p.k_row() < p.D || p.k_row() % 16 != 0)
    fail(kOp, "k_stride: expected a multiple of 16 bytes >= D=", p.D, ", got ", p.k_row());
  if (p.ks_row() < p.D / 32) fail(kOp, "ks_stride: expected at least D/32=", p.D / 32, " halves, got ", p.ks_row());
  if (p.v_row() < p.v_dense_row() || v_stride_bytes(p) % 16 != 0)
    fail(kOp, "v_stride: expected at least ", p.v_dense_row(), " and a multiple of 16 bytes (",
         p.v_format == VFormat::kFloat ? "elements of T" : "bytes", "), got ", p.v_row());
  if (p.v_format != VFormat::kFloat && p.vs_row() < p.D / 32)
    fail(kOp, "vs_stride: expected at least D/32=", p.D / 32, " halves, got ", p.vs_row());
}

int64_t split_len_for(int64_t sk, int64_t n_splits) {
  int64_t len = cdiv(sk, std::max<int64_t>(1, n_splits));
  len = cdiv(len, kTileKeys) * kTileKeys;
  return std::max<int64_t>(len, kTileKeys);
}

// A split count whose (batch, KV head, split) blocks spread evenly over the multiprocessors. A long decode streams
// at the pace of its most loaded multiprocessor: 64 (batch, KV head)s x 5 splits = 320 blocks put 3 on some of an
// H200's 132 multiprocessors and 2 on the rest, so the kernel takes 3 blocks' time for 2.42 blocks' work (16 x 4 KV
// heads, 32k keys, q4_0 from a packed cache; docs/performance.md). Among n and up to a tenth fewer splits (at least one
// fewer), the count with the most even spread, items / (sms x ceil(items / sms)); the larger count on a tie. Fewer
// splits only: more would add merge work and shorter walks.
int64_t balanced_splits(int64_t batch_heads, int64_t sk, int64_t sms, int64_t n) {
  int64_t best = n;
  double best_spread = -1.0;
  const int64_t lo = std::max<int64_t>(1, n - std::max<int64_t>(1, n / 10));
  for (int64_t c = n; c >= lo; --c) {
    const int64_t items = batch_heads * cdiv(sk, split_len_for(sk, c));
    const double spread = double(items) / double(sms * cdiv(items, sms));
    if (spread > best_spread + 1e-9) {
      best = c;
      best_spread = spread;
    }
  }
  return best;
}

// ---- parsing and printing ------------------------------------------------------------------------------------------
// "a=1, b=x" -> {(a, 1), (b, x)}; an item without '=' has an empty value.
std::vector<std::pair<std::string, std::string>> key_values(const char* s) {
  std::vector<std::pair<std::string, std::string>> kv;
  std::stringstream in(s ? s : "");
  std::string item;
  while (std::getline(in, item, ',')) {
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    kv.emplace_back(item.substr(0, eq), eq == std::string::npos ? "" : item.substr(eq + 1));
  }
  return kv;
}

int to_int(const std::string& key, const std::string& v, int lo, int hi, const char* what) {
  char* end = nullptr;
  const long x = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end != 0 || x < lo || x > hi)
    fail(what, "'", key, "': expected an integer in [", lo, ", ", hi, "], got '", v, "'");
  return int(x);
}

int to_choice(const std::string& key, const std::string& v, std::initializer_list<const char*> names,
              const char* what) {
  int i = 0;
  std::string all;
  for (const char* n : names) {
    if (v == n) return i;
    all += std::string(i ? ", " : "") + n;
    ++i;
  }
  fail(what, "'", key, "': expected one of ", all, ", got '", v, "'");
}

}  // namespace

const char* kernel_name(KernelKind k) {
  switch (k) {
    case KernelKind::kTile: return "tile";
    case KernelKind::kDecodeSimt: return "decode_simt";
    case KernelKind::kDecodeMma: return "decode_mma";
    case KernelKind::kPrefillMma: return "prefill_mma";
  }
  return "?";
}

const char* staging_name(int staging) {
  switch (staging) {
    case kStageCpAsync: return "cp_async";
    case kStageRegs: return "regs";
    case kStageRegsV: return "regs_v";
    case kStageTma: return "tma";
    case kStageBulk: return "bulk";
  }
  return "?";
}

GpuPlan plan_attention(const AttentionParams& p, const DeviceFacts& dev, const PlanOverrides& ov) {
  if (p.route == Route::kAuto) fail(kOp, "unresolved route");
  if (p.v_format == VFormat::kQ6_0 && p.D % 64 != 0)
    fail(kOp, "q6_0 V on the GPU needs D a multiple of 64 (its rows of 3 D / 4 bytes move in 16-byte pieces), got D=",
         p.D, " (the CPU execution provider takes every D)");
  check_layout(p);
  if (p.dev_seqlens && (p.route == Route::kPrefill || p.dense_kv()))
    fail(kOp, "device lengths (dev_seqlens) need the decode or split_k route and strided K / V rows");
  GpuPlan pl;
  pl.overrides = ov;
  pl.strided = !p.dense_kv();
  pl.route = p.route;
  pl.vk = vkind(p);
  pl.D = p.D;
  pl.split_len = p.Sk > 0 ? p.Sk : 1;  // one split of every key, unless split_k splits them below
  if (p.route == Route::kPrefill) return plan_prefill(pl, p, dev, ov);
  if (p.route == Route::kSplitK && p.Sk > 0) {
    // FlashDecoding: enough (batch, KV head, split) items for `waves` waves over the multiprocessors, splits of at
    // least 128 keys, spread evenly (balanced_splits); splits are whole 64-key tiles, so a count whose splits round
    // up to fewer is kept smaller.
    // split_waves (an override) takes the count as it is, unbalanced: the plans before balanced_splits.
    const int waves = ov.split_waves > 0 ? ov.split_waves : 2;
    int64_t n = choose_splits(p.B * p.Hkv, p.Sk, dev.sms, waves, /*min keys=*/128);
    if (ov.split_waves == 0) n = balanced_splits(p.B * p.Hkv, p.Sk, dev.sms, n);
    pl.split_len = split_len_for(p.Sk, n);
    pl.n_splits = cdiv(p.Sk, pl.split_len);
    if (p.B * p.Hq * p.Sq > kMaxBlocks || pl.n_splits > 8192)
      fail(kOp, "split_k cannot merge ", p.B * p.Hq * p.Sq, " rows of ", pl.n_splits, " splits");
    pl.scratch_bytes = size_t(pl.n_splits) * size_t(p.B * p.Hq * p.Sq) * size_t(p.D + 2) * sizeof(float);
  }
  return plan_decode(pl, p, dev, ov);
}

PlanOverrides parse_plan_overrides(const char* s) {
  constexpr const char* kWhat = "Dot4Attention GPU plan override";
  PlanOverrides ov;
  for (const auto& [k, v] : key_values(s)) {
    if (k == "kernel") {
      const int c = to_choice(k, v, {"auto", "tile", "simt", "mma"}, kWhat);
      ov.kernel = c == 0 ? -1 : c == 1 ? int(KernelKind::kTile) : c == 2 ? int(KernelKind::kDecodeSimt)
                                                                         : int(KernelKind::kDecodeMma);
    } else if (k == "warps") ov.warps = to_int(k, v, 0, 16, kWhat);
    else if (k == "stages") ov.stages = to_int(k, v, 0, 3, kWhat);
    else if (k == "staging") {
      const int c = to_choice(k, v, {"auto", "cp_async", "regs", "regs_v", "tma", "bulk"}, kWhat);
      ov.staging = c - 1;
    } else if (k == "cluster") ov.cluster = to_int(k, v, 0, 8, kWhat);
    else if (k == "m_tiles") ov.m_tiles = to_int(k, v, 0, 2, kWhat);
    else if (k == "min_blocks") ov.min_blocks = to_int(k, v, 0, 3, kWhat);
    else if (k == "tma") ov.tma = to_int(k, v, 0, 1, kWhat);
    else if (k == "wgmma") ov.wgmma = to_int(k, v, 0, 1, kWhat);
    else if (k == "split_waves") ov.split_waves = to_int(k, v, 0, 64, kWhat);
    else if (k == "v_scan") ov.v_scan = to_int(k, v, 0, 1, kWhat);
    else if (k == "v_dequant") ov.v_dequant = to_int(k, v, 0, 1, kWhat);
    else if (k == "k_dequant") ov.k_dequant = to_int(k, v, 0, 1, kWhat);
    else if (k == "qk_wgmma") ov.qk_wgmma = to_int(k, v, 0, 1, kWhat);
    else if (k == "ws") ov.ws = to_int(k, v, 0, 1, kWhat);
    else if (k == "ws_persist") ov.ws_persist = to_int(k, v, 0, 1, kWhat);
    else if (k == "ws_snake") ov.ws_snake = to_int(k, v, 0, 1, kWhat);
    else if (k == "ws_group") ov.ws_group = to_int(k, v, 0, 64, kWhat);
    else if (k == "ws_late_scan") ov.ws_late_scan = to_int(k, v, 0, 1, kWhat);
    else if (k == "ws_keys") {
      ov.ws_keys = to_int(k, v, 64, 128, kWhat);
      if (ov.ws_keys != 64 && ov.ws_keys != 128) fail(kWhat, "ws_keys: expected 64 or 128, got ", v);
    }
    else
      fail(kWhat, "unknown key '", k, "' (expected kernel, warps, stages, staging, cluster, m_tiles, min_blocks, tma, ",
           "wgmma, split_waves, v_scan, v_dequant, k_dequant, qk_wgmma, ws, ws_keys, ws_persist, ws_snake, ws_group, "
           "ws_late_scan)");
  }
  return ov;
}

DeviceFacts parse_device_facts(const char* s) {
  constexpr const char* kWhat = "dot4attn device facts";
  DeviceFacts d;
  d.max_smem = 0;
  d.sms = 0;
  bool tma_set = false;
  for (const auto& [k, v] : key_values(s)) {
    if (k == "hip") d.hip = true;
    else if (k == "sm") {  // "90a", "90", "80", "100"
      const bool arch_a = !v.empty() && v.back() == 'a';
      const int cc = to_int(k, arch_a ? v.substr(0, v.size() - 1) : v, 50, 200, kWhat);
      d.cc_major = cc / 10;
      d.cc_minor = cc % 10;
      d.wgmma = arch_a && cc == 90;
    } else if (k == "sms" || k == "cus") d.sms = to_int(k, v, 1, 100000, kWhat);
    else if (k == "smem") d.max_smem = to_int(k, v, 1024, 1 << 24, kWhat);
    else if (k == "warp") d.warp_size = to_int(k, v, 32, 64, kWhat);
    else if (k == "tma") d.tma = to_int(k, v, 0, 1, kWhat) != 0, tma_set = true;
    else if (k == "wgmma") d.wgmma = to_int(k, v, 0, 1, kWhat) != 0;
    else if (k == "run_warp") d.run_warp = to_int(k, v, 32, 64, kWhat);
    else fail(kWhat, "unknown key '", k, "' (expected sm, hip, sms, cus, smem, warp, tma, wgmma, run_warp)");
  }
  if (d.hip == (d.cc_major != 0)) fail(kWhat, "give either sm=NN (CUDA) or hip, got '", s ? s : "", "'");
  if (d.sms == 0 || d.max_smem == 0) fail(kWhat, "sms (or cus) and smem are required, got '", s ? s : "", "'");
  if (!tma_set) d.tma = d.cc_major >= 9;
  return d;
}

std::string plan_json(const GpuPlan& pl) {
  const char* route = pl.route == Route::kPrefill ? "prefill" : pl.route == Route::kDecode ? "decode" : "split_k";
  std::ostringstream o;
  o << "{\"route\": \"" << route << "\", \"kernel\": \"" << kernel_name(pl.kernel) << "\", \"rows_per_block\": "
    << pl.rows_per_block << ", \"threads\": " << pl.threads << ", \"warps\": " << pl.warps
    << ", \"stages\": " << pl.stages;
  if (pl.kernel == KernelKind::kTile) o << ", \"key_tile\": " << pl.key_tile;
  if (pl.kernel == KernelKind::kDecodeMma)
    o << ", \"staging\": \"" << staging_name(pl.staging) << "\", \"cluster\": " << pl.cluster;
  if (pl.kernel == KernelKind::kPrefillMma)
    o << ", \"m_tiles\": " << pl.m_tiles << ", \"min_blocks\": " << pl.min_blocks << ", \"tma\": "
      << (pl.tma ? "true" : "false") << ", \"wgmma\": " << (pl.wgmma ? "true" : "false") << ", \"v_scan\": "
      << (pl.v_scan ? "true" : "false") << ", \"v_dequant\": " << (pl.v_dequant ? "true" : "false")
      << ", \"k_dequant\": " << (pl.k_dequant ? "true" : "false")
      << ", \"qk_wgmma\": " << (pl.qk_wgmma ? "true" : "false") << ", \"ws\": " << (pl.ws ? "true" : "false");
  if (pl.ws)
    o << ", \"key_tile\": " << pl.key_tile << ", \"persistent\": " << (pl.persistent ? "true" : "false")
      << ", \"items\": " << pl.ws_items << ", \"checked_blocks\": " << pl.ws_checked_blocks
      << ", \"snake\": " << (pl.ws_snake ? "true" : "false") << ", \"group\": " << pl.ws_group
      << ", \"late_scan\": " << (pl.ws_late_scan ? "true" : "false");
  o << ", \"smem_bytes\": " << pl.smem_bytes << ", \"n_splits\": " << pl.n_splits << ", \"split_len\": "
    << pl.split_len << ", \"n_chunks\": " << pl.n_chunks << ", \"blocks\": " << pl.blocks
    << ", \"scratch_bytes\": " << pl.scratch_bytes << ", \"strided\": " << (pl.strided ? "true" : "false")
    << ", \"fallback\": \"";
  for (char c : pl.fallback) o << (c == '"' || c == '\\' ? '\'' : c);
  o << "\"}";
  return o.str();
}

// Declared in gpu/attention_gpu_internal.h: the route files throw it for a plan with no compiled instance.
[[noreturn]] void no_instance(const GpuPlan& pl) {
  throw std::runtime_error(std::string("Dot4Attention GPU: no compiled instance for the plan ") + plan_json(pl));
}

}  // namespace gpu
}  // namespace dot4attn
