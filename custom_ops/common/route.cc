#include <algorithm>

#include "common/attention_params.h"

namespace dot4attn {

Route choose_route(const AttentionParams& p, int64_t split_k_min_keys) {
  if (p.Sq > 8) return Route::kPrefill;
  return p.Sk < split_k_min_keys ? Route::kDecode : Route::kSplitK;
}

int64_t choose_splits(int64_t batch_heads, int64_t sk, int64_t parallel_units, int64_t waves,
                      int64_t min_keys_per_split) {
  if (batch_heads <= 0 || sk <= 0) return 1;
  const int64_t wanted = (parallel_units * waves + batch_heads - 1) / batch_heads;
  const int64_t most = std::max<int64_t>(1, sk / std::max<int64_t>(1, min_keys_per_split));
  return std::clamp<int64_t>(wanted, 1, most);
}

}  // namespace dot4attn
