// How a ddp::ReduceOp runs on the backend: gloo has no AVG, so AVG is a SUM followed by a division
// by the group size. Bitwise ops are checked against the dtype here, so that the error names the op
// and the dtype instead of failing deep inside gloo.
#pragma once

#include <ATen/core/Tensor.h>

#include <torch/csrc/distributed/c10d/Types.hpp>

#include "collectives/collective_call.h"
#include "ddp/process_group.h"

namespace ddp::detail {

struct BackendReduce {
  c10d::ReduceOp op;
  bool divide_by_size = false;  // AVG
};

/// Throws DistributedError for an op the dtype does not allow.
BackendReduce backend_reduce(ReduceOp op, const at::Tensor& tensor, const CollectiveCall& call);

/// The division step of AVG: truncating for integer dtypes, as NCCL's AVG does.
void divide_by(at::Tensor& tensor, int64_t size);

}  // namespace ddp::detail
