// The flat collectives, all_gather_into_tensor and reduce_scatter_tensor (PyTorch's names): one
// tensor holding every rank's part, in group-rank order, instead of a list of tensors.
//
// Both go to the backend's flat calls where the group has a backend that takes all_gather and a
// native reduce-scatter (shm writes into the runs of the caller's tensor where they are; NCCL runs
// c10d's flat calls; the hierarchical ones move each host's bytes across once). Where no backend
// reduce-scatters natively (gloo), the reduce-scatter is composed: one
// all-reduce of a copy of the input, then this rank's run is copied out. That moves 2(n-1)/n of the
// input per rank where a ring reduce-scatter moves (n-1)/n: twice the bytes, in one collective (see
// reduce_scatter in collectives.cpp).
#include <ATen/ATen.h>

#include "collectives/collective_call.h"
#include "collectives/reduce_op.h"
#include "collectives/unverified.h"
#include "common/error_context.h"
#include "ddp/collectives.h"

namespace ddp {
namespace {

using detail::Backend;
using detail::Collective;
using detail::CollectiveCall;
using detail::Launch;

template <typename Body>
c10::intrusive_ptr<c10d::Work> flat_launch(CollectiveCall& call, Body&& body) {
  try {
    return body();
  } catch (const std::exception& error) {
    detail::rethrow_backend_failure(call.operation(), error);
  }
}

// The checks both calls share: one dtype, and the larger tensor `size` times the smaller.
void check_flat_sizes(const CollectiveCall& call, const at::Tensor& whole, const char* whole_name,
                      const at::Tensor& part, const char* part_name, int size) {
  if (!whole.defined()) call.fail(std::string(whole_name) + " is an undefined tensor");
  if (!part.defined()) call.fail(std::string(part_name) + " is an undefined tensor");
  if (whole.scalar_type() != part.scalar_type()) {
    call.fail(std::string(whole_name) + " has dtype " + c10::toString(whole.scalar_type()) +
              " but " + part_name + " has dtype " + c10::toString(part.scalar_type()) +
              "; they must share a dtype");
  }
  if (whole.device() != part.device()) {
    call.fail(std::string(whole_name) + " is on " + whole.device().str() + " but " + part_name +
              " is on " + part.device().str() + "; they must be on one device");
  }
  if (whole.numel() != part.numel() * size) {
    call.fail(std::string(whole_name) + " has " + std::to_string(whole.numel()) + " elements " +
              c10::str(whole.sizes()) + " but must have the group size (" + std::to_string(size) +
              ") times " + part_name + "'s " + std::to_string(part.numel()) + " " +
              c10::str(part.sizes()) + ": " + std::to_string(part.numel() * size) +
              ". Pad the tensors to a multiple of the group size");
  }
}

// A zero-element call moves nothing; it still meets the group, as a barrier.
c10::intrusive_ptr<c10d::Work> empty_meeting(CollectiveCall& call, Launch how) {
  Backend& backend = call.backend(at::Tensor());
  return flat_launch(call, [&] { return backend.barrier(how); });
}

}  // namespace

namespace detail {

Work all_gather_into_tensor_async(at::Tensor& output, const at::Tensor& input,
                                  const ProcessGroup& group, bool verify, Launch how) {
  CollectiveCall call("all_gather_into_tensor", Collective::kAllGather, group);
  check_flat_sizes(call, output, "output", input, "input", call.group().size());
  at::Tensor staged_input = call.stage(input, "input");
  at::Tensor staged_output = call.stage(output, "output");
  if (verify) call.verify_matching_call(staged_input);
  if (input.numel() == 0) return make_work(call, empty_meeting(call, how), nullptr);
  // Both staged on one device: a device tensor that no backend takes went to the host with both.
  // A backend that takes the flat call natively (hierarchical, NCCL) before the one that
  // all-gathers lists.
  const bool native = call.group().backend_for(Collective::kAllGatherIntoTensor, staged_input);
  CollectiveCall native_call("all_gather_into_tensor", Collective::kAllGatherIntoTensor, group);
  CollectiveCall& chosen = native ? native_call : call;
  Backend& backend = chosen.backend(staged_input);
  auto work = flat_launch(
      chosen, [&] { return backend.all_gather_into_tensor(staged_output, staged_input, how); });
  at::Tensor target = output;
  return make_work(chosen, work, [target, staged_output]() mutable {
    CollectiveCall::unstage(target, staged_output);
  });
}

Work reduce_scatter_tensor_async(at::Tensor& output, const at::Tensor& input, ReduceOp op,
                                 const ProcessGroup& group, bool verify, Launch how) {
  CollectiveCall call("reduce_scatter_tensor", Collective::kReduceScatter, group);
  const int size = call.group().size();
  check_flat_sizes(call, input, "input", output, "output", size);
  at::Tensor staged_output = call.stage(output, "output");
  at::Tensor staged_input = call.stage(input, "input");
  const bool native = call.group().backend_for(Collective::kReduceScatter, staged_output);
  // Not native: the backend that all-reduces the input, on the host where none takes its device.
  Backend* all_reducer = nullptr;
  if (!native) {
    all_reducer = call.group().backend_for(Collective::kAllReduce, staged_input);
    if (!all_reducer && !staged_input.device().is_cpu()) {
      staged_input = staged_input.cpu();
      all_reducer = call.group().backend_for(Collective::kAllReduce, staged_input);
    }
    if (!all_reducer) call.backend(staged_input);  // throws, naming the group's backends
  }
  Backend& backend = native ? call.backend(staged_output) : *all_reducer;
  auto reduce = detail::backend_reduce(op, output, call, backend);
  if (verify) call.verify_matching_call(staged_input, -1, static_cast<int>(op));
  if (output.numel() == 0) return make_work(call, empty_meeting(call, how), nullptr);
  at::Tensor target = output;
  if (native) {
    auto work = flat_launch(call, [&] {
      return backend.reduce_scatter_tensor(staged_output, staged_input, reduce.op, how);
    });
    return make_work(call, work, [target, staged_output, reduce, size]() mutable {
      if (reduce.divide_by_size) detail::divide_by(staged_output, size);
      CollectiveCall::unstage(target, staged_output);
    });
  }
  // Composed: the input must stay as it was, so the all-reduce runs on a copy.
  at::Tensor whole = staged_input.clone();
  auto work = flat_launch(call, [&] { return backend.all_reduce(whole, reduce.op, how); });
  const int64_t offset = call.group().group_rank * staged_output.numel();
  return make_work(call, work, [target, staged_output, whole, offset, reduce, size]() mutable {
    at::Tensor mine = whole.view(-1).narrow(0, offset, staged_output.numel());
    if (reduce.divide_by_size) detail::divide_by(mine, size);
    staged_output.view(-1).copy_(mine);
    CollectiveCall::unstage(target, staged_output);
  });
}

}  // namespace detail

Work all_gather_into_tensor_async(at::Tensor& output, const at::Tensor& input,
                                  const ProcessGroup& group) {
  return detail::all_gather_into_tensor_async(output, input, group, /*verify=*/true,
                                              Launch::kAsync);
}

void all_gather_into_tensor(at::Tensor& output, const at::Tensor& input,
                            const ProcessGroup& group) {
  detail::all_gather_into_tensor_async(output, input, group, /*verify=*/true, Launch::kWaitNow)
      .wait();
}

Work reduce_scatter_tensor_async(at::Tensor& output, const at::Tensor& input, ReduceOp op,
                                 const ProcessGroup& group) {
  return detail::reduce_scatter_tensor_async(output, input, op, group, /*verify=*/true,
                                             Launch::kAsync);
}

void reduce_scatter_tensor(at::Tensor& output, const at::Tensor& input, ReduceOp op,
                           const ProcessGroup& group) {
  detail::reduce_scatter_tensor_async(output, input, op, group, /*verify=*/true, Launch::kWaitNow)
      .wait();
}

}  // namespace ddp
