// Collectives without the cross-rank fingerprint check, for callers inside the library whose
// tensors are known to match on every rank (DDP's buckets and buffers, verified at construction).
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "ddp/process_group.h"

namespace ddp::detail {

Work all_reduce_async(at::Tensor& tensor, ReduceOp op, const ProcessGroup& group, bool verify);
Work broadcast_async(at::Tensor& tensor, int src, const ProcessGroup& group, bool verify);
/// True when the group's backend all-reduces a list of tensors in place, PREMUL_SUM included
/// (shm on one host): DDP's reducer then reduces gradients where autograd left them.
bool reduces_lists_in_place(const ProcessGroup& group);
/// Only where reduces_lists_in_place(group): each tensor, in place, becomes the sum over ranks of
/// its value times `factor` (each product rounded first, summed in rank order).
Work premul_sum_in_place_async(std::vector<at::Tensor> tensors, double factor,
                               const ProcessGroup& group);
Work all_gather_async(const at::Tensor& tensor, std::vector<at::Tensor>& outputs,
                      const ProcessGroup& group, bool verify);

}  // namespace ddp::detail
