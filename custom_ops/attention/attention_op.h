#pragma once
#include <vector>

#include "common/custom_op.h"

namespace dot4attn {
// Dot4Attention, one spec per T (float32, float16).
std::vector<OpSpec> attention_op_specs();
}  // namespace dot4attn
