// The non-template parts of DataParallel: linked replicas and parallel application.
#include "ddp/data_parallel.h"

#include <ATen/ATen.h>
#include <ATen/ThreadLocalState.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <exception>
#include <optional>
#include <thread>

#include "common/error_context.h"
#include "compat/libtorch_compat.h"

namespace ddp::detail {
namespace {

// The backward of replication: the gradients that every replica's copy of one parameter
// received, summed onto the original's device and passed to the original's accumulator.
// libtorch's ReduceAdd does the same, but its header comes with CUDA-only dependencies.
struct SumReplicaGradients : torch::autograd::Node {
  explicit SumReplicaGradients(c10::Device destination) : destination_(destination) {}
  torch::autograd::variable_list apply(torch::autograd::variable_list&& inputs) override {
    at::Tensor sum;
    for (const auto& input : inputs) {
      if (!input.defined()) continue;
      sum = sum.defined() ? sum.add_(input.to(destination_)) : input.to(destination_).clone();
    }
    return {sum};
  }

 private:
  c10::Device destination_;
};

}  // namespace

std::shared_ptr<torch::nn::Module> replicate_linked(
    const std::shared_ptr<torch::nn::Module>& module, const c10::Device& device) {
  std::shared_ptr<torch::nn::Module> replica;
  try {
    replica = module->clone(device);
  } catch (const std::exception& error) {
    fail("DataParallel", std::string("cannot replicate the module: ") + error.what() +
                             " DataParallel needs a module derived from torch::nn::Cloneable<Impl> "
                             "(with a reset() that registers its submodules and parameters).");
  }
  auto originals = module->named_parameters(/*recurse=*/true);
  auto copies = replica->named_parameters(/*recurse=*/true);
  for (const auto& item : originals) {
    at::Tensor original = item.value();
    if (!original.requires_grad()) continue;
    at::Tensor copy = copies[item.key()];
    auto grad_fn = compat::make_autograd_node<SumReplicaGradients>(original.device());
    grad_fn->set_next_edges(torch::autograd::collect_next_edges(original));
    torch::autograd::set_history(copy, grad_fn);
  }
  return replica;
}

void run_in_parallel(const std::vector<std::function<void()>>& calls,
                     const std::vector<c10::Device>& devices) {
  std::vector<std::exception_ptr> errors(calls.size());
  const at::ThreadLocalState state;  // grad mode and the like, for the helper threads
  // On a GPU each helper replica gets a stream of its own, so that the replicas' kernels run side
  // by side (several replicas of one GPU too); it starts after what the caller's stream has
  // queued (the input), and the caller's stream waits for it before the outputs are gathered.
  std::vector<std::optional<c10::Stream>> side(calls.size());
  std::vector<c10::Event> started, finished;
  for (size_t i = 0; i < calls.size(); ++i) {
    started.emplace_back(devices[i].type());
    finished.emplace_back(devices[i].type());
    if (i == 0 || !devices[i].is_cuda()) continue;
    const auto* impl = c10::impl::getDeviceGuardImpl(devices[i].type());
    side[i] = impl->getStreamFromGlobalPool(devices[i]);
    started[i].record(impl->getStream(devices[i]));
  }
  std::vector<std::thread> threads;
  for (size_t i = 1; i < calls.size(); ++i) {
    threads.emplace_back([&, i] {
      at::ThreadLocalStateGuard guard(state);
      try {
        if (side[i]) {
          c10::StreamGuard on_side(*side[i]);
          started[i].block(*side[i]);
          calls[i]();
          finished[i].record(*side[i]);
        } else {
          calls[i]();
        }
      } catch (...) {
        errors[i] = std::current_exception();
      }
    });
  }
  try {
    if (!calls.empty()) calls[0]();
  } catch (...) {
    errors[0] = std::current_exception();
  }
  for (auto& thread : threads) thread.join();
  for (const auto& error : errors) {
    if (error) std::rethrow_exception(error);
  }
  for (size_t i = 1; i < calls.size(); ++i) {
    if (side[i])
      finished[i].block(c10::impl::getDeviceGuardImpl(devices[i].type())->getStream(devices[i]));
  }
}

void check_data_parallel(const std::vector<c10::Device>& devices, const at::Tensor& input) {
  if (devices.empty()) fail<InvalidArgumentError>("DataParallel", "needs at least one device");
  if (!input.defined() || input.dim() == 0) {
    fail<InvalidArgumentError>(
        "DataParallel", "the input must be a tensor with a batch dimension (dim 0) to split");
  }
}

}  // namespace ddp::detail
