// Dot4Attention prefill on Hopper (sm_90a), warp-specialized: the f16 Q.K prefill of prefill_wg.cuh (Q in shared
// memory, K's and V's float16 rows by tensor copies, the same per-tile math) in FlashAttention-3's schedule, for
// D = 64, 128 and 256.
//
// Why: in prefill_wg.cuh (and prefill_mma.cuh's QK16) every warpgroup runs Q.K, softmax and P.V in sequence and a
// block barrier per tile keeps the warpgroups in step, so the tensor cores wait while each warpgroup's softmax runs
// (the prefill reaches ~0.8x cuDNN at D = 128 on the H200, docs/performance.md). Here:
//   * a producer warpgroup (its registers given back: wg_regs_dec) issues every K and V tile's tensor copies into
//     rings of SK K slots and SV V slots, each slot with a "full" mbarrier (the copy's bytes) and an "empty" one (the
//     8 consumer warps giving it back), so no block barrier is left in the key loop;
//   * two consumer warpgroups (64 rows each, the block's 128) take turns issuing their GEMMs (ping-pong: a pair of
//     named barriers), so one warpgroup's softmax runs while the other's Q.K and P.V occupy the tensor cores;
//   * inside a warpgroup, tile t's Q.K is issued with tile t - 1's P.V before tile t's softmax, which waits only for
//     the Q.K (intra-warpgroup overlap); P.V of t - 1 completes under the softmax.
// Per consumer warpgroup and tile t:  wait K(t) full; [turn]  issue S = Q.K(t);  rescale O (lazy max);  issue
// O += P(t-1).V(t-1); [pass the turn]  wait for S; give K(t) back;  mask, softmax -> P(t);  wait for O;
// give V(t-1) back.
// A warpgroup whose rows see no key of a tile (causal: the work item's first rows) still takes its turn and gives the
// tile's slots back, so both warpgroups walk all of the item's tiles and the turns stay paired. A block walks work
// items of 128 rows (item_at), persistently where the planner gives it one block per SM: the slots' phases and the
// turns run on from item to item, and the producer loads the next item's first tiles while the consumers store
// this one's rows. The consumers' loop runs on across items too: an item's first Q.K goes out with the item before's
// last P.V, whose rows are stored after the new softmax, so an item boundary costs no drain of the pipeline.
//
// Only the instance without the V check: the planner scans V once per call (v_scan.cuh) and the heads it flags run on
// prefill_wg.cuh's checked instance (ws_qk16 in prefill_gpu.cu).
#pragma once

#include "gpu/prefill_wg.cuh"

#if defined(D4A_CUDA)

namespace dot4attn {
namespace gpu {
namespace pws {

constexpr int kBox = pwg::kKeys;  // rows per tensor-copy box (the K / V maps'), and Q rows per warpgroup (64)
constexpr int kConsumers = 2;      // consumer warpgroups per block (64 rows each)
constexpr int kThreads = 128 * (kConsumers + 1);
constexpr int kProducerRegs = 24, kConsumerRegs = 240;  // 128 x 24 + 256 x 240 = 64512 = 384 x 168 (the launch's)
// The registers setmaxnreg moves are the block's as launched (65536 / 384 rounded down to 8: 168 a thread): consumers
// asking for more than the producer gave back wait in setmaxnreg.inc for ever (a hang, not an error).
static_assert(128 * kProducerRegs + 128 * kConsumers * kConsumerRegs <= (65536 / kThreads) / 8 * 8 * kThreads,
              "pws: the warpgroups' register limits exceed the block's launch allocation");

// Shared memory of the block (offsets from a 1024-byte aligned base: the swizzle period; the launcher adds the slack).
// Tiles of NK keys (64 or 128) in SK K slots and SV V slots.
template <int D, int NK, int SK, int SV>
struct Layout {
  static_assert(D == 64 || D == 128 || D == 256, "prefill_ws: D = 64, 128 or 256");
  static_assert(NK == 64 || NK == 128, "prefill_ws: 64 or 128 keys per tile");
  static constexpr int kRows = 64 * kConsumers;
  static constexpr int QTILE = kBox * 2 * D;  // a warpgroup's 64 Q rows of 2 D bytes as 128-byte slabs (swizzled)
  static constexpr int TILE = NK * 2 * D;     // a K or V tile: NK rows, slabs of NK rows x 128 bytes
  static constexpr int SLAB = NK * 128;
  static constexpr int OFF_Q = 0;                        // one Q tile per consumer warpgroup
  static constexpr int OFF_K = kConsumers * QTILE;       // SK K slots
  static constexpr int OFF_V = OFF_K + SK * TILE;        // SV V slots
  static constexpr int OFF_BAR = OFF_V + SV * TILE;      // full / empty mbarriers of the K slots, then the V slots'
  static constexpr int bytes = OFF_BAR + 16 * (SK + SV) + 1024;
};

// The instances the planner may take, per head size: keys per tile and slots, the most that fits 227 KB (the wide
// tiles halve the per-tile work outside the GEMMs: turns, slot barriers, the row max and sum reductions), and
// at D 64 / 128 the 64-key tiles too (ws_keys=64), to compare.
template <int D, int NK = (D == 256 ? 64 : 128)>
struct Inst {
  static constexpr int kKeys = NK;
  static constexpr int SK = D == 256 ? 2 : D == 64 || NK == 64 ? 4 : 3;
  static constexpr int SV = D == 256 ? 3 : D == 64 || NK == 64 ? 4 : 3;
  using L = Layout<D, NK, SK, SV>;
};

// kUniformDesc: the consumer's warpgroup index and each K slot's address broadcast from lane 0 (__shfl_sync), so ptxas
// knows them warp-uniform and builds the Q.K wgmma descriptors in uniform registers. Without it (ks is carried through
// loops whose trip counts ptxas sees as divergent, wg comes from threadIdx) every descriptor is built in vector
// registers and moved over (R2UR), 4-8 more instructions per wgmma: with it the key loop's path per warp and tile
// is 488 instead of 535 instructions at D = 256, 469 / 494 at D = 128, 511 / 531 at D = 64. Only D = 256 gains
// time from it (H100, same process: 1.05-1.07x at 4k-32k keys); at D = 128 and 64 ptxas schedules the loop worse
// and it lost 2-5 % (docs/performance.md).
template <int D>
constexpr bool kUniformDesc = D == 256;

// Named barriers: 1 + w is consumer warpgroup w's turn to issue its GEMMs, 3 + w its Q tile being whole.
constexpr int kTurnBar = 1, kQBar = 3;

// A work item: 128 rows of one (batch, KV head) row space (as a block of prefill_wg.cuh), its keys in nkt tiles of
// NK. ncq > 0: causal with Sq % 128 == 0, items in position-major order (the heaviest query chunk of every head
// first); else row chunks, in reverse under causal masking. Skipped: a V-poisoned head (prefill_wg.cuh's checked
// instance runs it).
struct Item {
  int64_t bh, b, hkv, row0, row_end;
  int nkt;
  bool skip;
};

// Causal items (ncq > 0) in position-major order within groups of kv_group (batch, KV head) pairs, group after group
// (kv_group = B Hkv: over all heads at once, pmma::item_chunk's order). Grouped, the blocks at work stream the K / V
// rows of kv_group KV heads, not of all, through L2: where the items weigh about the same (a chunk over a longer past)
// that is faster; where they do not (Sq = Sk), only the order over all heads keeps the deal balanced (launch_plan.cu).
__device__ __forceinline__ void grouped_chunk(const TileArgs& a, int64_t ncq, int kv_group, int64_t idx, int64_t& bh,
                                              int64_t& chunk) {
  using I = uint32_t;
  const I BH = I(a.B * a.Hkv), g = I(a.g), nc = I(ncq), gk = I(kv_group);
  const I per = gk * g * nc, grp = I(idx) / per, r = I(idx) % per, first = grp * gk;
  const I ug = (BH - first < gk ? BH - first : gk) * g;
  const I level = r / ug, u = r % ug;
  bh = first + u / g;
  chunk = (u % g) * nc + (nc - 1 - level);
}

template <int NK>
__device__ __forceinline__ Item item_at(const TileArgs& a, int64_t ncq, int kv_group, int64_t idx) {
  Item it;
  int64_t chunk;
  if (ncq > 0) grouped_chunk(a, ncq, kv_group, idx, it.bh, chunk);
  else pmma::item_chunk<uint32_t>(a, 0, idx, it.bh, chunk);
  it.skip = a.v_flags[it.bh] != 0;
  it.b = uint32_t(it.bh) / uint32_t(a.Hkv);
  it.hkv = uint32_t(it.bh) % uint32_t(a.Hkv);
  const int64_t rows_here = a.g * a.Sq;
  it.row0 = chunk * 64 * kConsumers;
  it.row_end = it.row0 + 64 * kConsumers < rows_here ? it.row0 + 64 * kConsumers : rows_here;
  int64_t lo, hi;
  pmma::run_kminmax<uint32_t>(a, it.row0, it.row_end, lo, hi);
  const int kend = int(hi + 1 < a.Sk ? hi + 1 : a.Sk);
  it.nkt = kend > 0 ? (kend + NK - 1) / NK : 0;
  return it;
}

// A work item as one consumer warpgroup sees it (the consumers hold this one and the next): its tiles with work (nw:
// from tile nw on no row of the warpgroup sees a key; uniform over it, as wgmma needs), the warp's first causal limit
// (tiles before it need no masking), the head's exponent factor (scale * log2 e, times 2^8 where its K copy holds K
// times 2^-8) and an additive mask's factor into unscaled dot-product units.
struct Ctx {
  int64_t b = 0, hkv = 0, row0 = 0;
  int nkt = 0, nw = 0, kmin_w = 0;
  float c_qk = 0.f, mask_mul = 0.f;

  template <int NK>
  __device__ __forceinline__ static Ctx of(const TileArgs& a, const Item& it, int wg, int warp) {
    Ctx c;
    c.b = it.b, c.hkv = it.hkv, c.row0 = it.row0, c.nkt = it.nkt;
    const int64_t wg0 = it.row0 + 64 * wg, w0 = wg0 + 16 * warp;
    int64_t lo, hi, lo_w, hi_w;
    pmma::run_kminmax<uint32_t>(a, wg0, wg0 + 64 < it.row_end ? wg0 + 64 : it.row_end, lo, hi);
    c.nw = hi < 0 ? 0 : int(hi / NK + 1 < it.nkt ? hi / NK + 1 : it.nkt);
    pmma::run_kminmax<uint32_t>(a, w0, w0 + 16 < it.row_end ? w0 + 16 : it.row_end, lo_w, hi_w);
    c.kmin_w = int(lo_w < 0x7fffffffLL ? lo_w : 0x7fffffffLL);
    c.c_qk = a.scale_log2 * (a.k_flags != nullptr && a.k_flags[it.bh] != 0 ? 256.f : 1.f);
    c.mask_mul = kLog2e / c.c_qk;
    return c;
  }
};

// Which items a block walks: round k holds items k G .. k G + G - 1 (G = gridDim.x, in their heavy-first order), and
// block b takes item k G + b of it, or with `snake` k G + G - 1 - b in odd rounds. Round-robin (no snake) leaves block
// 0 the heaviest item of every round: at 8k keys (32, 8, 128) causal ~6 % of the blocks' time idle at the end (the
// block-finish trace, docs/performance.md); the snake pairs each heavy item with a light one. Producer and consumers
// walk the same deal.
struct Deal {
  int64_t k = 0;  // the round
  bool snake;
  __device__ __forceinline__ explicit Deal(bool s) : snake(s) {}
  __device__ __forceinline__ int64_t item() const {
    const int64_t G = gridDim.x;
    return k * G + (snake && (k & 1) ? G - 1 - blockIdx.x : blockIdx.x);
  }
};

// One block per item where the grid covers them, or persistent (one block per SM walking the items as Deal deals
// them), so the producer loads the next item's first tiles while the consumers store this one's rows.
template <int D, int NK, int SK, int SV>
__global__ void __launch_bounds__(kThreads, 1)
    prefill_ws_kernel(const TileArgs a, const int64_t ncq, const int64_t n_items, const int order,
                      const __grid_constant__ TmaMaps tm) {
#if defined(D4A_WGMMA)
  using L = Layout<D, NK, SK, SV>;
  constexpr int kKeys = NK;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + smem_pad1024(smem_raw);
  // `order`, bit 0: the snake deal (Deal); above it item_at's KV-head groups (0: all heads, one group)
  const int kv_group = (order >> 1) > 0 ? (order >> 1) : int(a.B * a.Hkv);
  // warpgroups 0, 1: consumers; 2: the producer (kUniformDesc: broadcast from lane 0, so ptxas knows it is uniform)
  const int tid = threadIdx.x, wg = kUniformDesc<D> ? __shfl_sync(0xffffffffu, tid >> 7, 0) : tid >> 7;
  const int64_t rows_here = a.g * a.Sq;

  const unsigned bars = smem_u32(smem + L::OFF_BAR);
  auto full_k = [&](int i) { return bars + 8u * unsigned(i); };
  auto empty_k = [&](int i) { return bars + 8u * unsigned(SK + i); };
  auto full_v = [&](int i) { return bars + 8u * unsigned(2 * SK + i); };
  auto empty_v = [&](int i) { return bars + 8u * unsigned(2 * SK + SV + i); };
  if (tid == 0) {
    for (int i = 0; i < SK; ++i) {
      mbar_init(full_k(i), 1);
      mbar_init(empty_k(i), 4 * kConsumers);
    }
    for (int i = 0; i < SV; ++i) {
      mbar_init(full_v(i), 1);
      mbar_init(empty_v(i), 4 * kConsumers);
    }
    mbar_init_fence();
  }
  __syncthreads();
  pdl_wait();  // a programmatic dependent of K's copy (ws_qk16): the copy and the flags are complete from here on
  pdl_launch_dependents();  // the checked companion may launch (it waits for this kernel's end)

  if (wg == kConsumers) {  // ---- the producer: one thread issues every tile's copies, item after item ----
    wg_regs_dec<kProducerRegs>();
    if (tid == 128 * kConsumers) {
      int64_t g = 0;  // tiles issued so far (the slots' phases run on across items)
      for (Deal d((order & 1) != 0); d.k * gridDim.x < n_items; ++d.k) {
        const int64_t idx = d.item();
        if (idx >= n_items) continue;  // the last round's hole
        const Item it = item_at<NK>(a, ncq, kv_group, idx);
        if (it.skip) continue;
        // the item's Q rows (contiguous: rows row0 .. row_end - 1 of its (batch, KV head)'s g Sq) toward L2 while the
        // consumers finish the item before, so their stage_q waits for L2, not DRAM
        const uint16_t* q = static_cast<const uint16_t*>(a.q) + (it.bh * rows_here + it.row0) * D;
        if ((reinterpret_cast<uintptr_t>(q) & 15) == 0) bulk_prefetch_l2(q, uint32_t(it.row_end - it.row0) * 2 * D);
        const int z = int(it.bh);
        for (int t = 0; t < it.nkt; ++t, ++g) {  // keys past Sk arrive as zeros and are masked like any other
          const int sk = int(g % SK), sv = int(g % SV), y = t * kKeys;
          if (g >= SK) mbar_wait(empty_k(sk), unsigned(g / SK - 1) & 1u);  // the consumers gave tile g - SK back
          mbar_arrive_expect(full_k(sk), L::TILE);
#pragma unroll
          for (int x = 0; x < 2 * D; x += 128)  // a slab of NK rows: NK / 64 boxes, 8 KB apart
#pragma unroll
            for (int h = 0; h < kKeys; h += kBox)
              tma_load_3d_plain(smem_u32(smem + L::OFF_K + sk * L::TILE + (x / 128) * L::SLAB + h * 128), &tm.k, x,
                                y + h, z, full_k(sk));
          if (g >= SV) mbar_wait(empty_v(sv), unsigned(g / SV - 1) & 1u);
          mbar_arrive_expect(full_v(sv), L::TILE);
#pragma unroll
          for (int x = 0; x < 2 * D; x += 128)
#pragma unroll
            for (int h = 0; h < kKeys; h += kBox)
              tma_load_3d_plain(smem_u32(smem + L::OFF_V + sv * L::TILE + (x / 128) * L::SLAB + h * 128), &tm.v, x,
                                y + h, z, full_v(sv));
        }
      }
    }
    return;
  }

  // ---- the consumers ----
  wg_regs_inc<kConsumerRegs>();
  const int warp = (tid >> 5) & 3, lane = tid & 31, gid = lane >> 2, tig = lane & 3;
  const int rl0 = 64 * wg + 16 * warp + gid;  // this thread's rows: rl0, rl0 + 8 of the item's 128
  uint8_t* qt = smem + L::OFF_Q + wg * L::QTILE;
  const unsigned q_addr = smem_u32(qt);
  int ks = 0, vs = 0;         // the K slot of the next tile, the V slot of the oldest tile not given back
  unsigned kph = 0, vph = 0;  // their phases (running on across items, as the producer's)
  auto give_back = [&](unsigned bar) {
    __syncwarp();
    if (lane == 0) mbar_arrive(bar);
  };
  // The turn on the tensor cores: K landed, then this warpgroup's turn (warpgroup 1 opens warpgroup 0's first turn,
  // and warpgroup 0 takes one more turn at the end, so every arrival on the pair is consumed).
  auto turn = [&]() {
    mbar_wait(full_k(ks), kph);
    named_bar_sync(kTurnBar + wg, 256);
  };
  auto pass = [&]() { named_bar_arrive(kTurnBar + 1 - wg, 256); };
  auto k_tile = [&]() {  // the K slot's address (kUniformDesc: broadcast from lane 0)
    const unsigned k = smem_u32(smem + L::OFF_K + ks * L::TILE);
    return kUniformDesc<D> ? __shfl_sync(0xffffffffu, k, 0) : k;
  };
  auto next_k = [&]() {
    if (++ks == SK) ks = 0, kph ^= 1u;
  };
  auto next_v = [&]() {
    if (++vs == SV) vs = 0, vph ^= 1u;
  };
  if (wg == 1) named_bar_arrive(kTurnBar, 256);

  // Across items: an item's first Q.K is issued with the item before's last P.V, whose rows are stored after this
  // softmax; the next item's Q rows are copied in (cp.async) once this item's tiles with work are done and
  // quantized in place before the next item's first turn. So the item boundary is one more tile of the warpgroup's
  // pipeline, not a drain (last P.V, store, Q, first Q.K and softmax in sequence) that the ping-pong would pass on
  // to the other warpgroup (1-2 % at D 64 / 128, 5-7 % at D = 256 against a loop item by item, docs/performance.md).
  Deal d((order & 1) != 0);
  auto find = [&]() -> int64_t {  // the next item of this block's deal (the producer's walk), or -1
    for (; d.k * gridDim.x < n_items; ++d.k) {
      const int64_t idx = d.item();
      if (idx >= n_items || item_at<NK>(a, ncq, kv_group, idx).skip) continue;
      ++d.k;
      return idx;
    }
    return -1;
  };
  // c's Q rows of this warp into the warpgroup's Q tile: copied (load_q), later quantized in place (stage_done)
  auto load = [&](const Item& n) {
    pwg::load_q<D>(a, n.b, n.hkv, n.row0 + 64 * wg + 16 * warp, rows_here, qt, 16 * warp, lane);
  };
  auto stage_done = [&]() {
    pwg::quantize_q<D>(qt, 16 * warp, lane);
    fence_proxy_async_smem();         // the generic stores of Q before the wgmma reads them
    named_bar_sync(kQBar + wg, 128);  // the warpgroup's Q tile is whole
  };
  pwg::OAcc<D> o;
  auto zero_o = [&]() {
#pragma unroll
    for (int p = 0; p < pwg::OShape<D>::P; ++p)
#pragma unroll
      for (int n = 0; n < pwg::OShape<D>::N; ++n) o[p][n][0] = o[p][n][1] = o[p][n][2] = o[p][n][3] = 0.f;
  };
  pwg::RowSoftmax st;
  float alpha[2] = {1.f, 1.f};  // O's factor before the next P.V (the last softmax's)
  bool rescale = false;
  uint32_t pa[kKeys / 16][4];   // P of the last tile with work, waiting for its P.V
  bool pend = false;            // pa waits: the last tile of item `done`, whose rows are stored after that P.V
  int64_t done_q = 0;  // item `done`: the output row of its row space's first row, and this thread's row there
  int done_r = 0;
  auto softmax = [&](float (&s)[kKeys / 8][4], int t, const Ctx& c) {
    const int j0 = t * kKeys;
    if (a.mask_kind != 0 || j0 + kKeys - 1 > c.kmin_w)
      pwg::mask_tile<kKeys, uint32_t>(a, s, c.b, c.hkv, c.row0 + rl0, rows_here, j0, tig, c.mask_mul);
    rescale = st.update<kKeys>(s, c.c_qk, alpha);
  };
  auto issue_pending_pv = [&]() {
    if (rescale) pwg::rescale_o<D>(o, alpha);
    mbar_wait(full_v(vs), vph);
    pwg::pv_issue<D, kKeys>(o, pa, smem_u32(smem + L::OFF_V + vs * L::TILE));
  };
  auto store_done = [&](const pwg::RowSoftmax& s_done) {  // after the pending P.V's wait_o: item done's rows
    pwg::store_o_rows<D>(a, o, s_done, done_q, done_r, rows_here, tig);
  };

  int64_t idx = find();
  Ctx cur;
  if (idx >= 0) {
    const Item it = item_at<NK>(a, ncq, kv_group, idx);
    cur = Ctx::of<NK>(a, it, wg, warp);
    load(it);
    stage_done();
  }
  zero_o();
  while (idx >= 0) {
    const int64_t nidx = find();  // the next item
    // ---- cur's tiles with work. The loop is peeled so that no wgmma sits under a condition inside it (ptxas
    // serializes wgmma whose registers a divergent path may touch): tile 0's Q.K with the pending P.V or alone, then
    // Q.K(t) with P.V(t - 1). (Two ifs, not an if / else: that form spilled.) ----
    int t = 0;
    if (cur.nw > 0) {
      float s[kKeys / 8][4];
      if (pend) {  // tile 0's Q.K with the item before's last P.V; its rows go out after this softmax
        // (O rescaled before the Q.K goes out: a rescale under this condition with a wgmma in flight makes ptxas
        // serialize every wgmma of the kernel)
        if (rescale) pwg::rescale_o<D>(o, alpha);
        turn();
        pwg::qk_issue<D, kKeys>(s, q_addr, k_tile());
        mbar_wait(full_v(vs), vph);
        pwg::pv_issue<D, kKeys>(o, pa, smem_u32(smem + L::OFF_V + vs * L::TILE));
        pass();
        wgmma_wait<1>();
        pwg::fence_s<kKeys>(s);
        give_back(empty_k(ks));
        next_k();
        const pwg::RowSoftmax st_done = st;
        st = pwg::RowSoftmax();
        softmax(s, 0, cur);
        pwg::wait_o<D>(o);
        give_back(empty_v(vs));
        next_v();
        store_done(st_done);
        zero_o();
        pwg::p_frags<kKeys>(pa, s);
        t = 1;
      }
      if (!pend) {  // tile 0's Q.K alone
        turn();
        pwg::qk_issue<D, kKeys>(s, q_addr, k_tile());
        pass();
        wgmma_wait<0>();
        pwg::fence_s<kKeys>(s);
        give_back(empty_k(ks));
        next_k();
        st = pwg::RowSoftmax();
        softmax(s, 0, cur);
        pwg::p_frags<kKeys>(pa, s);
        t = 1;
      }
      for (; t < cur.nw; ++t) {  // Q.K(t) with P.V(t - 1)
        turn();
        pwg::qk_issue<D, kKeys>(s, q_addr, k_tile());
        issue_pending_pv();
        pass();
        wgmma_wait<1>();  // the Q.K (the older group) is done; the P.V may still run
        pwg::fence_s<kKeys>(s);
        give_back(empty_k(ks));
        next_k();
        softmax(s, t, cur);
        pwg::wait_o<D>(o);
        give_back(empty_v(vs));
        next_v();
        pwg::p_frags<kKeys>(pa, s);
      }
      pend = true;
      done_q = pwg::q_space_row(a, cur.b, cur.hkv);
      done_r = int(cur.row0) + rl0;
    } else {  // no row of this warpgroup sees a key of the item: zeros (what store_o gives such rows)
      pwg::store_zero<D>(a, cur.b, cur.hkv, cur.row0 + rl0, rows_here, tig);
    }
    // ---- the next item's Q rows on their way (cur's last Q.K has completed) ----
    Ctx nxt;
    if (nidx >= 0) {
      const Item n = item_at<NK>(a, ncq, kv_group, nidx);
      nxt = Ctx::of<NK>(a, n, wg, warp);
      load(n);
    }
    // ---- cur's tiles no row of this warpgroup sees: the first takes the pending P.V into its turn; the V is
    // waited for before its slot goes back ----
    if (t < cur.nkt && pend) {
      turn();
      issue_pending_pv();
      pass();
      give_back(empty_k(ks));
      next_k();
      pwg::wait_o<D>(o);
      give_back(empty_v(vs));
      next_v();
      store_done(st);
      zero_o();
      pend = false;
      mbar_wait(full_v(vs), vph);
      give_back(empty_v(vs));
      next_v();
      ++t;
    }
    for (; t < cur.nkt; ++t) {
      turn();
      pass();
      give_back(empty_k(ks));
      next_k();
      mbar_wait(full_v(vs), vph);
      give_back(empty_v(vs));
      next_v();
    }
    idx = nidx;
    cur = nxt;
    if (idx >= 0) stage_done();
  }
  if (pend) {  // the last item's last P.V
    issue_pending_pv();
    pwg::wait_o<D>(o);
    give_back(empty_v(vs));
    next_v();
    store_done(st);
  }
  if (wg == 0) named_bar_sync(kTurnBar, 256);  // warpgroup 1's last pass (or its opening arrival)
#else
  (void)a;
  (void)ncq;
  (void)n_items;
  (void)order;
  (void)tm;
  __trap();
#endif
}

}  // namespace pws
}  // namespace gpu
}  // namespace dot4attn

#endif  // D4A_CUDA
