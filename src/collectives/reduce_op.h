// How a ddp::ReduceOp runs on the backend: gloo and shared memory have no AVG, so there AVG is a
// SUM followed by a division by the group size; NCCL averages itself. Bitwise ops are checked
// against the dtype here, so that the error names the op and the dtype instead of failing deep
// inside the backend.
#pragma once

#include <ATen/core/Tensor.h>

#include "collectives/collective_call.h"
#include "ddp/process_group.h"
#include "process_group/backend.h"

namespace ddp::detail {

struct BackendReduce {
  RedOp op;
  bool divide_by_size = false;  // AVG where the backend does not average
};

/// The op `backend` runs for `op` on `tensor`. Throws DistributedError for an op the dtype does
/// not allow.
BackendReduce backend_reduce(ReduceOp op, const at::Tensor& tensor, const CollectiveCall& call,
                             const Backend& backend);

/// The division step of AVG: truncating for integer dtypes, as NCCL's AVG does.
void divide_by(at::Tensor& tensor, int64_t size);

}  // namespace ddp::detail
