#include "process_group/shm/shm_backend.h"

#include <algorithm>

#include "common/error_context.h"
#include "process_group/shm/op_queue.h"
#include "process_group/shm/shm_reduce.h"

namespace ddp::detail {
namespace {

bool all_fit_shm(const std::vector<at::Tensor>& tensors, c10::ScalarType dtype) {
  return !tensors.empty() && std::all_of(tensors.begin(), tensors.end(), [&](const at::Tensor& t) {
    return fits_shm(t) && t.scalar_type() == dtype;
  });
}

}  // namespace

bool fits_shm(const at::Tensor& tensor) {
  return tensor.defined() && tensor.device().is_cpu() && tensor.layout() == c10::kStrided &&
         tensor.is_contiguous();
}

ShmBackend::ShmBackend(c10d::Store& store, int rank, const ShmGroupSetup& setup,
                       const std::string& operation)
    : rank_(rank), size_(static_cast<int>(setup.global_ranks.size())) {
  if (size_ > 1) local_ = std::make_unique<ShmCommunicator>(store, setup, operation);
  queue_ = OpQueue::start();
}

ShmBackend::~ShmBackend() {
  queue_->shut_down("ddp: the process group was destroyed before this collective ran");
}

bool ShmBackend::takes(Collective collective, const at::Tensor& like) const {
  switch (collective) {
    case Collective::kBarrier:
      return true;
    case Collective::kAllReduce:
    case Collective::kBroadcast:
    case Collective::kAllGather:
    case Collective::kReduceScatter:
    case Collective::kAllReduceLists:
      return fits_shm(like);
    case Collective::kAllReduceNarrowBetweenHosts:
      return fits_shm(like) && c10::isFloatingType(like.scalar_type());
    default:
      return false;
  }
}

BackendWork ShmBackend::enqueue(c10d::OpType type, Launch launch, std::function<void()> body) {
  return queue_->submit(rank_, type, std::move(body), launch);
}

BackendWork ShmBackend::all_reduce(at::Tensor& tensor, RedOp op, Launch launch) {
  check_reducible(tensor.scalar_type(), op, "all_reduce");
  return enqueue(c10d::OpType::ALLREDUCE, launch, [this, tensor, op] {
    if (local_) local_->all_reduce(tensor.data_ptr(), tensor.numel(), tensor.scalar_type(), op);
  });
}

BackendWork ShmBackend::broadcast(at::Tensor& tensor, int root, Launch launch) {
  if (root < 0 || root >= size_) {
    fail<InvalidArgumentError>(
        "broadcast",
        "root rank " + std::to_string(root) + " is outside the group of " + std::to_string(size_));
  }
  return enqueue(c10d::OpType::BROADCAST, launch, [this, tensor, root] {
    if (local_) local_->broadcast(tensor.data_ptr(), tensor.nbytes(), root);
  });
}

BackendWork ShmBackend::all_gather(std::vector<at::Tensor>& outputs, at::Tensor& input,
                                   Launch launch) {
  if (static_cast<int>(outputs.size()) != size_ || !all_fit_shm(outputs, input.scalar_type()) ||
      std::any_of(outputs.begin(), outputs.end(),
                  [&](const at::Tensor& out) { return out.numel() != input.numel(); })) {
    fail<InvalidArgumentError>(
        "all_gather",
        "the shm backend takes one dense CPU output per group rank, each of the "
        "input's size and dtype");
  }
  return enqueue(c10d::OpType::ALLGATHER, launch, [this, input, targets = outputs] {
    if (!local_) {
      targets[0].copy_(input);
      return;
    }
    std::vector<void*> pointers;
    for (const auto& target : targets) pointers.push_back(target.data_ptr());
    local_->all_gather(input.data_ptr(), input.nbytes(), pointers);
  });
}

BackendWork ShmBackend::reduce_scatter(at::Tensor& output, std::vector<at::Tensor>& inputs,
                                       RedOp op, Launch launch) {
  if (static_cast<int>(inputs.size()) != size_ || !fits_shm(output) ||
      !all_fit_shm(inputs, output.scalar_type()) ||
      std::any_of(inputs.begin(), inputs.end(),
                  [&](const at::Tensor& in) { return in.numel() != output.numel(); })) {
    fail<InvalidArgumentError>(
        "reduce_scatter",
        "the shm backend takes one dense CPU output and one input per group rank, all of the "
        "output's size and dtype");
  }
  check_reducible(output.scalar_type(), op, "reduce_scatter");
  return enqueue(c10d::OpType::REDUCE_SCATTER, launch, [this, output, sources = inputs, op] {
    if (!local_) {
      output.copy_(sources[0]);
      return;
    }
    std::vector<const void*> pointers;
    for (const auto& source : sources) pointers.push_back(source.data_ptr());
    local_->reduce_scatter(output.data_ptr(), pointers, output.numel(), output.scalar_type(), op);
  });
}

BackendWork ShmBackend::barrier(Launch launch) {
  return enqueue(c10d::OpType::BARRIER, launch, [this] {
    if (local_) local_->barrier();
  });
}

BackendWork ShmBackend::all_reduce_lists(std::vector<at::Tensor> inputs,
                                         std::vector<at::Tensor> outputs, RedOp op, double factor,
                                         Launch launch) {
  const bool shapes_match =
      inputs.size() == outputs.size() &&
      std::equal(inputs.begin(), inputs.end(), outputs.begin(),
                 [](const at::Tensor& a, const at::Tensor& b) { return a.numel() == b.numel(); });
  if (inputs.empty() || !all_fit_shm(inputs, inputs[0].scalar_type()) ||
      !all_fit_shm(outputs, inputs[0].scalar_type()) || !shapes_match) {
    fail<InvalidArgumentError>(
        "all_reduce",
        "the shm backend reduces lists of dense CPU inputs of one dtype into outputs of the same "
        "dtype and element counts");
  }
  const c10::ScalarType dtype = inputs[0].scalar_type();
  check_reducible(dtype, op, "all_reduce");
  return enqueue(
      c10d::OpType::ALLREDUCE_COALESCED, launch, [this, inputs, outputs, dtype, op, factor] {
        if (!local_) {
          // A group of one: the sum is the input itself, premultiplied as the peers'
          // would be.
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
        for (const auto& tensor : outputs) {
          output.add(tensor.data_ptr(), tensor.nbytes());
        }
        local_->all_reduce(input, output, dtype, op, factor);
      });
}

BackendWork ShmBackend::all_reduce_narrow_between_hosts(at::Tensor& tensor, c10::ScalarType,
                                                        int64_t divisor, Launch launch) {
  return enqueue(c10d::OpType::ALLREDUCE, launch, [this, tensor, divisor]() mutable {
    if (local_) {
      local_->all_reduce(tensor.data_ptr(), tensor.numel(), tensor.scalar_type(),
                         c10d::ReduceOp::SUM);
    }
    tensor.div_(divisor);
  });
}

}  // namespace ddp::detail
