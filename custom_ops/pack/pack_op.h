#pragma once
#include <vector>

#include "common/custom_op.h"

namespace dot4attn {
// PackK and PackV, one spec per input type (float32, float16).
std::vector<OpSpec> pack_op_specs();
}  // namespace dot4attn
