#!/usr/bin/env bash
# Runs the GPU suite's representative set under compute-sanitizer's four tools (memcheck, racecheck, synccheck,
# initcheck) on a CUDA machine; any report fails the run.
#
# Usage: tools/sanitize_gpu.sh [TOOL ...]       (default: memcheck racecheck synccheck initcheck)
#   PYTHON   the interpreter with onnxruntime-gpu, torch, numpy, pytest (default python3)
#   DOT4ATTN_LIBRARY  the CUDA build of libdot4attn_ops.so (as for tests/gpu)
#   WORKERS  pytest-xdist worker processes (>= 1), each one tracked by the sanitizer (default 8 where pytest-xdist is
#            installed, else one process). Each process's first test pays the tool's instrumentation of the library
#            (20-60 s), so one process takes the set past 6 minutes where 8 take 64-87 s per tool (H100).
#
# The set (tests/gpu): test_ort_cuda's sanitizer cases (every route of seven case-table entries: left padding,
# bias, Sq = 300 prefill, split_k over 4099 keys with its scratch, Sk = 0, dead mask rows, scale + mask; PackK and
# PackV), Dot4GroupQueryAttention appending in place on device buffers (split_k over two and four batch rows, one
# and several valid lengths), the split_k merge from concurrent sessions, and a NaN in one V row on every route and V
# format plus float16 V blocks of +-65504 (the kernels' rare paths that zero V in shared memory), and the float16-V
# prefill's V scan with two of four heads poisoned (scan forced on, off, automatic), and Dot4GroupQueryAttention's
# prologue rotating rotate-half and interleaved pairs at full and partial widths. Each tool runs the set once.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}
tools=("$@")
[[ ${#tools[@]} -gt 0 ]] || tools=(memcheck racecheck synccheck initcheck)
command -v compute-sanitizer >/dev/null || { echo "sanitize_gpu: compute-sanitizer not found" >&2; exit 2; }
select=(tests/gpu/test_ort_cuda.py tests/gpu/test_cache_cuda.py tests/gpu/test_properties_cuda.py)
filter="sanitizer or split_k-B2 or one-length-run or split_merge_concurrent or nonfinite_v or fp16_max_v or prefill_v_scan or rotary_widths"
cd "$root"
workers=${WORKERS:-8}
[[ $workers =~ ^[1-9][0-9]*$ ]] || { echo "sanitize_gpu: WORKERS must be an integer >= 1, got '$workers'" >&2; exit 2; }
parallel=()
"$python" -c "import xdist" 2>/dev/null && [[ $workers -gt 1 ]] && parallel=(-n "$workers")
status=0
for tool in "${tools[@]}"; do
  # (initcheck also shows that the cache rows past a batch row's valid length, never written, are never read.)
  extra=()
  [[ $tool == racecheck ]] && extra=(--racecheck-report all)
  t0=$(date +%s)
  log=$(mktemp)
  compute-sanitizer --tool "$tool" --target-processes all --error-exitcode 97 "${extra[@]}" \
    "$python" -m pytest -q -p no:cacheprovider "${parallel[@]}" -k "$filter" "${select[@]}" >"$log" 2>&1
  rc=$?
  errors=$(grep -E "ERROR SUMMARY: [0-9]+ error|RACECHECK SUMMARY: [0-9]+ hazard" "$log" | tail -2 | tr '\n' ' ')
  echo "sanitize_gpu: $tool: pytest/sanitizer exit $rc, $(date -d@$(( $(date +%s) - t0 )) -u +%M:%S), $errors"
  grep -E "passed|failed" "$log" | tail -1
  if [[ $rc -ne 0 ]]; then
    status=1
    grep -E "=========|Invalid|Hazard|Uninitialized|Barrier" "$log" | head -40
  fi
  rm -f "$log"
done
exit $status
