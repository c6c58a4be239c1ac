// GradBucket's views of its buffer (include/ddp/comm_hooks.h).
#include <ATen/ATen.h>

#include "ddp/comm_hooks.h"

namespace ddp {

std::vector<at::Tensor> GradBucket::gradients() const {
  std::vector<at::Tensor> views;
  int64_t offset = 0;
  for (const auto& parameter : parameters_) {
    // The reducer lays the gradients out contiguously, one after the other.
    views.push_back(buffer_.narrow(0, offset, parameter.numel()).view(parameter.sizes()));
    offset += parameter.numel();
  }
  return views;
}

}  // namespace ddp
