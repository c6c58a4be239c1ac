// The sum over a group's ranks of a 16-bit tensor (bfloat16, float16): a gradient bucket of
// mixed precision, or of the bf16 compression hook.
//
// Where a backend of the group reduces the dtype (shm, NCCL, gloo's float16) it is one
// all-reduce in that dtype, the bytes handed to the backend being the tensor's. gloo has no
// bfloat16 reduction: there the tensor's bytes are all-gathered (the same bytes handed over per
// rank, n times as many received) and added up here in float32, rounded to the dtype once.
#pragma once

#include <ATen/core/Tensor.h>

#include "ddp/process_group.h"

namespace ddp::detail {

/// REQUIRES: tensor is contiguous. When the returned Work completes, tensor holds the sum.
Work sum_over_ranks_async(at::Tensor& tensor, const ProcessGroup& group);

}  // namespace ddp::detail
