// Standalone timing of the tensor-core prefill kernel (prefill_mma_kernel, custom_ops/gpu/prefill_mma.cuh) without
// the library, ORT or torch: causal B = 1, (Hq, Hkv, D) = (32, 8, 128), Sq = Sk = argv[1] (default 8192), float16 Q
// and V (or -DPVK=kVQ8 / kVQ4), random int8 K; CUDA events, median of 7 (no L2 flush: the kernel is compute-bound).
// The output's FNV hash is printed (out=...): two builds of the same math must print the same hash (A/B checks).
// Knock-out builds (tools/gpu_prefill_probe_knobs.py writes a copy of the header with #ifdef knobs: NOSCALE one FADD
// instead of the two scaling FFMAs, NOSOFT no online softmax, NOPV no P.V mma, NOQK no Q.K) show what each part of a
// tile costs. Build (repo root, on the device; PMT / PMINB pick the instantiation):
//   python3 tools/gpu_prefill_probe_knobs.py build/probe
//   nvcc -O3 -std=c++17 -arch=sm_90a -lineinfo -Ibuild/probe -Icustom_ops -DPMT=1 -DPMINB=2 [-DPD=64] [-DNOSCALE] \
//        -o /tmp/pp tools/gpu_prefill_probe.cu && /tmp/pp 8192 label
// Without -Ibuild/probe the real header is used (no knobs). DOT4ATTN_PREFILL_TMA=0 in the environment: cp.async
// tiles instead of TMA (same binary). PROBE_AB=DOT4ATTN_PREFILL_WGMMA (any 0-able knob): also time the run with
// that knob at 0 in the same process and compare the two outputs (differing values, max |d|, NMSE). PROBE_DUMP=file
// writes the output, PROBE_REF=file compares it with one written by another build (same S). Profile:
//   ncu --set full --import-source yes -k regex:prefill_mma --launch-skip 1 --launch-count 1 -o rep /tmp/pp 8192
//   (see docs/gpu.md, eleventh session). wgmma needs -arch=sm_90a (with -arch=sm_90 the kernel keeps mma.sync).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <algorithm>
#include <map>
#include <string>
#include <mutex>
#include <gpu/prefill_mma.cuh>  // angle brackets: the -I order decides (knob copy first)
namespace dot4attn { namespace gpu {
int device_attribute(gpuDeviceAttr_t attr, int fallback) { int v = 0, d = 0; cudaGetDevice(&d); cudaDeviceGetAttribute(&v, attr, d); return v > 0 ? v : fallback; }
int max_shared_bytes() { return device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, 48 * 1024); }
void set_dynamic_smem(const void* kern, int bytes) { if (bytes > 48 * 1024) cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes); }
}}
using namespace dot4attn::gpu;
#ifndef PD
#define PD 128  // head size: 64 or 128 (the pipelined layout)
#endif
#ifndef PVK
#define PVK kVF16
#endif
int main(int argc, char** argv) {
  const int S = argc > 1 ? atoi(argv[1]) : 8192, Hq = 32, Hkv = 8, D = PD, NB = D / 32;
  std::vector<uint16_t> q(size_t(Hq) * S * D), ks(size_t(Hkv) * S * NB), vs(size_t(Hkv) * S * NB);
  std::vector<int8_t> k(size_t(Hkv) * S * D);
  std::vector<uint8_t> v(size_t(Hkv) * S * D * 2);
  uint32_t x = 1; auto rnd = [&]() { x = x * 1664525u + 1013904223u; return x >> 8; };
  for (auto& e : q) { __half h = __float2half((int(rnd() % 2001) - 1000) / 500.f); e = *reinterpret_cast<uint16_t*>(&h); }
  for (auto& e : k) e = int8_t(int(rnd() % 255) - 127);
  for (auto& e : ks) { __half h = __float2half(0.01f + (rnd() % 100) * 1e-4f); e = *reinterpret_cast<uint16_t*>(&h); }
  vs = ks;
  for (size_t i = 0; i < v.size(); i += 2) { __half h = __float2half((int(rnd() % 2001) - 1000) / 1000.f); memcpy(&v[i], &h, 2); }
  if (PVK != kVF16) for (auto& e : v) e = uint8_t(rnd());
  void *dq, *dk, *dks, *dv, *dvs, *dout;
  cudaMalloc(&dq, q.size() * 2); cudaMalloc(&dk, k.size()); cudaMalloc(&dks, ks.size() * 2);
  cudaMalloc(&dv, v.size()); cudaMalloc(&dvs, vs.size() * 2); cudaMalloc(&dout, q.size() * 2);
  cudaMemcpy(dq, q.data(), q.size() * 2, cudaMemcpyHostToDevice); cudaMemcpy(dk, k.data(), k.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(dks, ks.data(), ks.size() * 2, cudaMemcpyHostToDevice); cudaMemcpy(dv, v.data(), v.size(), cudaMemcpyHostToDevice);
  cudaMemcpy(dvs, vs.data(), vs.size() * 2, cudaMemcpyHostToDevice);
  TileArgs a{};
  a.B = 1; a.Hq = Hq; a.Hkv = Hkv; a.Sq = S; a.Sk = S; a.g = Hq / Hkv; a.D = D; a.nb = NB; a.vk = PVK;
  a.scale = 1.f / sqrtf(float(D)); a.scale_log2 = a.scale * kLog2e; a.half = 1; a.causal = 1;
  a.q = dq; a.k = (const int8_t*)dk; a.ks = (const uint16_t*)dks; a.v = dv; a.vs = PVK == kVF16 ? nullptr : (const uint16_t*)dvs;
  a.out = dout;
  cudaStream_t st; cudaStreamCreate(&st);
  auto run = [&]() { if (!pmma::launch<PVK, PD, PMT, PMINB>(a, st)) { printf("launch refused\n"); exit(1); } };
  run(); cudaError_t e = cudaStreamSynchronize(st); if (e) { printf("err %s\n", cudaGetErrorString(e)); return 1; }
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  auto time7 = [&]() {  // sorted kernel times (us) of 7 runs
    std::vector<float> t;
    for (int i = 0; i < 7; ++i) { cudaEventRecord(e0, st); run(); cudaEventRecord(e1, st); cudaEventSynchronize(e1); float ms; cudaEventElapsedTime(&ms, e0, e1); t.push_back(ms * 1000); }
    std::sort(t.begin(), t.end());
    return t;
  };
  auto output = [&]() { std::vector<uint16_t> o(q.size()); cudaMemcpy(o.data(), dout, o.size() * 2, cudaMemcpyDeviceToHost); return o; };
  // "outputs differ in N, max |d| M, NMSE E" of output a against reference b (f16 values)
  auto compare = [](const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
    double num = 0, den = 0, mx = 0; size_t diff = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      __half h1, h2; memcpy(&h1, &a[i], 2); memcpy(&h2, &b[i], 2);
      const double x = __half2float(h1), y = __half2float(h2);
      num += (x - y) * (x - y); den += y * y; mx = std::max(mx, std::abs(x - y)); diff += a[i] != b[i];
    }
    char m[128];
    snprintf(m, sizeof m, "outputs differ in %zu of %zu, max |d| %.3g, NMSE %.3g", diff, a.size(), mx, den > 0 ? num / den : 0.0);
    return std::string(m);
  };
  const std::vector<float> t = time7();
  std::vector<uint16_t> o = output();
  if (const char* f = getenv("PROBE_DUMP")) {  // the output for another build to compare against (PROBE_REF)
    FILE* fp = fopen(f, "wb");
    if (!fp || fwrite(o.data(), 2, o.size(), fp) != o.size()) { printf("PROBE_DUMP %s: cannot write\n", f); return 1; }
    fclose(fp);
  }
  if (const char* f = getenv("PROBE_REF")) {
    std::vector<uint16_t> r(o.size()); FILE* fp = fopen(f, "rb");
    const size_t got = fp ? fread(r.data(), 2, r.size(), fp) : 0; if (fp) fclose(fp);
    if (got != o.size()) printf("REF %s: MISSING or short (%zu of %zu values)\n", f, got, o.size());
    else printf("REF %s: %s\n", f, compare(o, r).c_str());
  }
  if (const char* ab = getenv("PROBE_AB")) {  // same-process A/B: rerun with the knob ab set to 0, compare outputs
    setenv(ab, "0", 1);
    const std::vector<float> t2 = time7();
    printf("AB %s=0: median %.1f us vs %.1f us; %s\n", ab, t2[3], t[3], compare(o, output()).c_str());
    unsetenv(ab);
  }
  uint64_t hsh = 1469598103934665603ull; for (auto w : o) { hsh ^= w; hsh *= 1099511628211ull; }
  o[0] = uint16_t(hsh ^ (hsh >> 16) ^ (hsh >> 32) ^ (hsh >> 48));
  double flops = 4.0 * Hq * double(S) * S * D / 2;
  printf("%-28s S=%d median %.1f us (min %.1f) %.0f TFLOP/s  out=%04x\n", argc > 2 ? argv[2] : "", S, t[3], t[0], flops / (t[3] * 1e-6) / 1e12, o[0]);
  return 0;
}
