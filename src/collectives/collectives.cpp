// The collectives of include/ddp/collectives.h on top of c10d's ProcessGroup interface.
#include "ddp/collectives.h"

#include <ATen/ATen.h>

#include "collectives/collective_call.h"
#include "collectives/reduce_op.h"
#include "collectives/unverified.h"
#include "common/error_context.h"
#include "process_group/shm/shm_process_group.h"
#include "process_group/waits_at_once.h"
#include "process_group/work_state.h"

namespace ddp {
namespace {

using detail::CollectiveCall;

// Issues `launch` on the backend and wraps its failure with the operation's context.
template <typename Launch>
c10::intrusive_ptr<c10d::Work> launch(CollectiveCall& call, Launch&& body) {
  try {
    return body();
  } catch (const std::exception& error) {
    detail::rethrow_backend_failure(call.operation(), error);
  }
}

Work make_work(CollectiveCall& call, c10::intrusive_ptr<c10d::Work> work,
               std::function<void()> on_success) {
  return Work(std::make_shared<detail::WorkState>(std::move(work), call.operation(),
                                                  std::move(on_success)));
}

void wait_now(CollectiveCall& call, const c10::intrusive_ptr<c10d::Work>& work) {
  try {
    work->wait();
  } catch (const std::exception& error) {
    detail::rethrow_backend_failure(call.operation(), error);
  }
}

}  // namespace

namespace detail {

Work all_reduce_async(at::Tensor& tensor, ReduceOp op, const ProcessGroup& group, bool verify) {
  CollectiveCall call("all_reduce", group);
  at::Tensor staged = call.stage(tensor);
  auto reduce = detail::backend_reduce(op, tensor, call);
  if (verify) call.verify_matching_call(staged, -1, static_cast<int>(op));
  const int64_t size = call.group().size();
  std::vector<at::Tensor> tensors{staged};
  c10d::AllreduceOptions options;
  options.reduceOp = reduce.op;
  auto work = launch(call, [&] { return call.backend().allreduce(tensors, options); });
  at::Tensor target = tensor;
  return make_work(call, work, [target, staged, reduce, size]() mutable {
    at::Tensor result = staged;
    if (reduce.divide_by_size) detail::divide_by(result, size);
    CollectiveCall::unstage(target, result);
  });
}

bool reduces_lists_in_place(const ProcessGroup& group) {
  CollectiveCall call("all_reduce", group);
  return ShmProcessGroup::reduces_lists_in_place(call.backend());
}

Work premul_sum_async(std::vector<at::Tensor> inputs, std::vector<at::Tensor> outputs,
                      double factor, const ProcessGroup& group) {
  CollectiveCall call("all_reduce", group);
  auto* shm = dynamic_cast<ShmProcessGroup*>(&call.backend());
  if (!shm || !shm->single_host()) {
    call.fail("premul_sum_async needs the shm backend on one host (see reduces_lists_in_place)");
  }
  auto work = launch(
      call, [&] { return shm->premul_sum_into(std::move(inputs), std::move(outputs), factor); });
  return make_work(call, work, nullptr);
}

Work broadcast_async(at::Tensor& tensor, int src, const ProcessGroup& group, bool verify) {
  CollectiveCall call("broadcast", group);
  c10d::BroadcastOptions options;
  options.rootRank = call.group_rank_of(src, "src");
  at::Tensor staged = call.stage(tensor);
  if (verify) call.verify_matching_call(staged, src);
  std::vector<at::Tensor> tensors{staged};
  auto work = launch(call, [&] { return call.backend().broadcast(tensors, options); });
  at::Tensor target = tensor;
  return make_work(call, work,
                   [target, staged]() mutable { CollectiveCall::unstage(target, staged); });
}

}  // namespace detail

Work all_reduce_async(at::Tensor& tensor, ReduceOp op, const ProcessGroup& group) {
  return detail::all_reduce_async(tensor, op, group, /*verify=*/true);
}

void all_reduce(at::Tensor& tensor, ReduceOp op, const ProcessGroup& group) {
  detail::WaitsAtOnce waits;  // the call returns only once the backend is done
  all_reduce_async(tensor, op, group).wait();
}

Work broadcast_async(at::Tensor& tensor, int src, const ProcessGroup& group) {
  return detail::broadcast_async(tensor, src, group, /*verify=*/true);
}

void broadcast(at::Tensor& tensor, int src, const ProcessGroup& group) {
  detail::WaitsAtOnce waits;  // the call returns only once the backend is done
  broadcast_async(tensor, src, group).wait();
}

void reduce(at::Tensor& tensor, int dst, ReduceOp op, const ProcessGroup& group) {
  detail::WaitsAtOnce waits;  // the call returns only once the backend is done
  CollectiveCall call("reduce", group);
  c10d::ReduceOptions options;
  options.rootRank = call.group_rank_of(dst, "dst");
  auto backend_op = detail::backend_reduce(op, tensor, call);
  options.reduceOp = backend_op.op;
  at::Tensor staged = call.stage(tensor);
  call.verify_matching_call(staged, dst, static_cast<int>(op));
  std::vector<at::Tensor> tensors{staged};
  wait_now(call, launch(call, [&] { return call.backend().reduce(tensors, options); }));
  if (call.group().group_rank == options.rootRank) {
    if (backend_op.divide_by_size) detail::divide_by(staged, call.group().size());
    CollectiveCall::unstage(tensor, staged);
  }
}

namespace detail {

Work all_gather_async(const at::Tensor& tensor, std::vector<at::Tensor>& outputs,
                      const ProcessGroup& group, bool verify) {
  CollectiveCall call("all_gather", group);
  at::Tensor staged = call.stage(tensor);
  if (verify) call.verify_matching_call(staged);
  outputs.clear();
  std::vector<std::vector<at::Tensor>> gathered(1);
  for (int i = 0; i < call.group().size(); ++i) gathered[0].push_back(at::empty_like(staged));
  std::vector<at::Tensor> inputs{staged};
  auto work = launch(call, [&] { return call.backend().allgather(gathered, inputs); });
  // The backend fills the outputs in place; hand them out in the caller's dtype.
  for (auto& buffer : gathered[0]) {
    outputs.push_back(tensor.is_complex() ? at::view_as_complex(buffer) : buffer);
  }
  return make_work(call, work, nullptr);
}

}  // namespace detail

Work all_gather_async(const at::Tensor& tensor, std::vector<at::Tensor>& outputs,
                      const ProcessGroup& group) {
  return detail::all_gather_async(tensor, outputs, group, /*verify=*/true);
}

std::vector<at::Tensor> all_gather(const at::Tensor& tensor, const ProcessGroup& group) {
  detail::WaitsAtOnce waits;  // the call returns only once the backend is done
  std::vector<at::Tensor> outputs;
  all_gather_async(tensor, outputs, group).wait();
  return outputs;
}

std::vector<at::Tensor> gather(const at::Tensor& tensor, int dst, const ProcessGroup& group) {
  detail::WaitsAtOnce waits;  // the call returns only once the backend is done
  CollectiveCall call("gather", group);
  c10d::GatherOptions options;
  options.rootRank = call.group_rank_of(dst, "dst");
  at::Tensor staged = call.stage(tensor);
  call.verify_matching_call(staged, dst);
  const bool is_root = call.group().group_rank == options.rootRank;
  std::vector<std::vector<at::Tensor>> outputs(is_root ? 1 : 0);
  if (is_root) {
    for (int i = 0; i < call.group().size(); ++i) outputs[0].push_back(at::empty_like(staged));
  }
  std::vector<at::Tensor> inputs{staged};
  wait_now(call, launch(call, [&] { return call.backend().gather(outputs, inputs, options); }));
  if (!is_root) return {};
  if (tensor.is_complex()) {
    for (auto& out : outputs[0]) out = at::view_as_complex(out);
  }
  return outputs[0];
}

void scatter(at::Tensor& out, const std::vector<at::Tensor>& inputs, int src,
             const ProcessGroup& group) {
  detail::WaitsAtOnce waits;  // the call returns only once the backend is done
  CollectiveCall call("scatter", group);
  c10d::ScatterOptions options;
  options.rootRank = call.group_rank_of(src, "src");
  at::Tensor staged = call.stage(out, "out");
  call.verify_matching_call(staged, src);
  const bool is_root = call.group().group_rank == options.rootRank;
  std::vector<std::vector<at::Tensor>> sources(is_root ? 1 : 0);
  if (is_root) {
    if (static_cast<int>(inputs.size()) != call.group().size()) {
      call.fail("src rank needs one input per group rank: got " + std::to_string(inputs.size()) +
                " inputs for a group of " + std::to_string(call.group().size()));
    }
    for (size_t i = 0; i < inputs.size(); ++i) {
      call.check_same_shape(inputs[i], out, "inputs[" + std::to_string(i) + "]");
      sources[0].push_back(call.stage(inputs[i], "input"));
    }
  }
  std::vector<at::Tensor> outputs{staged};
  wait_now(call, launch(call, [&] { return call.backend().scatter(outputs, sources, options); }));
  CollectiveCall::unstage(out, staged);
}

void reduce_scatter(at::Tensor& out, const std::vector<at::Tensor>& inputs, ReduceOp op,
                    const ProcessGroup& group) {
  detail::WaitsAtOnce waits;  // the call returns only once the backend is done
  int size = 0;
  bool native = false;
  {
    CollectiveCall call("reduce_scatter", group);
    size = call.group().size();
    if (static_cast<int>(inputs.size()) != size) {
      call.fail("needs one input per group rank: got " + std::to_string(inputs.size()) +
                " inputs for a group of " + std::to_string(size));
    }
    for (size_t i = 0; i < inputs.size(); ++i) {
      call.check_same_shape(inputs[i], out, "inputs[" + std::to_string(i) + "]");
    }
    at::Tensor staged = call.stage(out, "out");
    native = call.group().backend_name == "shm";
    if (native) {
      // The shm backend reduce-scatters natively: each rank reduces only its own part.
      auto reduce = detail::backend_reduce(op, out, call);
      call.verify_matching_call(staged, -1, static_cast<int>(op));
      std::vector<at::Tensor> outputs{staged};
      std::vector<std::vector<at::Tensor>> sources(1);
      for (const auto& input : inputs) sources[0].push_back(call.stage(input, "input"));
      c10d::ReduceScatterOptions options;
      options.reduceOp = reduce.op;
      wait_now(call, launch(call, [&] {
                 return call.backend().reduce_scatter(outputs, sources, options);
               }));
      if (reduce.divide_by_size) detail::divide_by(staged, size);
      CollectiveCall::unstage(out, staged);
      return;
    }
  }
  // Gloo has no reduce-scatter. One all-reduce of the concatenated inputs moves 2(n-1)/n of the
  // data per rank where a ring reduce-scatter moves (n-1)/n: at most twice the optimum, in a single
  // collective, against n separate reduce calls that would serialise on the roots.
  std::vector<at::Tensor> flat;
  for (const auto& input : inputs) flat.push_back(input.reshape(-1));
  at::Tensor all = at::cat(flat);
  all_reduce(all, op, group);
  const int64_t numel = out.numel();
  const int rank = group.state()->group_rank;
  out.copy_(all.narrow(0, rank * numel, numel).view(out.sizes()));
}

void send(const at::Tensor& tensor, int dst, const ProcessGroup& group, int tag) {
  detail::WaitsAtOnce waits;  // the call returns only once the backend is done
  CollectiveCall call("send", group);
  int peer = call.group_rank_of(dst, "dst");
  if (peer == call.group().group_rank) call.fail("a rank cannot send to itself");
  std::vector<at::Tensor> tensors{call.stage(tensor)};
  wait_now(call, launch(call, [&] { return call.backend().send(tensors, peer, tag); }));
}

void recv(at::Tensor& tensor, int src, const ProcessGroup& group, int tag) {
  detail::WaitsAtOnce waits;  // the call returns only once the backend is done
  CollectiveCall call("recv", group);
  int peer = call.group_rank_of(src, "src");
  if (peer == call.group().group_rank) call.fail("a rank cannot receive from itself");
  at::Tensor staged = call.stage(tensor);
  std::vector<at::Tensor> tensors{staged};
  wait_now(call, launch(call, [&] { return call.backend().recv(tensors, peer, tag); }));
  CollectiveCall::unstage(tensor, staged);
}

void barrier(const ProcessGroup& group) {
  detail::WaitsAtOnce waits;  // the call returns only once the backend is done
  CollectiveCall call("barrier", group);
  call.verify_matching_call(at::Tensor());
  wait_now(call, launch(call, [&] { return call.backend().barrier(); }));
}

}  // namespace ddp
