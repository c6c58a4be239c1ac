// Collectives without the cross-rank fingerprint check, for callers inside the library whose
// tensors are known to match on every rank (DDP's buckets and buffers, verified at construction),
// and with the launch said explicitly (backend.h): kWaitNow where the caller waits at once.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "ddp/process_group.h"
#include "process_group/backend.h"

namespace ddp::detail {

Work all_reduce_async(at::Tensor& tensor, ReduceOp op, const ProcessGroup& group, bool verify,
                      Launch launch = Launch::kAsync);
Work broadcast_async(at::Tensor& tensor, int src, const ProcessGroup& group, bool verify,
                     Launch launch = Launch::kAsync);
/// DDP's check, once per step, before the step's first collective (`step`: kDdpForwardStep or
/// kDdpBackwardStep of collective_call.h): when the group verifies collectives, every member must
/// be in the same step of DDP, over `elements` elements of `dtype`. A member elsewhere (uneven
/// inputs: it left the loop) makes every rank raise a MismatchError saying so; one that exited
/// or stopped answering, a PeerLostError or TimeoutError naming ddp::Join.
void verify_ddp_step(const char* step, c10::ScalarType dtype, int64_t elements,
                     const ProcessGroup& group);
/// Sums small per-rank counts over the group (one all-reduce of int64 on `device`), for the
/// library's own agreements (Join's rounds). Every member must call it with as many values.
std::vector<int64_t> sum_counts(const std::vector<int64_t>& mine, const ProcessGroup& group,
                                const c10::Device& device);
/// True when the group all-reduces tensors like `like` (device, dtype) in its backend; false
/// where it would have to move them elsewhere or cannot reduce their dtype (bfloat16 on gloo).
bool reduces_natively(const ProcessGroup& group, const at::Tensor& like);
Work all_gather_async(const at::Tensor& tensor, std::vector<at::Tensor>& outputs,
                      const ProcessGroup& group, bool verify, Launch launch = Launch::kAsync);
/// The flat collectives of collectives.h (flat_collectives.cpp), the fingerprint check optional.
Work all_gather_into_tensor_async(at::Tensor& output, const at::Tensor& input,
                                  const ProcessGroup& group, bool verify,
                                  Launch launch = Launch::kAsync);
Work reduce_scatter_tensor_async(at::Tensor& output, const at::Tensor& input, ReduceOp op,
                                 const ProcessGroup& group, bool verify,
                                 Launch launch = Launch::kAsync);
/// True when a backend of the group all-reduces lists of tensors like `like` (device, dtype)
/// where they are, PREMUL_SUM included (shm on one host): DDP's reducer then reads gradients
/// where autograd left them.
bool reduces_lists_in_place(const ProcessGroup& group, const at::Tensor& like);
/// True when a backend of the group averages tensors like `like` in full precision inside each
/// host and narrower only between hosts (hierarchical, and shm, where nothing crosses a network).
bool narrows_only_between_hosts(const ProcessGroup& group, const at::Tensor& like);
/// Only where narrows_only_between_hosts(group, tensor): tensor becomes the average over the
/// group, its bytes crossing between hosts as `wire` (Backend::all_reduce_narrow_between_hosts).
Work average_narrow_between_hosts_async(at::Tensor& tensor, c10::ScalarType wire,
                                        const ProcessGroup& group);
/// Only where reduces_lists_in_place(group, inputs[0]): outputs[i] becomes the sum over ranks of
/// inputs[i] times `factor` (each product rounded first, summed in rank order), the lists reduced
/// as one run of elements; outputs[i] may be inputs[i]. Inputs are only read, while the op runs.
Work premul_sum_async(std::vector<at::Tensor> inputs, std::vector<at::Tensor> outputs,
                      double factor, const ProcessGroup& group);

}  // namespace ddp::detail
