// The differences between the libtorch versions ddp-cpp builds against, in one place.
//
// Supported: 1.13 (Debian 12) and 2.x (Debian 13's 2.6, pytorch.org and pip 2.x). What differs,
// and what the rest of the code uses instead:
// - c10d's process groups: ProcessGroupGloo and ProcessGroupNCCL derive from c10d::ProcessGroup
//   in 1.13 and from c10d::Backend in 2.x (where a ProcessGroup is a front that dispatches to
//   Backends by device). C10dBackend names whichever it is; our own Backend interface
//   (process_group/backend.h) sits on top, so nothing above the process-group layer sees either.
// - torch::optim::Optimizer::state() is keyed by the parameter's TensorImpl printed as a string in
//   1.13, and by the TensorImpl* itself in 2.x: optimizer_state_of / set_optimizer_state.
// Differences that one spelling covers in both need no entry here: c10::NoGradGuard (at::'s
// alias is not reachable in every 2.x), std::to_string, <cstdint>'s INT32_MIN.
#pragma once

#include <torch/version.h>

#include <memory>

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif

namespace at {
class Tensor;
}
namespace torch::optim {
class Optimizer;
struct OptimizerParamState;
}  // namespace torch::optim

namespace ddp::compat {

#if TORCH_VERSION_MAJOR >= 2
using C10dBackend = c10d::Backend;
#else
using C10dBackend = c10d::ProcessGroup;
#endif
using C10dBackendPtr = c10::intrusive_ptr<C10dBackend>;

/// The optimizer's state for `param`; null when it has none yet (never stepped).
const torch::optim::OptimizerParamState* optimizer_state_of(
    const torch::optim::Optimizer& optimizer, const at::Tensor& param);
/// Replaces the optimizer's state for `param`.
void set_optimizer_state(torch::optim::Optimizer& optimizer, const at::Tensor& param,
                         std::unique_ptr<torch::optim::OptimizerParamState> state);

}  // namespace ddp::compat
