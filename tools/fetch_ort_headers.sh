#!/usr/bin/env bash
# Fetches the ONNX Runtime C/C++ API headers (Debian's libonnxruntime-dev, 1.21) into DEST/include/onnxruntime.
# No pip wheel ships these headers, and they must never be copied into this repository. We build against
# the 1.21 API and negotiate the version at registration, so one library serves onnxruntime 1.22..1.31+.
# Usage: tools/fetch_ort_headers.sh DEST
set -euo pipefail
dest=${1:?usage: fetch_ort_headers.sh DEST}
if [[ -f $dest/include/onnxruntime/onnxruntime_c_api.h ]]; then exit 0; fi
if [[ -f /usr/include/onnxruntime/onnxruntime_c_api.h ]]; then
  mkdir -p "$dest/include" && ln -sfn /usr/include/onnxruntime "$dest/include/onnxruntime"; exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/archives/partial"
# A private sources list for trixie (where libonnxruntime-dev 1.21 lives), so the system's apt state is untouched.
echo "deb http://deb.debian.org/debian trixie main" > "$work/sources.list"
opts=(-o Dir::Etc::SourceList="$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
      -o Dir::State::Lists="$work/lists" -o Dir::Cache="$work" -o Debug::NoLocking=1 -o APT::Sandbox::User=root)
apt-get "${opts[@]}" -qq update >/dev/null
(cd "$work" && apt-get "${opts[@]}" -qq download libonnxruntime-dev 2>/dev/null)
deb=$(ls "$work"/libonnxruntime-dev_*.deb)
dpkg -x "$deb" "$work/x"
mkdir -p "$dest/include"
rm -rf "$dest/include/onnxruntime.tmp"
cp -r "$work/x/usr/include/onnxruntime" "$dest/include/onnxruntime.tmp"
mv "$dest/include/onnxruntime.tmp" "$dest/include/onnxruntime"
echo "ONNX Runtime headers: $(basename "$deb") -> $dest/include/onnxruntime"
