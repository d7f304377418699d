#!/usr/bin/env bash
# One device session for the decode kernels (H200, CUDA 13, no ORT): build, correctness table (tensor-core kernel
# for float16, SIMT kernel for float32, and the SIMT kernel forced for float16 too), timing (tensor-core vs SIMT
# kernel, tuning variants), compute-sanitizer memcheck / racecheck on the small set. Logs into $OUT.
# Usage (repo root, carry .ort): OUT=/some/dir [TIME_OLD=0] [RACECHECK=0] [VARIANTS="8 2;4 3"] tools/gpu_decode_session.sh
# (VARIANTS: "warps stages" pairs forced through DOT4ATTN_DECODE_NW / _NST)
set -u
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD/python DOT4ATTN_LIBRARY=$PWD/build/gpu/libdot4attn_ops.so
CS=/usr/local/cuda/bin/compute-sanitizer
step() { local name=$1 t=$2; shift 2; echo "== $name ($(date +%T))"; timeout "$t" "$@" > "$OUT/$name.log" 2>&1; echo "rc=$?"; tail -3 "$OUT/$name.log"; }
step build 240 bash -c "cmake -S . -B build/gpu -G Ninja -DDOT4ATTN_ORT_INCLUDE_DIR=$PWD/.ort/include/onnxruntime -DCMAKE_CUDA_ARCHITECTURES=90a-real && cmake --build build/gpu -j16"
step check 120 python3 tools/gpu_check_decode.py --out "$OUT/check.md"
step check_streams 120 python3 tools/gpu_check_decode.py --streams
DOT4ATTN_GPU_DECODE=simt step check_simt 120 python3 tools/gpu_check_decode.py --out "$OUT/check_simt.md"
step time_new 60 python3 tools/gpu_time_decode.py --baselines --label new --out "$OUT/time_new.json"
[[ ${TIME_OLD:-1} == 1 ]] && DOT4ATTN_GPU_DECODE=simt step time_old 40 python3 tools/gpu_time_decode.py --label simt --out "$OUT/time_old.json"
step memcheck 120 $CS --tool memcheck --leak-check no python3 tools/gpu_check_decode.py --small
IFS=";" read -ra cfgs <<< "${VARIANTS:-8 2;8 3;4 3;4 2;2 3}"
for cfg in "${cfgs[@]}"; do set -- $cfg
  DOT4ATTN_DECODE_NW=$1 DOT4ATTN_DECODE_NST=$2 step "time_nw$1_nst$2" 30 python3 tools/gpu_time_decode.py \
    --heads 32,8,128 --sk 512,16384,131072 --label "nw$1 nst$2" --out "$OUT/time_nw$1_nst$2.json"
done
[[ ${RACECHECK:-1} == 1 ]] && step racecheck 100 $CS --tool racecheck python3 tools/gpu_check_decode.py --small
echo "== end $(date +%T)"
# few files come back from the device: everything in one archive besides the two main results
(cd "$OUT" && tar czf /tmp/all.tgz --exclude all.tgz . && mv /tmp/all.tgz . && find . -type f ! -name all.tgz ! -name check.md ! -name time_new.json -delete)
