#!/usr/bin/env bash
# Nsight Compute profiles of the decode kernels (H200); build/gpu must be built. Three modes (MODE=...):
#   sections  (default) duration, occupancy, warp stall reasons, scheduler statistics and memory workload (DRAM
#             throughput, L1/L2 sectors) of the decode and merge kernels -> $OUT/ncu.log
#   durations per-launch kernel durations at boost clocks (--clock-control none: the sections mode runs at ~1.35 GHz)
#             of the decode and merge kernels -> $OUT/dur.log, summarised on stdout
#   source    per-SASS-instruction stall samples and executed instructions of one decode kernel launch (CSV; find
#             where a block's time goes: prologue / key loop / finish) -> $OUT/source.csv.gz
# Default shapes: (32, 8, 128), q4_0 V, 512 and 16k keys; extra args go to tools/gpu_time_decode.py (the last --sk /
# --formats win, e.g. --sk 131072 or --formats q4_0,float).
# Usage (repo root on the device): OUT=/some/dir [MODE=durations] tools/gpu_profile_decode.sh [extra args]
set -u
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD/python DOT4ATTN_LIBRARY=$PWD/build/gpu/libdot4attn_ops.so
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
T=(python3 tools/gpu_time_decode.py --heads 32,8,128 --sk 512,16384 --formats q4_0 --repeats 1 "$@")
case ${MODE:-sections} in
  sections)
    timeout 240 "$NCU" --target-processes all -k regex:"decode|merge" -c 12 --section SpeedOfLight --section Occupancy \
      --section LaunchStats --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
      "${T[@]}" > "$OUT/ncu.log" 2>&1
    echo "ncu rc=$?"
    grep -E "decode_mma_kernel|merge_kernel|Duration|Registers Per|Achieved Occupancy|Theoretical Occ|Block Limit|Issue Slot|Warp Cycles Per Issued|No Eligible|Stall|DRAM Throughput|Memory Throughput|Mem Busy|Max Bandwidth|L1/TEX Hit|L2 Hit|Mem Pipes" \
      "$OUT/ncu.log" | head -160 ;;
  durations)
    timeout 200 "$NCU" --clock-control none --metrics gpu__time_duration.sum,launch__grid_size -k regex:"decode|merge" \
      "${T[@]}" > "$OUT/dur.log" 2>&1
    echo "ncu rc=$?"
    grep -E "^  (void |unnamed>::merge_kernel)|^    (gpu__time_duration|launch__grid_size)" "$OUT/dur.log" \
      | sed -E 's/\(TileArgs\).*//; s/\(const float \*.*//' | awk '{$1=$1; print}' \
      | paste - - - \
      | awk '{n = ""; for (i = 1; i <= NF && $i != "gpu__time_duration.sum"; ++i) n = n " " $i; print n, "grid", $NF, "us", $(NF-2)}' \
      | head -80 ;;
  source)
    timeout 200 "$NCU" --set none --section WarpStateStats --section SourceCounters --page source --print-source sass \
      --csv -c 1 -k regex:decode "${T[@]}" > "$OUT/source.csv" 2>&1
    echo "ncu rc=$?"; gzip -f "$OUT/source.csv"; ls -la "$OUT/source.csv.gz" ;;
  *) echo "MODE: sections, durations or source"; exit 2 ;;
esac
