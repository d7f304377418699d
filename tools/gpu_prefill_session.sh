#!/usr/bin/env bash
# One device session for the tensor-core prefill kernel (H200, CUDA 13, no ORT): build, correctness table,
# timing vs SDPA flash / cuDNN (and the old tile kernel), tuning variants, compute-sanitizer memcheck /
# racecheck on the small set. Logs into $OUT. Usage (repo root, carry .ort):
#   OUT=/some/dir [STEPS="build check time variants sanitize"] tools/gpu_prefill_session.sh
set -u
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
STEPS=${STEPS:-build check time variants sanitize}
export PYTHONPATH=$PWD/python DOT4ATTN_LIBRARY=$PWD/build/gpu/libdot4attn_ops.so
CS=/usr/local/cuda/bin/compute-sanitizer
has() { [[ " $STEPS " == *" $1 "* ]]; }
step() { local name=$1 t=$2; shift 2; echo "== $name ($(date +%T))"; timeout "$t" "$@" > "$OUT/$name.log" 2>&1; echo "rc=$?"; tail -4 "$OUT/$name.log"; }
has build && step build 300 bash -c "cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DDOT4ATTN_ORT_INCLUDE_DIR=$PWD/.ort/include/onnxruntime -DCMAKE_CUDA_ARCHITECTURES=90a-real && cmake --build build/gpu -j16"
has check && step check 200 python3 tools/gpu_check_prefill.py --out "$OUT/check.md"
# the tuning variants must be correct too (CHECK_VARIANTS: env assignments separated by ';'; default: the cp.async
# tiles that sm_80 and a refused tensor map use, the mma.sync P.V of builds without sm_90a, and the 2-block register
# budget, since the H200 otherwise only runs TMA tiles with the wgmma P.V at 3 blocks per SM for f16 V)
IFS=";" read -ra cvs <<< "${CHECK_VARIANTS-DOT4ATTN_PREFILL_TMA=0;DOT4ATTN_PREFILL_WGMMA=0;DOT4ATTN_PREFILL_MINB=2}"
has check && for v in "${cvs[@]}"; do n=$(echo "$v" | tr ' =' '__')
  step "check_$n" 200 env $v python3 tools/gpu_check_prefill.py --out "$OUT/check_$n.md"
done
has time && step time 200 python3 tools/gpu_time_prefill.py --baselines --tile --tile-max 2048 --out "$OUT/time.json"
if has variants; then
  IFS=";" read -ra tvs <<< "${TIME_VARIANTS:-DOT4ATTN_PREFILL_MINB=2;DOT4ATTN_PREFILL_WGMMA=0;DOT4ATTN_PREFILL_TMA=0;DOT4ATTN_PREFILL_MT=2}"
  for v in "${tvs[@]}"; do n=$(echo "$v" | tr ' =' '__')
    step "var_$n" 60 env $v python3 tools/gpu_time_prefill.py --heads "32,8,128;24,4,256" --s 8192 --label "$v" --out "$OUT/var_$n.json"
  done
fi
if has sanitize; then
  step memcheck 150 $CS --tool memcheck --leak-check no python3 tools/gpu_check_prefill.py --small
  step racecheck 150 $CS --tool racecheck python3 tools/gpu_check_prefill.py --small
fi
echo "== end $(date +%T)"
