// Collectives without the cross-rank fingerprint check, for callers inside the library whose
// tensors are known to match on every rank (DDP's buckets and buffers, verified at construction).
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "ddp/process_group.h"

namespace ddp::detail {

Work all_reduce_async(at::Tensor& tensor, ReduceOp op, const ProcessGroup& group, bool verify);
Work broadcast_async(at::Tensor& tensor, int src, const ProcessGroup& group, bool verify);
Work all_gather_async(const at::Tensor& tensor, std::vector<at::Tensor>& outputs,
                      const ProcessGroup& group, bool verify);

}  // namespace ddp::detail
