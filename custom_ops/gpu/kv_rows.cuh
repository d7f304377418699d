// The walk of the passes that read (or rewrite) every K / V row of a call once before a long prefill: the V scan
// (v_scan.cuh), the K scale scan and K copy (k_dequant.cuh), the V copy (v_dequant.cuh).
//
// Why its own walk: these passes are memory-bound only if the per-element work stays small and the loads overlap.
// Splitting a flat element index into (batch, KV head), key and piece takes 64-bit divisions by runtime values, ~70
// instructions each, several per 16-byte piece: more than the conversion itself. Here a block owns a run of
// kRowKeys keys of one (batch, KV head) (one division per block), a row's pieces are a compile-time number, and each
// thread's pieces of a run are a compile-time count, so a pass loads them all before it converts and stores any (a
// store between two loads would keep the second from being issued early: the compiler cannot tell the buffers apart).
#pragma once

#include <cstdint>

#include "gpu/attention_tile.cuh"

namespace dot4attn {
namespace gpu {

constexpr int kScanThreads = 256;
constexpr int kRowKeys = 64;  // keys per run: 1024 pieces of 16 bytes at D = 128 (float16 rows), 4 per thread

// Blocks of a row pass over keys < Sk of every (batch, KV head), capped (the blocks then stride over the runs).
inline unsigned row_pass_blocks(const TileArgs& a) {
  const int64_t n = a.B * a.Hkv * ((a.Sk + kRowKeys - 1) / kRowKeys);
  return unsigned(n < (int64_t(1) << 20) ? n : (int64_t(1) << 20));
}

// The pieces of a run per thread (PR pieces per row).
template <int PR>
constexpr int kRunPieces = (kRowKeys * PR + kScanThreads - 1) / kScanThreads;

// f(i, j, c) for piece i < kRunPieces<PR> of this thread in a run of nk keys: u = threadIdx.x + i * kScanThreads,
// its key j = u / PR of the run and piece c = u % PR of the row, where u < nk * PR.
template <int PR, typename F>
__device__ __forceinline__ void for_each_run_piece(int nk, F&& f) {
#pragma unroll
  for (int i = 0; i < kRunPieces<PR>; ++i) {
    const int u = int(threadIdx.x) + i * kScanThreads;
    if (u < nk * PR) f(i, u / PR, u % PR);
  }
}

// f(bh, r0, nk) for each run of this block: rows r0 .. r0 + nk - 1 (key j of (b, kv head) bh is row bh * kv_rows + j),
// keys < Sk only (a strided cache's rows past them are not the call's); its pieces: for_each_run_piece.
template <typename F>
__device__ __forceinline__ void for_each_key_run(const TileArgs& a, F&& f) {
  const int64_t nblk = (a.Sk + kRowKeys - 1) / kRowKeys, total = a.B * a.Hkv * nblk;
  for (int64_t blk = int64_t(blockIdx.x); blk < total; blk += int64_t(gridDim.x)) {
    const int64_t bh = blk / nblk, j0 = (blk - bh * nblk) * kRowKeys;
    f(bh, bh * a.kv_rows + j0, int(a.Sk - j0 < kRowKeys ? a.Sk - j0 : kRowKeys));
  }
}

// Rows r0 .. r0 + nk - 1 converted into 16-byte pieces of out (float16 rows, 2 D bytes apart, the rows' own
// indices): this thread's pieces loaded (raw = load(r, c)) before any is converted (cvt(raw, c)) and stored.
template <int D, typename Load, typename Cvt>
__device__ __forceinline__ void run_to_f16(uint8_t* out, int64_t r0, int nk, Load&& load, Cvt&& cvt) {
  constexpr int PR = D / 8, N = kRunPieces<PR>;
  decltype(load(r0, 0)) raw[N];
  for_each_run_piece<PR>(nk, [&](int i, int j, int c) { raw[i] = load(r0 + j, c); });
  for_each_run_piece<PR>(nk, [&](int i, int j, int c) {
    *reinterpret_cast<uint4*>(out + (r0 + j) * (2 * D) + 16 * c) = cvt(raw[i], c);
  });
}

// Every run of the block's rows through run_to_f16, with ctx = prep(bh) once per run (cvt(raw, c, ctx)).
template <int D, typename Prep, typename Load, typename Cvt>
__device__ __forceinline__ void rows_to_f16(const TileArgs& a, uint8_t* out, Prep&& prep, Load&& load, Cvt&& cvt) {
  for_each_key_run(a, [&](int64_t bh, int64_t r0, int nk) {
    const auto ctx = prep(bh);
    run_to_f16<D>(out, r0, nk, load, [&](const auto& raw, int c) { return cvt(raw, c, ctx); });
  });
}

}  // namespace gpu
}  // namespace dot4attn
