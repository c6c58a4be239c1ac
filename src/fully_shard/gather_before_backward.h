// GatherBeforeBackward: the identity on a unit's output, whose backward runs when that output's
// gradient arrives, before any node of the unit's own backward: it gathers the unit's parameters
// again (FSDP's pre-backward hook; libtorch has no tensor hooks that run before a node).
#pragma once

#include <torch/csrc/autograd/custom_function.h>

#include <memory>

namespace ddp::detail {

class ShardedUnit;

class GatherBeforeBackward : public torch::autograd::Function<GatherBeforeBackward> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& output,
                            const std::shared_ptr<ShardedUnit>& unit);
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs);
};

}  // namespace ddp::detail
