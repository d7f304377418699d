#!/usr/bin/env bash
# Nsight Compute profile of the decode kernels (H200): duration, occupancy, warp stall reasons and scheduler
# statistics and memory workload (DRAM throughput, L1/L2 sectors) of the decode and merge kernels at (32, 8, 128),
# q4_0 V, 512 and 16k keys unless the extra args say otherwise (e.g. --sk 131072). build/gpu must be built.
# Usage (repo root on the device): OUT=/some/dir tools/gpu_profile_decode.sh [extra gpu_time_decode.py args]
set -u
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD/python DOT4ATTN_LIBRARY=$PWD/build/gpu/libdot4attn_ops.so
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
timeout 240 "$NCU" --target-processes all -k regex:"decode|merge" -c 12 --section SpeedOfLight --section Occupancy \
  --section LaunchStats --section WarpStateStats --section SchedulerStats \
  --section MemoryWorkloadAnalysis \
  python3 tools/gpu_time_decode.py --heads 32,8,128 --sk 512,16384 --formats q4_0 --repeats 1 "$@" > "$OUT/ncu.log" 2>&1
echo "ncu rc=$?"; grep -E "decode_mma_kernel|merge_kernel|Duration|Registers Per|Achieved Occupancy|Theoretical Occ|Block Limit|Issue Slot|Warp Cycles Per Issued|No Eligible|Stall|DRAM Throughput|Memory Throughput|Mem Busy|Max Bandwidth|L1/TEX Hit|L2 Hit|Mem Pipes" "$OUT/ncu.log" | head -160
