// Stand-in for a header Debian's libtorch-dev does not ship, on the include
// path of _torch_hooks only when the real one is missing. c10d/reducer.hpp
// includes it for two names it uses in members we never touch: the member
// layout only needs a shared_ptr, and the callback type is checked against
// the same std::function. Nothing here is defined or called at run time.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>

namespace torch::distributed::autograd {

class DistAutogradContext {
 public:
  using GradCallback = std::function<bool(at::Tensor&)>;
};
using ContextPtr = std::shared_ptr<DistAutogradContext>;

}  // namespace torch::distributed::autograd
