// Checks, collectively, that every rank wraps the same model: the same parameters and buffers
// (count, names, shapes, dtypes, in order). On a mismatch every rank throws the same
// DistributedError, naming the first tensor that differs and what each side has.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "ddp/process_group.h"

namespace ddp::detail {

struct NamedTensors {
  std::vector<std::string> names;
  std::vector<at::Tensor> tensors;
};

void verify_model_across_ranks(const NamedTensors& parameters, const NamedTensors& buffers,
                               const ProcessGroup& group);

/// Overwrites `tensors` on every rank with those of global rank `src`, in few large messages:
/// tensors of one dtype are flattened into buffers of up to 250 MiB (PyTorch's coalescing size).
/// REQUIRES: the tensors match across ranks (verify_model_across_ranks).
void broadcast_coalesced(const std::vector<at::Tensor>& tensors, const ProcessGroup& group,
                         int src);

}  // namespace ddp::detail
