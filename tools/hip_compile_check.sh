#!/usr/bin/env bash
# Compile-checks the HIP device code of every GPU kernel source (custom_ops/**/*.cu, one source for CUDA and HIP)
# for AMD gfx90a (CDNA2), gfx942 (CDNA3) and gfx1100 (RDNA3), on a machine with no GPU and no ROCm install,
# with Debian bookworm's packages only:
#   gfx90a   hipcc (Debian's HIP 5.2 on clang-15) with its ROCm device libraries
#   gfx1100  the same, with an oclc_isa_version_1100.bc made from the 1030 one (Debian's device libs stop at
#            gfx1036): llvm-dis, change the ISA version constant, llvm-as
#   gfx942   clang-19 (-x hip --offload-arch=gfx942 -nogpulib; Debian's device libs predate gfx942)
# Each source is compiled device-only to assembly (full code generation, no host pass, no device link), and
# the assembly must contain the arch's 4-way int8 dot instruction where the source uses one (sdot4 on CDNA,
# sudot4 on RDNA3), so a silently taken scalar fallback fails the check.
# Usage: tools/hip_compile_check.sh [ARCH...]   (default: gfx90a gfx942 gfx1100). Installs packages with
# apt-get when run as root and they are missing. Exit status 0 when every (source, arch) compiles.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
archs=("$@")
[[ ${#archs[@]} -gt 0 ]] || archs=(gfx90a gfx942 gfx1100)

need=()
command -v hipcc >/dev/null || need+=(hipcc libamdhip64-dev)
command -v clang++-19 >/dev/null || need+=(clang-19 lld-19)
command -v /usr/lib/llvm-15/bin/llvm-dis >/dev/null || need+=(llvm-15)
if [[ ${#need[@]} -gt 0 ]]; then
  if [[ $(id -u) -ne 0 ]]; then echo "missing packages: ${need[*]} (run as root to install)" >&2; exit 2; fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Device libraries: Debian's set plus a generated gfx1100 ISA-version library.
devlib_src=/usr/lib/x86_64-linux-gnu/amdgcn/bitcode
devlib=$work/bitcode
cp -r "$devlib_src" "$devlib"
if [[ ! -f $devlib/oclc_isa_version_1100.bc ]]; then
  /usr/lib/llvm-15/bin/llvm-dis "$devlib/oclc_isa_version_1030.bc" -o "$work/isa1030.ll"
  sed -e 's/10300/11000/g' "$work/isa1030.ll" > "$work/isa1100.ll"
  /usr/lib/llvm-15/bin/llvm-as "$work/isa1100.ll" -o "$devlib/oclc_isa_version_1100.bc"
fi

# The files that instantiate the tile or SIMT decode kernels: their assembly must contain the dot instruction. They
# take minutes per arch (the rest seconds), so they go first: the long compiles start at once and the short ones fill
# the other cores at the end instead of one long compile running alone.
dot_files=(custom_ops/decode/decode_simt_gpu.cu custom_ops/decode/decode_tile_gpu.cu custom_ops/prefill/prefill_gpu.cu)
mapfile -t sources < <(cd "$root" && { printf '%s\n' "${dot_files[@]}"; find custom_ops -name '*.cu' | sort; } |
                       awk '!seen[$0]++')
common=(-std=c++17 -O3 -I"$root/custom_ops" -DDOT4ATTN_WITH_GPU=1 -DDOT4ATTN_WITH_HIP=1 --cuda-device-only -S
        -Wno-unused-command-line-argument)
# One (arch, source) compile per job, $(nproc) at a time (each a single-threaded clang run), results
# printed in order afterwards.
check_one() {  # arch src idx
  local arch=$1 src=$2 res=$work/res.$3 cc dot
  case $arch in
    gfx942) cc=(clang++-19 -x hip --offload-arch="$arch" -nogpulib); dot='v_dot4c\?_i32_i8' ;;
    gfx90a) cc=(env HIP_PLATFORM=amd hipcc --offload-arch="$arch" --rocm-device-lib-path="$devlib"); dot='v_dot4c\?_i32_i8' ;;
    gfx11*) cc=(env HIP_PLATFORM=amd hipcc --offload-arch="$arch" --rocm-device-lib-path="$devlib"); dot='v_dot4_i32_iu8' ;;
  esac
  local out=$work/$(basename "$src" .cu).$arch.s t0=$SECONDS
  if "${cc[@]}" "${common[@]}" "$root/$src" -o "$out" 2>"$res.err"; then
    local status=ok
    if [[ " ${dot_files[*]} " == *" $src "* ]] && ! grep -q "$dot" "$out"; then
      status="FAILED (no $dot in the code: the dot4 builtin was not used)"
      touch "$res.fail"
    fi
    echo "$arch  $src: $status ($((SECONDS - t0)) s)" > "$res"
  else
    touch "$res.fail"
    { echo "$arch  $src: FAILED"; sed 's/^/    /' "$res.err" | grep -v "linker' input unused" | head -30 || true; } > "$res"
  fi
}
for arch in "${archs[@]}"; do
  case $arch in gfx942|gfx90a|gfx11*) ;; *) echo "unknown arch $arch" >&2; exit 2 ;; esac
done
jobs_max=$(nproc 2>/dev/null || echo 2)
n=0
for src in "${sources[@]}"; do
  for arch in "${archs[@]}"; do
    while [[ $(jobs -rp | wc -l) -ge $jobs_max ]]; do wait -n || true; done
    check_one "$arch" "$src" "$n" &
    n=$((n + 1))
  done
done
wait
fail=0
for ((i = 0; i < n; i++)); do
  cat "$work/res.$i" 2>/dev/null || { echo "job $i left no result"; fail=1; }
  [[ -e $work/res.$i.fail ]] && fail=1
done
exit $fail
