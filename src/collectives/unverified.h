// Collectives without the cross-rank fingerprint check, for callers inside the library whose
// tensors are known to match on every rank (DDP's buckets and buffers, verified at construction).
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "ddp/process_group.h"

namespace ddp::detail {

Work all_reduce_async(at::Tensor& tensor, ReduceOp op, const ProcessGroup& group, bool verify);
Work broadcast_async(at::Tensor& tensor, int src, const ProcessGroup& group, bool verify);
/// True when the group's backend all-reduces lists of tensors where they are, PREMUL_SUM
/// included (shm on one host): DDP's reducer then reads gradients where autograd left them.
bool reduces_lists_in_place(const ProcessGroup& group);
/// Only where reduces_lists_in_place(group): outputs[i] becomes the sum over ranks of inputs[i]
/// times `factor` (each product rounded first, summed in rank order), the lists reduced as one
/// run of elements; outputs[i] may be inputs[i]. Inputs are only read, while the op runs.
Work premul_sum_async(std::vector<at::Tensor> inputs, std::vector<at::Tensor> outputs,
                      double factor, const ProcessGroup& group);
Work all_gather_async(const at::Tensor& tensor, std::vector<at::Tensor>& outputs,
                      const ProcessGroup& group, bool verify);

}  // namespace ddp::detail
