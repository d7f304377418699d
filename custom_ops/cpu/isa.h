// CPU instruction-set dispatch. The tile kernels (tile_kernels.inl) are compiled once per ISA; cpu_kernels()
// returns the table for the ISA chosen from CPUID, or forced with DOT4ATTN_CPU_ISA=scalar|avx2|avx512vnni (read
// once per process; tests switch it with the C entry dot4attn_force_cpu_isa).
#pragma once
#include <cstdint>
#include <string>

#include "common/attention_params.h"

namespace dot4attn {

enum class CpuIsa { kScalar, kAvx2, kAvx512Vnni };

// One block of M query rows that share a KV head, quantized (int8 + float scale per 32 elements).
struct AttendRows {
  int M = 0;
  int D = 0;
  const int8_t* q = nullptr;         // [M][D]
  const float* qs = nullptr;         // [M][D/32]: block scale * softmax scale * log2(e)  (base-2 logits)
  const int64_t* k_limit = nullptr;  // [M]: row m sees keys j < k_limit[m] (causal); null: all keys
  const int64_t* mask_off = nullptr; // [M]: element offset of row m's mask row (when a mask is given)
};

// The K/V rows of one (batch, KV head), from key 0. Row j of K is at k + j * k_stride (bytes), its scales at
// ks + j * ks_stride; V likewise in V elements (bytes for q8_0 / q4_0). Dense tensors: the row widths.
struct AttendKv {
  const int8_t* k = nullptr;
  const uint16_t* ks = nullptr;
  const void* v = nullptr;
  const uint16_t* vs = nullptr;
  int64_t k_stride = 0, ks_stride = 0, v_stride = 0, vs_stride = 0;
  VFormat format = VFormat::kFloat;
  bool v_half = false;  // float V stored as float16
};

struct AttendMask {
  MaskKind kind = MaskKind::kNone;
  bool half = false;          // additive mask in float16
  const void* base = nullptr;
  int64_t stride_j = 0;       // element stride along keys (0 when broadcast)
};

// Online-softmax state of the M rows: running max (base 2), running sum, unnormalised output.
struct AttendState {
  float* m = nullptr;    // [M], starts at -inf
  float* l = nullptr;    // [M], starts at 0
  float* acc = nullptr;  // [M][D], starts at 0
};

// Folds keys [k_begin, k_end) into the state: tiles of Q·K by dot4, masking (only on tiles that need it),
// online softmax, P·V with V dequantized on the fly.
using AttendFn = void (*)(const AttendRows& rows, const AttendKv& kv, const AttendMask& mask, int64_t k_begin,
                          int64_t k_end, AttendState& st);

struct CpuKernels {
  const char* name;
  AttendFn attend;
  // float16 <-> float32 over n values (F16C where the ISA has it; round to nearest even either way).
  void (*halves_to_floats)(const uint16_t* src, float* dst, int64_t n);
  void (*floats_to_halves)(const float* src, uint16_t* dst, int64_t n);
};

CpuIsa cpu_isa();                     // chosen (DOT4ATTN_CPU_ISA read once, else best supported); throws on a bad value
const char* cpu_isa_name(CpuIsa isa);
std::string cpu_isas_supported();     // e.g. "scalar,avx2,avx512vnni"
const CpuKernels& cpu_kernels();      // the table for cpu_isa()

// Per-ISA tables (isa_*.cc).
const CpuKernels& cpu_kernels_scalar();
#if defined(DOT4ATTN_X86)
const CpuKernels& cpu_kernels_avx2();
const CpuKernels& cpu_kernels_avx512vnni();
#endif

}  // namespace dot4attn
