// A post hook for a gradient accumulator that calls a function once the gradient is in .grad.
// The reducer marks parameters ready with it; tests use it to act as a user's hook would.
#pragma once

#include <torch/csrc/autograd/function_hook.h>

#include <functional>
#include <utility>

namespace ddp::detail {

class CallAfterAccumulation : public torch::autograd::FunctionPostHook {
 public:
  explicit CallAfterAccumulation(std::function<void()> call) : call_(std::move(call)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    call_();
    return outputs;
  }

 private:
  std::function<void()> call_;
};

}  // namespace ddp::detail
