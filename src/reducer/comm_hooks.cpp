// The built-in comm hooks of include/ddp/comm_hooks.h.
#include "ddp/comm_hooks.h"

#include <ATen/ATen.h>

#include "collectives/unverified.h"
#include "reducer/low_precision_sum.h"

namespace ddp::comm_hooks {

CommHook allreduce() {
  return [](const ProcessGroup& group, GradBucket& bucket) {
    at::Tensor buffer = bucket.buffer();
    const int size = group.size();
    return detail::all_reduce_async(buffer, ReduceOp::SUM, group, /*verify=*/false)
        .then([buffer, size]() mutable { buffer.div_(size); });
  };
}

CommHook fp16_compress() {
  return [](const ProcessGroup& group, GradBucket& bucket) {
    at::Tensor buffer = bucket.buffer();
    // Divide before the cast: the sum of n halves overflows float16 far sooner than their mean.
    at::Tensor compressed = (buffer / group.size()).to(at::kHalf);
    return detail::all_reduce_async(compressed, ReduceOp::SUM, group, /*verify=*/false)
        .then([buffer, compressed]() mutable { buffer.copy_(compressed); });
  };
}

CommHook bf16_compress() {
  return [](const ProcessGroup& group, GradBucket& bucket) {
    at::Tensor buffer = bucket.buffer();
    at::Tensor halved = (buffer / group.size()).to(at::kBFloat16);
    // NCCL and shared memory sum bfloat16; on gloo the bytes are gathered and summed in float32.
    return detail::sum_over_ranks_async(halved, group)
        .then([buffer, halved]() mutable { buffer.copy_(halved); });
  };
}

namespace {

CommHook compress_between_hosts(c10::ScalarType wire, CommHook everywhere) {
  return [wire, everywhere](const ProcessGroup& group, GradBucket& bucket) {
    if (!detail::narrows_only_between_hosts(group, bucket.buffer())) return everywhere(group, bucket);
    return detail::average_narrow_between_hosts_async(bucket.buffer(), wire, group);
  };
}

}  // namespace

CommHook bf16_compress_between_hosts() {
  return compress_between_hosts(at::kBFloat16, bf16_compress());
}

CommHook fp16_compress_between_hosts() { return compress_between_hosts(at::kHalf, fp16_compress()); }

}  // namespace ddp::comm_hooks
