// Launch plans of Dot4Attention on the GPU: plan, then run (as FlashInfer's plan / run and llama.cpp's one kernel
// selector). plan_attention is a pure function of (shape, dtypes, V format, K / V row layout, pointer alignment,
// device facts, overrides): it names the kernel and its whole configuration, sizes the split-K scratch, and says why
// a faster kernel was not taken. The route files only execute a plan (decode/, split_k/, prefill/). The same plan
// answers "is this supported" (the C entry dot4attn_gpu_plan, `dot4attn info --plan`), and with explicit device facts
// it can be computed on a machine without a GPU, which is how the planner is tested in CI.
//
// Overrides (tuning and tests only) come from one place: a string "key=value,..." passed to the C entries
// (attention_gpu.cu). Keys:
//   kernel=auto|tile|simt|mma   which kernel (simt: the SIMT decode kernel; mma: the tensor-core kernel of the route)
//   warps=N  stages=N           warps per block, pipeline stages (decode kernels; stages also the tile/prefill ring)
//   staging=cp_async|regs|regs_v|tma|bulk   the tensor-core decode's staging mode
//   cluster=N                   the tensor-core decode route's cluster size (1: none)
//   m_tiles=1|2  min_blocks=2|3 tma=0|1  wgmma=0|1     the tensor-core prefill's instance
//   split_waves=N               split_k's waves of (batch, KV head, split) items per multiprocessor
//   v_scan=0|1                  the float16-V tensor-core prefill's V scan (GpuPlan::v_scan; 1: where the wgmma
//                               instance runs)
//   v_dequant=0|1               a q8_0 / q4_0 V dequantized once into float16 rows for the float16-V wgmma prefill
//                               (GpuPlan::v_dequant; 1: wherever that instance runs, short calls too; q6_0 V always
//                               takes the copy there, and 0 sends it to the tile kernel)
//   k_dequant=0|1               K dequantized once into float16 rows and the Q.K on f16 wgmma (GpuPlan::k_dequant;
//                               1: wherever the float16-V wgmma instance runs at D 64 / 128 (3 blocks per SM, or with
//                               min_blocks=2 the schedule that overlaps the softmax with the next Q.K) and at D = 256
//                               on sm_90a (prefill_wg.cuh), short calls too; 0: the contract's int8 Q.K everywhere;
//                               default: D 64 / 128 with 3 blocks per SM and D = 256 where K is read by 8+ blocks over
//                               2048+ keys; its numerics are the reference's qk_f16 mode, docs/ops.md)
//   warps=4|8                   also the D = 256 f16 Q.K prefill's warpgroups per block (4 warps: one; default two)
//   qk_wgmma=0|1                the contract's int8 Q.K on wgmma (GpuPlan::qk_wgmma; 1: wherever the float16-V wgmma
//                               instance runs with min_blocks=2 at D 64 / 128 and k_dequant does not; default 0: slower
//                               than the default instance on the H200, docs/performance.md)
//   ws=0|1                      the f16 Q.K prefill warp-specialized (GpuPlan::ws, prefill_ws.cuh; 1: wherever the
//                               plan takes k_dequant; default: where it does at D = 128 over kWsMinKeys+ keys, at
//                               D = 64 over kWsMinKeysD64+ keys and at D = 256 over kWsMinKeysD256+ keys)
//   ws_keys=64|128              its keys per tile (GpuPlan::key_tile; default 128 at D 64 / 128; D = 256 takes 64)
//   ws_persist=0|1              its grid: one block per SM walking the work items (default), or one per item
//   ws_snake=0|1                its persistent deal (pws::Deal): odd rounds right to left (default), or round-robin
//   ws_late_scan=0|1            the call's own float16 V scanned for NaN / Inf after that kernel, which then runs every
//                               head (1, default), or in K's pass before it, so that it skips the flagged heads
//   ws_group=0..64              its causal items' order: 0 position-major over all heads, n > 0 position-major within
//                               groups of n (batch, KV head) pairs, one group after another (pws::item_at); default 1
//                               for a chunk over a past as long whose K and V take kWsGroupMinBytes+, else 0
// Host code only; no GPU runtime call here (device facts come in as a value).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/attention_params.h"

namespace dot4attn {
namespace gpu {

enum class KernelKind : int { kTile = 0, kDecodeSimt = 1, kDecodeMma = 2, kPrefillMma = 3 };

// The tensor-core decode kernel's staging modes (its SM template argument; decode_mma.cuh explains each).
enum StageMode : int { kStageCpAsync = 0, kStageRegs = 1, kStageRegsV = 2, kStageTma = 3, kStageBulk = 4 };

// What the planner needs to know of the device. From the current device (device_facts(), cached) or given
// explicitly (parse_device_facts) to plan for a device that is not there.
struct DeviceFacts {
  bool hip = false;         // a HIP build: no tensor-core kernels, warp size from the device
  int cc_major = 0;         // CUDA compute capability (0 on HIP)
  int cc_minor = 0;
  int sms = 1;              // multiprocessors / compute units
  int warp_size = 32;
  int max_smem = 48 * 1024;  // opt-in dynamic shared memory per block
  bool wgmma = false;       // the loaded binary has the sm_90a wgmma instances
  bool tma = false;         // the driver's tensor-map encoder is available
  // The warp width of the GPU that runs the plan when it is not the described device (0: warp_size): a CUDA GPU
  // running the plan of a described AMD device (the C entry's run_as) lays the SIMT decode block out for its own
  // 32-wide warps (plan_decode_simt). Every other part of the plan is the described device's.
  int run_warp = 0;
};

struct PlanOverrides {
  int kernel = -1;  // -1 auto, else a KernelKind (kDecodeMma / kPrefillMma: "mma", the route's tensor-core kernel)
  int warps = 0, stages = 0;
  int staging = -1;  // -1 auto, else a StageMode
  int cluster = 0;   // 0 auto, 1 none, N
  int m_tiles = 0, min_blocks = 0;
  int tma = -1, wgmma = -1;  // -1 auto, 0 off, 1 on (where possible)
  int split_waves = 0;       // 0: the default (2)
  int v_scan = -1;           // -1 auto, 0 off, 1 on (tensor-core prefill, float16 V)
  int v_dequant = -1;        // -1 auto, 0 off, 1 on (tensor-core prefill, quantized V; q6_0 always on unless 0)
  int k_dequant = -1;        // -1 auto, 0 off (the int8 Q.K), 1 on (tensor-core prefill: Q.K on f16 wgmma)
  int qk_wgmma = -1;         // -1 auto (off for now), 0 off, 1 on (tensor-core prefill: int8 Q.K on wgmma)
  int ws = -1;               // -1 auto (D = 128 / 64 / 256 over kWsMinKeys / ...D64 / ...D256+ keys), 0 off, 1 on
                             // (the f16 Q.K prefill warp-specialized)
  int ws_keys = 0;           // 0 auto, 64 or 128: that kernel's keys per tile (D 64 / 128)
  int ws_persist = -1;       // -1 auto (on), 0 off: that kernel's blocks walk its work items (one block per SM)
  int ws_snake = -1;         // -1 auto (on), 0 off: its persistent deal right to left in odd rounds (GpuPlan::ws_snake)
  int ws_group = -1;         // -1 auto (kWsGroupMinBytes), n: causal items position-major within groups of n KV heads
  int ws_late_scan = -1;     // -1 auto (on for float16 V), 0 off: V scanned behind the ws kernel (GpuPlan)
};

// The warp-specialized f16 Q.K prefill (prefill_ws.cuh) is the default at D = 128 from kWsMinKeys keys on, at
// D = 64 from kWsMinKeysD64 and at D = 256 from kWsMinKeysD256 (below them the QK16 instance with 3 blocks per SM,
// or prefill_wg.cuh at D = 256, is faster: docs/performance.md).
constexpr int64_t kWsMinKeys = 2048;
constexpr int64_t kWsMinKeysD64 = 8192;
constexpr int64_t kWsMinKeysD256 = 2048;
// Its causal items go one KV head after another (ws_group = 1) where the chunk has a past at least as long as itself
// and the K and V float16 rows of all (batch, KV head) pairs take kWsGroupMinBytes or more, over three times the
// H100 / H200's 50 MB of L2 (H100, the 7B shape's 16k chunk over 96k-128k keys: 1.03-1.04x; over 64k: within the
// rounds' spread, docs/performance.md).
constexpr int64_t kWsGroupMinBytes = int64_t(160) << 20;

// The largest float16 copy of a quantized V the prefill dequantizes into (scratch): past it, the kernel converts
// each V tile itself, as without the copy.
constexpr size_t kMaxDequantBytes = size_t(1) << 30;
// q6_0 V, which the tensor-core prefill reads only through that copy: the largest copy (past it the tile kernel runs).
constexpr size_t kMaxDequantBytesQ6 = size_t(4) << 30;

struct GpuPlan {
  Route route = Route::kDecode;
  KernelKind kernel = KernelKind::kTile;
  int vk = 0;              // VKind of V (the kernels' VK template argument)
  int D = 0;
  int rows_per_block = 0;  // the kernel's row tile: tile RB, SIMT decode RB, tensor-core decode 8, prefill 16 x MT x 4
  int rows_per_thread = 0; // tile kernel only (RPT)
  int key_tile = 0;        // keys per tile: the tile kernel's (KT, 64 or 32), the warp-specialized prefill's (64 / 128)
  int threads = 0;
  int warps = 0, stages = 0;
  int staging = kStageCpAsync;  // tensor-core decode
  int cluster = 0;              // tensor-core decode route: blocks per cluster (0: no cluster)
  int m_tiles = 0, min_blocks = 0;  // tensor-core prefill
  bool tma = false, wgmma = false;  // tensor-core prefill
  int smem_bytes = 0;
  int64_t n_splits = 1;      // key splits per (batch, KV head): split_k, or the cluster's blocks
  int64_t split_len = 0;     // keys per split (a multiple of 64; the last split may be shorter)
  int64_t split_chunks = 0;  // > 0: tensor-core split_k walks even splits of these many 32-key chunks
  int64_t n_chunks = 1;      // row chunks per (batch, KV head)
  int reverse_chunks = 0;    // causal prefill: heaviest row chunks first
  int64_t causal_tiles = 0;  // tensor-core causal prefill with Sq % rows == 0: row tiles per head (else 0)
  int64_t blocks = 0;
  size_t scratch_bytes = 0;  // split_k partials or the prefill's V flags (device memory the caller provides)
  bool v_scan = false;       // tensor-core prefill, float16 V: one scan flags the (b, KV head)s whose V holds a NaN /
                             // Inf, so the kernel's tiles of every other head skip their V check (gpu/v_scan.cuh)
  // Tensor-core prefill of a q8_0 / q4_0 / q6_0 V (v_dequant.cuh): v_dequant_bytes of scratch first hold V
  // dequantized into float16 rows (the values the kernel's own conversion makes), which the float16-V instance (vk)
  // then reads; v_source is the V's own kind. The V flags of v_scan follow them in the scratch.
  bool v_dequant = false;
  int v_source = 0;
  size_t v_dequant_bytes = 0;
  // Tensor-core prefill with Q.K on f16 wgmma (k_dequant.cuh, prefill_mma.cuh's QK16): after the V copy (if any) in the
  // scratch, k_dequant_bytes hold K dequantized into float16 rows (K's layout), then k_flag_bytes the per-(batch, KV
  // head) flags of heads whose copy is K times 2^-8; the V scan's flags follow.
  bool k_dequant = false;
  size_t k_dequant_bytes = 0;
  size_t k_flag_bytes = 0;
  // Tensor-core prefill, float16-V wgmma instance: the int8 Q.K on wgmma m64n64k32 (prefill_mma.cuh, S8W) instead of
  // mma.sync, same shared memory, same numerics.
  bool qk_wgmma = false;
  // Tensor-core prefill with Q.K on f16 wgmma (sm_90a): the warp-specialized kernel (prefill_ws.cuh: a
  // producer warpgroup, two consumer warpgroups taking turns on the tensor cores), V always scanned once per call.
  bool ws = false;
  bool persistent = false;  // ws: `blocks` (one per SM) walk ws_items work items of 128 rows; else one block per item
  int64_t ws_items = 0;
  int64_t ws_checked_blocks = 0;  // ws: the checked companion's blocks (one per SM, striding over the items)
  bool ws_snake = false;     // ws, persistent: odd rounds of work items dealt right to left (pws::Deal)
  int ws_group = 0;          // ws, causal items: 0 position-major over all heads, n > 0 within groups of n KV heads
  bool ws_late_scan = false;  // ws, the call's float16 V: scanned behind the kernel (v_scan.cuh), which runs all heads
  bool strided = false;      // K / V rows strided (AttentionParams' row layout is not the dense one)
  std::string fallback;      // why the route's preferred kernel was not taken ("" when it was)
  PlanOverrides overrides;   // what the plan was made with (a refused cluster launch is planned again without)
};

// The plan for p (shape, dtypes, V format, route already resolved; pointers only for their alignment, null
// counts as aligned). Throws OpError for an override that cannot be honoured (a forced kernel that does not
// take the call, an unknown value).
GpuPlan plan_attention(const AttentionParams& p, const DeviceFacts& dev, const PlanOverrides& ov);

// "kernel=simt,warps=4" -> PlanOverrides; throws OpError naming the bad key or value. Empty or null: none.
PlanOverrides parse_plan_overrides(const char* s);

// "sm=90a,sms=132,smem=232448[,warp=32][,tma=1][,wgmma=1]" or "hip,cus=304,warp=64,smem=65536[,run_warp=32]" ->
// DeviceFacts (run_warp: the plan as a GPU of that warp width runs it, DeviceFacts::run_warp).
DeviceFacts parse_device_facts(const char* s);

// The plan as one line of JSON (for `dot4attn info --plan`, the benchmark's records and the tests).
std::string plan_json(const GpuPlan& plan);

// Bytes from one V row to the next (AttentionParams::v_row() counts elements of T for float V, bytes otherwise).
inline int64_t v_stride_bytes(const AttentionParams& p) {
  return p.v_row() * (p.v_format != VFormat::kFloat ? 1 : p.half ? 2 : 4);
}

const char* kernel_name(KernelKind k);
const char* staging_name(int staging);

}  // namespace gpu
}  // namespace dot4attn
