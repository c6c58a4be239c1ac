// Assignment of parameters to gradient buckets, as torch.distributed's
// compute_bucket_assignment_by_size does it.
//
// Parameters are taken in the given order and grouped by (dtype, device): a bucket holds tensors
// of one kind only, since it is one flat buffer. A bucket is closed once its size reaches the
// current limit; the limits are used in turn and the last one repeats ([1 MiB, 25 MiB] gives a
// small first bucket, so that communication starts early in backward, then 25 MiB buckets).
// Buckets come out in the order in which they were closed, the still-open ones last: bucket 0 is
// the first filled, hence the first reduced. Pure function; thread-compatible.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstddef>
#include <vector>

namespace ddp::detail {

struct TensorSpec {
  c10::ScalarType dtype;
  c10::Device device;
  size_t bytes;
};

/// Returns, per bucket, the indices (into `tensors`) of its tensors, in `order`.
/// REQUIRES: `order` is a permutation of 0..tensors.size()-1; limits is non-empty.
std::vector<std::vector<size_t>> assign_buckets(const std::vector<TensorSpec>& tensors,
                                                const std::vector<size_t>& order,
                                                const std::vector<size_t>& limits);

}  // namespace ddp::detail
