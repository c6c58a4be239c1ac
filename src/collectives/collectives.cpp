// The collectives of include/ddp/collectives.h on top of the backends' interface
// (process_group/backend.h). The synchronous calls issue with Launch::kWaitNow and wait at once.
#include "ddp/collectives.h"

#include <ATen/ATen.h>

#include "collectives/collective_call.h"
#include "collectives/reduce_op.h"
#include "collectives/unverified.h"
#include "common/error_context.h"
#include "process_group/work_state.h"

namespace ddp {
namespace {

using detail::Backend;
using detail::Collective;
using detail::CollectiveCall;
using detail::Launch;

uint64_t bytes_of(const std::vector<at::Tensor>& tensors) {
  uint64_t bytes = 0;
  for (const auto& tensor : tensors) bytes += tensor.nbytes();
  return bytes;
}

// Runs `body`, which issues the call on the backend, and wraps its failure with the operation's
// context. `payload`: the bytes handed to the backend, for the group's traffic counters.
template <typename Body>
c10::intrusive_ptr<c10d::Work> launch(CollectiveCall& call, uint64_t payload, Body&& body) {
  try {
    call.mark_started();
    auto work = body();
    call.group().traffic.add(call.collective(), payload);
    return work;
  } catch (const std::exception& error) {
    detail::rethrow_backend_failure(call.operation(), error);
  }
}

void wait_now(CollectiveCall& call, const c10::intrusive_ptr<c10d::Work>& work) {
  try {
    detail::wait_for_backend_work(*work, call.completion_poll_limit());
  } catch (const std::exception& error) {
    detail::rethrow_backend_failure(call.operation(), error);
  }
}

}  // namespace

namespace detail {

Work all_reduce_async(at::Tensor& tensor, ReduceOp op, const ProcessGroup& group, bool verify,
                      Launch how) {
  CollectiveCall call("all_reduce", Collective::kAllReduce, group);
  at::Tensor staged = call.stage(tensor);
  Backend& backend = call.backend(staged);
  auto reduce = detail::backend_reduce(op, tensor, call, backend);
  if (verify) call.verify_matching_call(staged, -1, static_cast<int>(op));
  const int64_t size = call.group().size();
  auto work =
      launch(call, staged.nbytes(), [&] { return backend.all_reduce(staged, reduce.op, how); });
  at::Tensor target = tensor;
  return make_work(call, work, [target, staged, reduce, size]() mutable {
    at::Tensor result = staged;
    if (reduce.divide_by_size) detail::divide_by(result, size);
    CollectiveCall::unstage(target, result);
  });
}

bool reduces_lists_in_place(const ProcessGroup& group, const at::Tensor& like) {
  auto state = group.state();
  return state->is_member() && state->backend_for(Collective::kAllReduceLists, like) != nullptr;
}

bool reduces_natively(const ProcessGroup& group, const at::Tensor& like) {
  auto state = group.state();
  if (!state->is_member()) return false;
  const Backend* backend = state->backend_for(Collective::kAllReduce, like);
  return backend != nullptr && backend->reduces(like.scalar_type());
}

bool narrows_only_between_hosts(const ProcessGroup& group, const at::Tensor& like) {
  auto state = group.state();
  return state->is_member() &&
         state->backend_for(Collective::kAllReduceNarrowBetweenHosts, like) != nullptr;
}

Work average_narrow_between_hosts_async(at::Tensor& tensor, c10::ScalarType wire,
                                        const ProcessGroup& group) {
  CollectiveCall call("all_reduce", Collective::kAllReduceNarrowBetweenHosts, group);
  Backend& backend = call.backend(tensor);
  const int64_t size = call.group().size();
  auto work = launch(call, tensor.nbytes(), [&] {
    return backend.all_reduce_narrow_between_hosts(tensor, wire, size, Launch::kAsync);
  });
  return make_work(call, work, nullptr);
}

Work premul_sum_async(std::vector<at::Tensor> inputs, std::vector<at::Tensor> outputs,
                      double factor, const ProcessGroup& group) {
  CollectiveCall call("all_reduce", Collective::kAllReduceLists, group);
  if (inputs.empty()) call.fail("premul_sum_async needs at least one tensor");
  Backend& backend = call.backend(inputs[0]);
  const uint64_t payload = bytes_of(inputs);
  auto work = launch(call, payload, [&] {
    return backend.all_reduce_lists(std::move(inputs), std::move(outputs),
                                    c10d::ReduceOp::PREMUL_SUM, factor, Launch::kAsync);
  });
  return make_work(call, work, nullptr);
}

Work broadcast_async(at::Tensor& tensor, int src, const ProcessGroup& group, bool verify,
                     Launch how) {
  CollectiveCall call("broadcast", Collective::kBroadcast, group);
  const int root = call.group_rank_of(src, "src");
  at::Tensor staged = call.stage(tensor);
  if (verify) call.verify_matching_call(staged, src);
  Backend& backend = call.backend(staged);
  auto work =
      launch(call, staged.nbytes(), [&] { return backend.broadcast(staged, root, how); });
  at::Tensor target = tensor;
  return make_work(call, work,
                   [target, staged]() mutable { CollectiveCall::unstage(target, staged); });
}

std::vector<int64_t> sum_counts(const std::vector<int64_t>& mine, const ProcessGroup& group,
                                const c10::Device& device) {
  at::Tensor counts = at::tensor(at::ArrayRef<int64_t>(mine), at::kLong).to(device);
  all_reduce_async(counts, ReduceOp::SUM, group, /*verify=*/false, Launch::kWaitNow).wait();
  at::Tensor on_host = counts.cpu();
  const int64_t* sums = on_host.data_ptr<int64_t>();
  return std::vector<int64_t>(sums, sums + mine.size());
}

void verify_ddp_step(const char* step, c10::ScalarType dtype, int64_t elements,
                     const ProcessGroup& group) {
  CollectiveCall call(step, Collective::kAllGather, group);
  try {
    call.verify_matching_fingerprint(dtype, elements);
  } catch (const MismatchError&) {
    throw;  // the fingerprints say what happened, uneven inputs included
  } catch (const DistributedError& error) {
    // A peer that exited or went quiet while the others are in DDP's step: most often a rank
    // whose data ran out.
    std::string message = error.what();
    if (!message.empty() && message.back() != '.') message += '.';
    throw_like(error,
               message + " If that rank left the training loop early, the ranks had uneven " +
                   "inputs (different numbers of batches). " + kUnevenInputsAdvice,
               error.operation());
  }
}

}  // namespace detail

Work all_reduce_async(at::Tensor& tensor, ReduceOp op, const ProcessGroup& group) {
  return detail::all_reduce_async(tensor, op, group, /*verify=*/true, detail::Launch::kAsync);
}

void all_reduce(at::Tensor& tensor, ReduceOp op, const ProcessGroup& group) {
  detail::all_reduce_async(tensor, op, group, /*verify=*/true, detail::Launch::kWaitNow).wait();
}

Work broadcast_async(at::Tensor& tensor, int src, const ProcessGroup& group) {
  return detail::broadcast_async(tensor, src, group, /*verify=*/true, detail::Launch::kAsync);
}

void broadcast(at::Tensor& tensor, int src, const ProcessGroup& group) {
  detail::broadcast_async(tensor, src, group, /*verify=*/true, detail::Launch::kWaitNow).wait();
}

void reduce(at::Tensor& tensor, int dst, ReduceOp op, const ProcessGroup& group) {
  CollectiveCall call("reduce", detail::Collective::kReduce, group);
  const int root = call.group_rank_of(dst, "dst");
  at::Tensor staged = call.stage(tensor);
  detail::Backend& backend = call.backend(staged);
  auto backend_op = detail::backend_reduce(op, tensor, call, backend);
  call.verify_matching_call(staged, dst, static_cast<int>(op));
  wait_now(call, launch(call, staged.nbytes(),
                       [&] { return backend.reduce(staged, root, backend_op.op); }));
  if (call.group().group_rank == root) {
    if (backend_op.divide_by_size) detail::divide_by(staged, call.group().size());
    CollectiveCall::unstage(tensor, staged);
  }
}

namespace detail {

Work all_gather_async(const at::Tensor& tensor, std::vector<at::Tensor>& outputs,
                      const ProcessGroup& group, bool verify, Launch how) {
  CollectiveCall call("all_gather", Collective::kAllGather, group);
  at::Tensor staged = call.stage(tensor);
  if (verify) call.verify_matching_call(staged);
  outputs.clear();
  std::vector<at::Tensor> gathered;
  for (int i = 0; i < call.group().size(); ++i) gathered.push_back(at::empty_like(staged));
  Backend& backend = call.backend(staged);
  auto work = launch(call, staged.nbytes(),
                     [&] { return backend.all_gather(gathered, staged, how); });
  // The backend fills the outputs in place; hand them out as the caller's tensor was: its dtype,
  // its device.
  std::vector<std::pair<at::Tensor, at::Tensor>> moves;  // (on the host, on the caller's device)
  for (auto& buffer : gathered) {
    at::Tensor out = tensor.is_complex() ? at::view_as_complex(buffer) : buffer;
    if (out.device() != tensor.device()) {
      at::Tensor placed = at::empty_like(out, out.options().device(tensor.device()));
      moves.emplace_back(out, placed);
      out = placed;
    }
    outputs.push_back(out);
  }
  if (moves.empty()) return make_work(call, work, nullptr);
  return make_work(call, work, [moves]() mutable {
    for (auto& [host, placed] : moves) placed.copy_(host);
  });
}

}  // namespace detail

Work all_gather_async(const at::Tensor& tensor, std::vector<at::Tensor>& outputs,
                      const ProcessGroup& group) {
  return detail::all_gather_async(tensor, outputs, group, /*verify=*/true, detail::Launch::kAsync);
}

std::vector<at::Tensor> all_gather(const at::Tensor& tensor, const ProcessGroup& group) {
  std::vector<at::Tensor> outputs;
  detail::all_gather_async(tensor, outputs, group, /*verify=*/true, detail::Launch::kWaitNow)
      .wait();
  return outputs;
}

std::vector<at::Tensor> gather(const at::Tensor& tensor, int dst, const ProcessGroup& group) {
  CollectiveCall call("gather", detail::Collective::kGather, group);
  const int root = call.group_rank_of(dst, "dst");
  at::Tensor staged = call.stage(tensor);
  call.verify_matching_call(staged, dst);
  const bool is_root = call.group().group_rank == root;
  std::vector<at::Tensor> outputs;
  if (is_root) {
    for (int i = 0; i < call.group().size(); ++i) outputs.push_back(at::empty_like(staged));
  }
  detail::Backend& backend = call.backend(staged);
  wait_now(call, launch(call, staged.nbytes(),
                       [&] { return backend.gather(outputs, staged, root); }));
  if (!is_root) return {};
  for (auto& out : outputs) {
    if (tensor.is_complex()) out = at::view_as_complex(out);
    if (out.device() != tensor.device()) out = out.to(tensor.device());
  }
  return outputs;
}

void scatter(at::Tensor& out, const std::vector<at::Tensor>& inputs, int src,
             const ProcessGroup& group) {
  CollectiveCall call("scatter", detail::Collective::kScatter, group);
  const int root = call.group_rank_of(src, "src");
  at::Tensor staged = call.stage(out, "out");
  call.verify_matching_call(staged, src);
  const bool is_root = call.group().group_rank == root;
  std::vector<at::Tensor> sources;
  if (is_root) {
    if (static_cast<int>(inputs.size()) != call.group().size()) {
      call.fail("src rank needs one input per group rank: got " + std::to_string(inputs.size()) +
                " inputs for a group of " + std::to_string(call.group().size()));
    }
    for (size_t i = 0; i < inputs.size(); ++i) {
      call.check_same_shape(inputs[i], out, "inputs[" + std::to_string(i) + "]");
      sources.push_back(call.stage(inputs[i], "input").to(staged.device()));
    }
  }
  detail::Backend& backend = call.backend(staged);
  const uint64_t payload = is_root ? bytes_of(sources) : staged.nbytes();
  wait_now(call, launch(call, payload, [&] { return backend.scatter(staged, sources, root); }));
  CollectiveCall::unstage(out, staged);
}

void reduce_scatter(at::Tensor& out, const std::vector<at::Tensor>& inputs, ReduceOp op,
                    const ProcessGroup& group) {
  int size = 0;
  {
    CollectiveCall call("reduce_scatter", detail::Collective::kReduceScatter, group);
    size = call.group().size();
    if (static_cast<int>(inputs.size()) != size) {
      call.fail("needs one input per group rank: got " + std::to_string(inputs.size()) +
                " inputs for a group of " + std::to_string(size));
    }
    for (size_t i = 0; i < inputs.size(); ++i) {
      call.check_same_shape(inputs[i], out, "inputs[" + std::to_string(i) + "]");
    }
    at::Tensor staged = call.stage(out, "out");
    if (call.group().backend_for(detail::Collective::kReduceScatter, staged)) {
      // A backend that reduce-scatters natively: each rank reduces only its own part.
      detail::Backend& backend = call.backend(staged);
      auto reduce = detail::backend_reduce(op, out, call, backend);
      call.verify_matching_call(staged, -1, static_cast<int>(op));
      std::vector<at::Tensor> sources;
      for (const auto& input : inputs) {
        sources.push_back(call.stage(input, "input").to(staged.device()));
      }
      wait_now(call, launch(call, bytes_of(sources), [&] {
                 return backend.reduce_scatter(staged, sources, reduce.op,
                                               detail::Launch::kWaitNow);
               }));
      if (reduce.divide_by_size) detail::divide_by(staged, size);
      CollectiveCall::unstage(out, staged);
      return;
    }
  }
  // No native reduce-scatter (gloo). One all-reduce of the concatenated inputs moves
  // 2(n-1)/n of the data per rank where a ring reduce-scatter moves (n-1)/n: at most twice the
  // optimum, in a single collective, against n separate reduce calls that would serialise on the
  // roots.
  std::vector<at::Tensor> flat;
  for (const auto& input : inputs) flat.push_back(input.reshape(-1));
  at::Tensor all = at::cat(flat);
  all_reduce(all, op, group);
  const int64_t numel = out.numel();
  const int rank = group.state()->group_rank;
  out.copy_(all.narrow(0, rank * numel, numel).view(out.sizes()));
}

void send(const at::Tensor& tensor, int dst, const ProcessGroup& group, int tag) {
  CollectiveCall call("send", detail::Collective::kSendRecv, group);
  int peer = call.group_rank_of(dst, "dst");
  if (peer == call.group().group_rank) call.fail("a rank cannot send to itself");
  at::Tensor staged = call.stage(tensor);
  detail::Backend& backend = call.backend(staged);
  wait_now(call, launch(call, staged.nbytes(), [&] { return backend.send(staged, peer, tag); }));
}

void recv(at::Tensor& tensor, int src, const ProcessGroup& group, int tag) {
  CollectiveCall call("recv", detail::Collective::kSendRecv, group);
  int peer = call.group_rank_of(src, "src");
  if (peer == call.group().group_rank) call.fail("a rank cannot receive from itself");
  at::Tensor staged = call.stage(tensor);
  detail::Backend& backend = call.backend(staged);
  wait_now(call, launch(call, staged.nbytes(), [&] { return backend.recv(staged, peer, tag); }));
  CollectiveCall::unstage(tensor, staged);
}

void barrier(const ProcessGroup& group) {
  CollectiveCall call("barrier", detail::Collective::kBarrier, group);
  call.verify_matching_call(at::Tensor());
  detail::Backend& backend = call.backend(at::Tensor());
  wait_now(call, launch(call, 0, [&] { return backend.barrier(detail::Launch::kWaitNow); }));
}

}  // namespace ddp
