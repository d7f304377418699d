#pragma once
#include <vector>

#include "common/custom_op.h"

namespace dot4attn {
// Dot4GroupQueryAttention: GroupQueryAttention over a packed KV cache appended in place (one spec per T).
std::vector<OpSpec> cache_op_specs();
}  // namespace dot4attn
