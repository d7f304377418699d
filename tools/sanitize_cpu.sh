#!/usr/bin/env bash
# Builds the CPU op library with AddressSanitizer + UndefinedBehaviorSanitizer (DOT4ATTN_SANITIZE) and runs the
# CPU op tests in ONNX Runtime against it. Any sanitizer report fails the run: -fno-sanitize-recover=all makes
# UBSan abort, ASan stops at its first error, and the log is searched for reports as well (a report inside a
# subprocess that a test expects to fail would otherwise pass unnoticed).
#
# Usage: tools/sanitize_cpu.sh [BUILD_DIR]        (default build/sanitize-cpu)
#   PYTHON       the interpreter with onnxruntime, numpy, pytest (default .venv/bin/python)
#   SANITIZE_TESTS  the pytest files (default below); SANITIZE_K  a pytest -k filter (default "not scalar");
#   SANITIZE_JOBS  build jobs (default 2)
#
# The host process (python, onnxruntime) is not instrumented, so the ASan runtime is LD_PRELOADed. Leak checking
# is off: python and ONNX Runtime keep allocations alive until exit on purpose, and those are not ours.
#
# What runs (the whole CPU op suite under ASan took > 25 minutes on 2 cores, mostly the scalar ISA path, whose
# byte-by-byte loops ASan instruments on every access; this selection keeps the CI step near 5 minutes):
#   every test below except those forced onto the scalar ISA (-k "not scalar"): the SIMD paths (AVX2, and
#   AVX-512 VNNI where the CPU has it) share the tile driver, row blocks, masks and split merges with the scalar
#   path, which only differs in its inner dot/exp loops; those are exercised unforced by the non-x86 build only.
#   tests/ops/test_attention.py  every case of the case table on every route
#   tests/ops/test_cache_attention.py  Dot4GroupQueryAttention: prompt + decode, in-place appends, bad inputs
#   tests/ops/test_gqa_contract.py  Dot4GroupQueryAttention's refusals at kernel creation, its norm epsilons
#   tests/ops/test_errors.py      every refusal (the error paths free what they allocated)
#   tests/ops/test_pack.py        PackK/PackV shapes, values, empty tensors, every ISA
#   tests/ops/test_concurrency.py one session from 8 threads (thread_local scratch, the ORT thread pool)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build/sanitize-cpu}
python=${PYTHON:-$root/.venv/bin/python}
tests=${SANITIZE_TESTS:-tests/ops/test_attention.py tests/ops/test_cache_attention.py tests/ops/test_gqa_contract.py \
tests/ops/test_errors.py tests/ops/test_pack.py tests/ops/test_concurrency.py}

t0=$(date +%s)
cmake -S "$root" -B "$build" -DDOT4ATTN_CUDA=OFF -DDOT4ATTN_HIP=OFF -DCMAKE_BUILD_TYPE=Release \
  -DDOT4ATTN_SANITIZE=address,undefined >/dev/null
cmake --build "$build" -j"${SANITIZE_JOBS:-2}"
lib=$build/libdot4attn_ops.so
[[ -f $lib ]] || { echo "sanitize_cpu: $lib was not built" >&2; exit 2; }
t1=$(date +%s)

asan_rt=$(gcc -print-file-name=libasan.so)
[[ -f $asan_rt ]] || { echo "sanitize_cpu: no libasan.so from gcc -print-file-name ($asan_rt)" >&2; exit 2; }
# libstdc++ is preloaded right after the ASan runtime: python itself does not link it, so without it the runtime's
# __cxa_throw interceptor finds no real __cxa_throw at start-up and the first C++ exception (ONNX Runtime's or
# ours, on every error path) aborts with "CHECK failed: real___cxa_throw != 0".
cxx_rt=$(readlink -f "$(gcc -print-file-name=libstdc++.so)")
[[ -f $cxx_rt ]] || { echo "sanitize_cpu: no libstdc++.so from gcc -print-file-name ($cxx_rt)" >&2; exit 2; }
log=$build/sanitize-tests.log
cd "$root"
set +e
# shellcheck disable=SC2086  # $tests is a word list on purpose
LD_PRELOAD="$asan_rt $cxx_rt" \
ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:halt_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1 \
UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
DOT4ATTN_LIBRARY=$lib PYTHONPATH=$root/python \
  "$python" -m pytest -q -p no:cacheprovider -k "${SANITIZE_K-not scalar}" $tests 2>&1 \
  | tee "$log"
rc=${PIPESTATUS[0]}
set -e
t2=$(date +%s)
reports=$(grep -cE "ERROR: AddressSanitizer|runtime error:|ERROR: LeakSanitizer|SUMMARY: (Address|Undefined)" "$log" || true)
echo "sanitize_cpu: build $((t1 - t0)) s, tests $((t2 - t1)) s, pytest exit $rc, sanitizer reports $reports"
if [[ $reports -ne 0 ]]; then
  echo "sanitize_cpu: FAILED: sanitizer reports in $log" >&2
  exit 1
fi
exit "$rc"
