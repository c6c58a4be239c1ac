// SyncBatchNormFunction: batch normalization over the batch of every rank of a group, as an
// autograd function (PyTorch's torch/nn/modules/_functions.py SyncBatchNorm, step for step).
//
// Forward: each rank computes its per-channel count, mean and invstd, packs them into one tensor
// [mean (C), invstd (C), count (1)] and all-gathers it (one collective); the ranks' statistics
// combine into the global mean and invstd, which also update the running statistics; the input is
// normalized with them. A rank with an empty batch contributes zeros (count 0, left out of the
// combination) and still joins the all-gather.
// Backward: each rank reduces its per-channel sum_dy and sum_dy_xmu, packed into one tensor that
// is all-reduced (SUM, one collective, an empty rank joins with zeros); the input gradient follows
// from the global sums and counts. The weight and bias gradients stay local: DDP averages them
// like any other gradient.
//
// Thread-safety: forward and backward issue collectives on the group, so each must run on every
// member, in the same order relative to its other collectives on that group.
#pragma once

#include <torch/csrc/autograd/custom_function.h>

#include "ddp/process_group.h"

namespace ddp::detail {

class SyncBatchNormFunction : public torch::autograd::Function<SyncBatchNormFunction> {
 public:
  /// weight, bias, running_mean and running_var may be undefined. momentum is the exponential
  /// average factor already chosen by the module (1 / num_batches_tracked for a cumulative one).
  /// REQUIRES: training, the group has at least two ranks and this process is one of them.
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, at::Tensor input,
                            const at::Tensor& weight, const at::Tensor& bias,
                            const at::Tensor& running_mean, const at::Tensor& running_var,
                            double eps, double momentum, const ProcessGroup& group);

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs);
};

}  // namespace ddp::detail
