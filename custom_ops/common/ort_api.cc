#include "common/ort_api.h"

namespace dot4attn {
namespace {
const OrtApi* g_api = nullptr;
uint32_t g_version = 0;
}  // namespace

bool init_ort_api(const OrtApiBase* base) {
  if (g_api) return true;
  for (uint32_t v = ORT_API_VERSION; v >= kMinOrtApiVersion; --v) {
    if (const OrtApi* api = base->GetApi(v)) {
      g_api = api;
      g_version = v;
      return true;
    }
  }
  return false;
}

const OrtApi& ort() { return *g_api; }
uint32_t ort_api_version() { return g_version; }

}  // namespace dot4attn
