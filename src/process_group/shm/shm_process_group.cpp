#include "process_group/shm/shm_process_group.h"

#include <algorithm>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "common/error_context.h"
#include "process_group/shm/op_queue.h"
#include "process_group/shm/shm_reduce.h"

namespace ddp::detail {
namespace {

// In the leaders' store: why the first host to fail did (see run_across_hosts).
const char* const kHostFailureKey = "host_failure";

// Shared memory takes dense CPU tensors; anything else (a CUDA tensor on a CUDA build) goes to
// gloo, which knows what to do with it.
bool fits_shm(const at::Tensor& tensor) {
  return tensor.defined() && tensor.device().is_cpu() && tensor.layout() == c10::kStrided &&
         tensor.is_contiguous();
}

bool fits_shm(const std::vector<at::Tensor>& tensors, const at::Tensor& like) {
  for (const auto& tensor : tensors) {
    if (!fits_shm(tensor) || tensor.scalar_type() != like.scalar_type() ||
        tensor.numel() != like.numel()) {
      return false;
    }
  }
  return true;
}

}  // namespace

ShmProcessGroup::ShmProcessGroup(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                 ShmGroupOptions options, const std::string& operation)
    : c10d::ProcessGroup(rank, size), topology_(std::move(options.topology)) {
  host_ = topology_.host_of[rank];
  gloo_ = std::move(options.gloo);
  if (topology_.hosts() > 1 && topology_.leader(host_) == rank) {
    int leader_index = host_;  // hosts are numbered in the order of their leaders
    leaders_store_ = c10::make_intrusive<c10d::PrefixStore>("shm_leaders", store);
    leaders_ = options.make_gloo(leaders_store_, leader_index, topology_.hosts());
  }
  const auto& members = topology_.members[host_];
  if (members.size() > 1) {
    ShmGroupSetup setup;
    setup.job = options.job;
    setup.attempt = options.attempt;
    setup.group = options.group;
    setup.host_index = host_;
    setup.local_rank = topology_.local_rank(rank);
    for (int member : members) setup.global_ranks.push_back(options.global_ranks[member]);
    setup.timeout = options.timeout;
    local_ = std::make_unique<ShmCommunicator>(*store, setup, operation);
  }
  queue_ = OpQueue::start();
}

ShmProcessGroup::~ShmProcessGroup() {
  queue_->shut_down("ddp: the process group was destroyed before this collective ran");
}

c10::intrusive_ptr<c10d::Work> ShmProcessGroup::enqueue(c10d::OpType type,
                                                        std::function<void()> body) {
  return queue_->submit(getRank(), type, std::move(body));
}

void ShmProcessGroup::all_reduce_now(at::Tensor& tensor, c10d::ReduceOp::RedOpType op,
                                     const char* operation) {
  auto within_host = [&] {
    if (local_) {
      local_->all_reduce(tensor.data_ptr(), tensor.numel(), tensor.scalar_type(), op, operation);
    }
  };
  if (topology_.hosts() == 1) return within_host();
  run_across_hosts(operation, [&] {
    within_host();
    if (leaders_) {
      std::vector<at::Tensor> tensors{tensor};
      c10d::AllreduceOptions options;
      options.reduceOp = op;
      wait_for_leaders(operation, leaders_->allreduce(tensors, options));
    }
    if (local_) local_->broadcast(tensor.data_ptr(), tensor.nbytes(), 0, operation);
  });
}

void ShmProcessGroup::broadcast_now(at::Tensor& tensor, int root) {
  const int root_host = topology_.host_of[root];
  auto within_root_host = [&] {
    if (host_ == root_host && local_) {
      local_->broadcast(tensor.data_ptr(), tensor.nbytes(), topology_.local_rank(root));
    }
  };
  if (topology_.hosts() == 1) return within_root_host();
  run_across_hosts("broadcast", [&] {
    within_root_host();
    if (leaders_) {
      std::vector<at::Tensor> tensors{tensor};
      c10d::BroadcastOptions options;
      options.rootRank = root_host;  // leader index == host index
      wait_for_leaders("broadcast", leaders_->broadcast(tensors, options));
    }
    if (host_ != root_host && local_) local_->broadcast(tensor.data_ptr(), tensor.nbytes(), 0);
  });
}

template <typename Body>
void ShmProcessGroup::run_across_hosts(const char* operation, Body&& body) {
  if (!broken_.empty()) {
    fail(operation, "this group is broken since an earlier collective failed (" + broken_ +
                        "); destroy it and make a new one");
  }
  try {
    body();
  } catch (const std::exception& error) {
    // The group is broken for good: this host's ranks must not wait for this one, and the other
    // hosts must not wait for this host. A leader closes its connections to the other leaders by
    // destroying its gloo group of them: their gloo call fails at once (instead of when this
    // process exits, or at the timeout), and each of them breaks its own host's group in turn.
    broken_ = error.what();
    if (local_) local_->abort(std::string(operation) + " across hosts: " + error.what());
    if (leaders_) {
      try {
        const std::string reason = error.what();  // names this rank, and the cause
        // The first cause stays: a leader that fails only because another host failed does not
        // overwrite it.
        leaders_store_->compareSet(kHostFailureKey, {},
                                   std::vector<uint8_t>(reason.begin(), reason.end()));
      } catch (const std::exception&) {
        // The store is gone too: the closed connections alone tell the other leaders.
      }
      leaders_.reset();
    }
    throw;
  }
}

void ShmProcessGroup::wait_for_leaders(const char* operation,
                                       const c10::intrusive_ptr<c10d::Work>& work) {
  try {
    work->wait();
  } catch (const std::exception& error) {
    // Most likely another host's leader closed its connections after a failure on its host:
    // name that failure rather than only the closed connection.
    std::string cause;
    try {
      if (leaders_store_->check({kHostFailureKey})) {
        std::vector<uint8_t> why = leaders_store_->get(kHostFailureKey);
        cause.assign(why.begin(), why.end());
      }
    } catch (const std::exception&) {
    }
    if (cause.empty()) rethrow_backend_failure(std::string(operation) + " between hosts", error);
    fail(operation, "another host failed, so this one stops too: " + cause);
  }
}

c10::intrusive_ptr<c10d::Work> ShmProcessGroup::allreduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::AllreduceOptions& opts) {
  if (tensors.size() != 1 || !fits_shm(tensors[0])) return gloo_->allreduce(tensors, opts);
  at::Tensor tensor = tensors[0];
  const auto op = opts.reduceOp.op_;
  check_reducible(tensor.scalar_type(), op, "all_reduce");
  return enqueue(c10d::OpType::ALLREDUCE,
                 [this, tensor, op]() mutable { all_reduce_now(tensor, op); });
}

c10::intrusive_ptr<c10d::Work> ShmProcessGroup::broadcast(std::vector<at::Tensor>& tensors,
                                                          const c10d::BroadcastOptions& opts) {
  if (tensors.size() != 1 || !fits_shm(tensors[0]) || opts.rootTensor != 0) {
    return gloo_->broadcast(tensors, opts);
  }
  at::Tensor tensor = tensors[0];
  const int root = static_cast<int>(opts.rootRank);
  if (root < 0 || root >= getSize()) {
    fail("broadcast", "root rank " + std::to_string(root) + " is outside the group of " +
                          std::to_string(getSize()));
  }
  return enqueue(c10d::OpType::BROADCAST,
                 [this, tensor, root]() mutable { broadcast_now(tensor, root); });
}

c10::intrusive_ptr<c10d::Work> ShmProcessGroup::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  const bool shm = single_host() && local_ && inputs.size() == 1 && outputs.size() == 1 &&
                   fits_shm(inputs[0]) && static_cast<int>(outputs[0].size()) == getSize() &&
                   fits_shm(outputs[0], inputs[0]);
  if (!shm) return gloo_->allgather(outputs, inputs, opts);
  at::Tensor input = inputs[0];
  std::vector<at::Tensor> targets = outputs[0];
  return enqueue(c10d::OpType::ALLGATHER, [this, input, targets] {
    std::vector<void*> pointers;
    for (const auto& target : targets) pointers.push_back(target.data_ptr());
    local_->all_gather(input.data_ptr(), input.nbytes(), pointers);
  });
}

c10::intrusive_ptr<c10d::Work> ShmProcessGroup::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  if (outputs.size() != 1 || inputs.size() != 1 ||
      static_cast<int>(inputs[0].size()) != getSize() || !fits_shm(outputs[0]) ||
      !fits_shm(inputs[0], outputs[0])) {
    fail("reduce_scatter",
         "the shm backend takes one dense CPU output and one input per group "
         "rank, all of the output's size and dtype");
  }
  at::Tensor output = outputs[0];
  std::vector<at::Tensor> sources = inputs[0];
  const auto op = opts.reduceOp.op_;
  check_reducible(output.scalar_type(), op, "reduce_scatter");
  return enqueue(c10d::OpType::REDUCE_SCATTER, [this, output, sources, op]() mutable {
    if (single_host() && !local_) {  // a group of one
      output.copy_(sources[0]);
      return;
    }
    if (single_host()) {
      std::vector<const void*> pointers;
      for (const auto& source : sources) pointers.push_back(source.data_ptr());
      local_->reduce_scatter(output.data_ptr(), pointers, output.numel(), output.scalar_type(), op);
      return;
    }
    // Across hosts: one hierarchical all-reduce of everything, keep this rank's part.
    std::vector<at::Tensor> flat;
    for (const auto& source : sources) flat.push_back(source.reshape(-1));
    at::Tensor all = at::cat(flat);
    all_reduce_now(all, op, "reduce_scatter");
    output.copy_(all.narrow(0, getRank() * output.numel(), output.numel()).view(output.sizes()));
  });
}

c10::intrusive_ptr<c10d::Work> ShmProcessGroup::barrier(const c10d::BarrierOptions& opts) {
  if (!single_host() || !local_) return gloo_->barrier(opts);
  return enqueue(c10d::OpType::BARRIER, [this] { local_->barrier(); });
}

bool ShmProcessGroup::reduces_lists_in_place(const c10d::ProcessGroup& backend) {
  const auto* shm = dynamic_cast<const ShmProcessGroup*>(&backend);
  return shm && shm->single_host();
}

bool ShmProcessGroup::fits_lists(const std::vector<at::Tensor>& tensors) const {
  return single_host() && !tensors.empty() &&
         std::all_of(tensors.begin(), tensors.end(), [&](const at::Tensor& tensor) {
           return fits_shm(tensor) && tensor.scalar_type() == tensors[0].scalar_type();
         });
}

c10::intrusive_ptr<c10d::Work> ShmProcessGroup::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  if (!fits_lists(tensors)) return gloo_->allreduce_coalesced(tensors, opts);
  const auto op = opts.reduceOp.op_;
  double factor = 1.0;
  if (op == c10d::ReduceOp::PREMUL_SUM) {
    const auto* premul =
        dynamic_cast<const c10d::NCCLPreMulSumSupplement*>(opts.reduceOp.supplement_.get());
    if (!premul || !premul->tensor_factors.empty()) {
      fail("all_reduce_coalesced",
           "PREMUL_SUM needs its factor as a number "
           "(c10d::makeNCCLPreMulSum(double)), not as tensors");
    }
    factor = premul->double_factor;
  }
  return all_reduce_lists(tensors, tensors, op, factor);
}

c10::intrusive_ptr<c10d::Work> ShmProcessGroup::premul_sum_into(std::vector<at::Tensor> inputs,
                                                                std::vector<at::Tensor> outputs,
                                                                double factor) {
  const char* operation = "all_reduce";
  const bool shapes_match =
      inputs.size() == outputs.size() &&
      std::equal(inputs.begin(), inputs.end(), outputs.begin(),
                 [](const at::Tensor& a, const at::Tensor& b) { return a.numel() == b.numel(); });
  if (!fits_lists(inputs) || !fits_lists(outputs) ||
      outputs[0].scalar_type() != inputs[0].scalar_type() || !shapes_match) {
    fail(operation,
         "premul_sum_into takes, on one host, dense CPU inputs of one dtype and "
         "outputs of the same dtype and element counts");
  }
  return all_reduce_lists(std::move(inputs), std::move(outputs), c10d::ReduceOp::PREMUL_SUM,
                          factor);
}

c10::intrusive_ptr<c10d::Work> ShmProcessGroup::all_reduce_lists(std::vector<at::Tensor> inputs,
                                                                 std::vector<at::Tensor> outputs,
                                                                 c10d::ReduceOp::RedOpType op,
                                                                 double factor) {
  const c10::ScalarType dtype = inputs[0].scalar_type();
  check_reducible(dtype, op, "all_reduce_coalesced");
  return enqueue(c10d::OpType::ALLREDUCE_COALESCED, [this, inputs, outputs, dtype, op, factor] {
    if (!local_) {
      // A group of one: the sum is the input itself, premultiplied as the peers' would be.
      for (size_t i = 0; i < inputs.size(); ++i) {
        const void* source[1] = {inputs[i].data_ptr()};
        const bool unchanged = op != c10d::ReduceOp::PREMUL_SUM || factor == 1.0;
        if (unchanged && source[0] == outputs[i].data_ptr()) continue;
        reduce_into(outputs[i].data_ptr(), source, 1, inputs[i].numel(), dtype, op, factor);
      }
      return;
    }
    ScatteredBytes input, output;
    for (const auto& tensor : inputs) input.add(tensor.data_ptr(), tensor.nbytes());
    for (const auto& tensor : outputs) output.add(tensor.data_ptr(), tensor.nbytes());
    local_->all_reduce(input, output, dtype, op, factor);
  });
}

c10::intrusive_ptr<c10d::Work> ShmProcessGroup::reduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::ReduceOptions& opts) {
  return gloo_->reduce(tensors, opts);
}

c10::intrusive_ptr<c10d::Work> ShmProcessGroup::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  return gloo_->_allgather_base(output, input, opts);
}

c10::intrusive_ptr<c10d::Work> ShmProcessGroup::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return gloo_->allgather_coalesced(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> ShmProcessGroup::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  return gloo_->gather(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> ShmProcessGroup::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  return gloo_->scatter(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> ShmProcessGroup::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                              std::vector<int64_t>& output_splits,
                                                              std::vector<int64_t>& input_splits,
                                                              const c10d::AllToAllOptions& opts) {
  return gloo_->alltoall_base(output, input, output_splits, input_splits, opts);
}

c10::intrusive_ptr<c10d::Work> ShmProcessGroup::alltoall(std::vector<at::Tensor>& outputs,
                                                         std::vector<at::Tensor>& inputs,
                                                         const c10d::AllToAllOptions& opts) {
  return gloo_->alltoall(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> ShmProcessGroup::send(std::vector<at::Tensor>& tensors, int dst,
                                                     int tag) {
  return gloo_->send(tensors, dst, tag);
}

c10::intrusive_ptr<c10d::Work> ShmProcessGroup::recv(std::vector<at::Tensor>& tensors, int src,
                                                     int tag) {
  return gloo_->recv(tensors, src, tag);
}

c10::intrusive_ptr<c10d::Work> ShmProcessGroup::recvAnysource(std::vector<at::Tensor>& tensors,
                                                              int tag) {
  return gloo_->recvAnysource(tensors, tag);
}

void ShmProcessGroup::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  gloo_->monitoredBarrier(opts, wait_all_ranks);
}

void ShmProcessGroup::setSequenceNumberForGroup() { gloo_->setSequenceNumberForGroup(); }

uint64_t ShmProcessGroup::getSequenceNumberForGroup() { return gloo_->getSequenceNumberForGroup(); }

}  // namespace ddp::detail
