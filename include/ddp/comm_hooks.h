// Communication hooks: how DistributedDataParallel reduces one bucket of gradients.
//
// A hook receives the group and a GradBucket (the bucket's flat gradient buffer, its index, the
// parameters it holds) and returns a Work that completes once bucket.buffer() holds the reduced
// gradient, which DDP then writes back to each parameter's .grad. With a hook, DDP does not
// pre-divide the gradients: averaging is the hook's job (as in PyTorch). Hooks run on the autograd
// thread during backward, bucket by bucket in the same order on every rank, and must start the
// same collectives on every rank. Work::then chains a step after a collective (decompression, an
// optimizer step), so compression, PowerSGD or a fused optimizer can be written as hooks. DDP
// runs those continuations when it waits for the buckets at the end of backward: after every
// bucket's hook was called, bucket by bucket, on one thread. So a continuation may start (and
// wait for) further collectives: every rank starts them in the same order (PowerSGD's second
// all-reduce does so; comm_hooks::powerSGD is in ddp/powersgd_hook.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

#include "ddp/process_group.h"

namespace ddp {

class GradBucket {
 public:
  GradBucket(size_t index, size_t bucket_count, at::Tensor buffer,
             std::vector<at::Tensor> parameters)
      : index_(index),
        bucket_count_(bucket_count),
        buffer_(std::move(buffer)),
        parameters_(std::move(parameters)) {}

  /// Position of the bucket in the reduction order: 0 is reduced first.
  size_t index() const { return index_; }
  /// True for the last bucket reduced in an iteration.
  bool is_last() const { return index_ + 1 == bucket_count_; }
  /// The flat gradients of every parameter of the bucket; a hook reduces it in place.
  at::Tensor& buffer() { return buffer_; }
  /// The parameters whose gradients the buffer holds, in buffer order.
  const std::vector<at::Tensor>& parameters() const { return parameters_; }
  /// Views of the buffer, one per parameter and shaped like it, in buffer order (PyTorch's
  /// bucket.gradients()): writing to them writes the buffer.
  std::vector<at::Tensor> gradients() const;

 private:
  size_t index_;
  size_t bucket_count_;
  at::Tensor buffer_;
  std::vector<at::Tensor> parameters_;
};

using CommHook = std::function<Work(const ProcessGroup& group, GradBucket& bucket)>;

namespace comm_hooks {

/// The default: all-reduce the bucket, then divide by the group size.
CommHook allreduce();
/// Casts the bucket to float16, all-reduces it, divides, and casts back into the bucket: half the
/// bytes on the wire.
CommHook fp16_compress();
/// The same with bfloat16 (wider range than float16, less precision). Where the group reduces
/// bfloat16 itself (NCCL, shared memory) the compressed bucket is all-reduced (each partial sum
/// rounded to bfloat16); gloo cannot, so there the compressed buckets are all-gathered and summed
/// locally in float32, in rank order (identical on every rank), and rounded once.
CommHook bf16_compress();

/// Compression only where it pays, on a group that spans hosts: gradients are averaged in full
/// precision inside each host (shared memory), and only what crosses the network between hosts
/// travels as bfloat16 (each host's average rounded once). On one host nothing is compressed;
/// on a group without shared memory (gloo, NCCL) every rank's bytes cross a link, so the whole
/// bucket is compressed, as bf16_compress() does.
CommHook bf16_compress_between_hosts();
/// The same with float16.
CommHook fp16_compress_between_hosts();

}  // namespace comm_hooks
}  // namespace ddp
