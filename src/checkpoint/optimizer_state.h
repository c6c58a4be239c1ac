// Optimizer state <-> PyTorch's optimizer state_dict layout:
//   {"state": {param_index: {name: value}}, "param_groups": [{option: value, "params": [index]}]}
// with parameters numbered across the groups in order, as torch.optim.Optimizer.state_dict does.
#pragma once

#include <ATen/core/ivalue.h>

#include <string>

namespace torch::optim {
class Optimizer;
}  // namespace torch::optim

namespace ddp::detail {

/// SGD, Adam and AdamW; any other optimizer is a DistributedError naming `operation`.
c10::IValue optimizer_state_dict(const torch::optim::Optimizer& optimizer,
                                 const std::string& operation);

/// Replaces the optimizer's options and state with the saved ones; `path` names the file in errors.
void load_optimizer_state_dict(torch::optim::Optimizer& optimizer, const c10::IValue& saved,
                               const std::string& path, const std::string& operation);

}  // namespace ddp::detail
