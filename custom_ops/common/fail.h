// The error every op and the GPU planner throw: a message that names the op (or entry), the input or attribute,
// and what was expected versus what came. No ONNX Runtime types here, so GPU translation units (compiled without
// the ORT headers by the HIP check) can throw it too; common/errors.h adds the ORT-facing helpers.
#pragma once
#include <sstream>
#include <stdexcept>

namespace dot4attn {

struct OpError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <typename... Args>
[[noreturn]] void fail(const char* op, Args&&... parts) {
  std::ostringstream s;
  s << op << ": ";
  (s << ... << parts);
  throw OpError(s.str());
}

}  // namespace dot4attn
