#!/usr/bin/env bash
# The ORT-level GPU acceptance run (docs/gpu.md, call 5): install the carried onnxruntime-gpu wheel chunks, then
# the GPU op suite, the rewritten-model suite, compute-sanitizer memcheck / racecheck / synccheck. Logs into $OUT.
# Usage (repo root on the device, build/gpu built, chunks p1..p4 already in /tmp/ortw, this call carrying
# .ortgpu/p5 .ort .gpu-models): OUT=$OUT [SANITIZE=0] tools/gpu_ort_session.sh
set -u
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
step() { local name=$1 t=$2; shift 2; echo "== $name ($(date +%T))"; timeout "$t" "$@" > "$OUT/$name.log" 2>&1; echo "rc=$?"; tail -4 "$OUT/$name.log"; }
if [[ ! -d /tmp/ortsite/onnxruntime ]]; then
  cp .ortgpu/p5/* /tmp/ortw/
  W=/tmp/ortw/onnxruntime_gpu-1.31.1-cp312-cp312-manylinux_2_28_x86_64.whl
  cat /tmp/ortw/chunk.* > "$W" && python3 -m pip install -q --no-index --no-deps --target /tmp/ortsite "$W" || exit 3
fi
export PYTHONPATH=/tmp/ortsite:$PWD/python DOT4ATTN_LIBRARY=$PWD/build/gpu/libdot4attn_ops.so
python3 -c "import torch, onnxruntime as o; print(o.__version__, o.get_available_providers(), torch.cuda.get_device_name())"
XD=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8")
step gpu_suite 300 python3 -m pytest -q -rs -m gpu tests/test_gpu.py $XD
step gpu_models 240 python3 -m pytest -q -rs -s -m gpu tests/test_gpu_models.py
[[ ${SANITIZE:-1} == 1 ]] || { echo "== end $(date +%T) (SANITIZE=0: no sanitizers)"; exit 0; }
CS=/usr/local/cuda/bin/compute-sanitizer
step memcheck 240 $CS --tool memcheck --leak-check no python3 -m pytest -q -p no:xdist tests/test_gpu.py -k "sanitizer or pack_bit"
step racecheck 120 $CS --tool racecheck python3 tools/gpu_smoke.py
step synccheck 120 $CS --tool synccheck python3 tools/gpu_smoke.py
echo "== end $(date +%T)"
