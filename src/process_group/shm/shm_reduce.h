// The element-wise reduction under the shared-memory collectives.
//
// dst = op(sources[0], sources[1], ..., sources[count-1]), always combined in that order (rank
// order), so that every rank that reduces the same elements gets the same bits. PREMUL_SUM (floats
// and doubles) multiplies each source by `factor`, in the source's type, before it is added: DDP's
// average, multiplied as PyTorch's reducer multiplies each gradient by 1/world_size while it copies
// it into a bucket (the sum is then in rank order; gloo's ring adds in another order). dst may be
// one of the sources (a rank's own input, reduced in place). Float, double and the integer types
// run a plain loop that the compiler vectorizes; half and bfloat16 go through float, as gloo's do.
// Thread-safe (no state).
#pragma once

#include <c10/core/ScalarType.h>

#include <cstddef>
#include <torch/csrc/distributed/c10d/Types.hpp>

namespace ddp::detail {

/// Throws DistributedError for an op the dtype does not support (bitwise or PREMUL_SUM on
/// integers; AVG, which the layer above turns into SUM and a division).
void check_reducible(c10::ScalarType dtype, c10d::ReduceOp::RedOpType op, const char* operation);

void reduce_into(void* dst, const void* const* sources, int count, size_t elements,
                 c10::ScalarType dtype, c10d::ReduceOp::RedOpType op, double factor = 1.0);

}  // namespace ddp::detail
