// DataParallel: one process, several replicas of a module, each on its own device and thread.
//
// Each forward splits the batch along dim 0 into one chunk per device, runs the module on the
// first chunk and fresh clones of it on the others, in parallel threads, and concatenates the
// outputs on the output device. On GPUs each replica runs on its own CUDA stream, also when
// several replicas share one GPU. Backward reaches the original parameters: each replica's
// parameters are linked to the originals by a summing autograd node, so the original .grad holds
// the sum over replicas, equal to one pass over the whole batch. The first replica IS the module,
// so in-place updates such as batch-norm running statistics survive; the clones' do not (as in
// PyTorch). Works with CPU devices (several replicas on the CPU) and with CUDA devices where
// libtorch has CUDA; libtorch's own data_parallel needs CUDA. Prefer DistributedDataParallel (one
// process per device), as PyTorch recommends: no cloning, no threads contending in one process.
// REQUIRES: the module is Cloneable (torch::nn::Cloneable<Impl>, as every built-in module and
// torch::nn::Sequential are). Thread-safety: one forward at a time per DataParallel.
#pragma once

#include <ATen/Functions.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <functional>
#include <memory>
#include <type_traits>
#include <vector>

namespace ddp {
namespace detail {

// Clones `module` onto `device` and links each clone parameter's gradient to the original's.
std::shared_ptr<torch::nn::Module> replicate_linked(
    const std::shared_ptr<torch::nn::Module>& module, const c10::Device& device);
// Runs calls[i] for every i, calls[0] on this thread and the others on threads of their own,
// with this thread's autograd mode, each on devices[i] (a CUDA stream of its own for a GPU
// replica); rethrows the first failure after all have finished.
void run_in_parallel(const std::vector<std::function<void()>>& calls,
                     const std::vector<c10::Device>& devices);
// Validates devices (non-empty) and the input (a tensor with a batch dimension).
void check_data_parallel(const std::vector<c10::Device>& devices, const at::Tensor& input);

template <typename T>
struct ModuleOf;
template <typename T>
struct ModuleOf<std::shared_ptr<T>> {
  using type = T;
  static std::shared_ptr<T> pointer(const std::shared_ptr<T>& p) { return p; }
};
template <typename T>
struct ModuleOf<torch::nn::ModuleHolder<T>> {
  using type = T;
  static std::shared_ptr<T> pointer(const torch::nn::ModuleHolder<T>& h) { return h.ptr(); }
};

}  // namespace detail

/// `ModulePointer` is a module holder (torch::nn::Sequential, a TORCH_MODULE type) or a
/// std::shared_ptr to a module.
template <typename ModulePointer>
class DataParallel {
  // Module holders derive from ModuleHolder<Impl>; find which.
  template <typename Impl>
  static detail::ModuleOf<torch::nn::ModuleHolder<Impl>> holder_of(
      const torch::nn::ModuleHolder<Impl>*);
  template <typename T>
  static detail::ModuleOf<std::shared_ptr<T>> holder_of(const std::shared_ptr<T>*);
  using Traits = decltype(holder_of(static_cast<const ModulePointer*>(nullptr)));
  using Impl = typename Traits::type;

 public:
  /// `devices`: one replica per entry (e.g. {kCPU, kCPU} for two CPU replicas); the output lands
  /// on `output_device`, by default devices[0].
  DataParallel(ModulePointer module, std::vector<c10::Device> devices,
               c10::optional<c10::Device> output_device = c10::nullopt)
      : module_(std::move(module)),
        devices_(std::move(devices)),
        output_device_(
            output_device.value_or(devices_.empty() ? c10::Device(c10::kCPU) : devices_[0])) {}

  at::Tensor forward(const at::Tensor& input) {
    detail::check_data_parallel(devices_, input);
    auto chunks = input.chunk(static_cast<int64_t>(devices_.size()), 0);
    std::vector<at::Tensor> outputs(chunks.size());
    std::vector<std::shared_ptr<Impl>> replicas(chunks.size());
    std::vector<std::function<void()>> calls;
    const auto original = Traits::pointer(module_);
    for (size_t i = 0; i < chunks.size(); ++i) {
      replicas[i] =
          i == 0 ? original
                 : std::dynamic_pointer_cast<Impl>(detail::replicate_linked(original, devices_[i]));
      calls.push_back([&, i] { outputs[i] = replicas[i]->forward(chunks[i].to(devices_[i])); });
    }
    detail::run_in_parallel(calls, devices_);
    for (auto& output : outputs) output = output.to(output_device_);
    return at::cat(outputs, 0);
  }
  at::Tensor operator()(const at::Tensor& input) { return forward(input); }

  ModulePointer& module() { return module_; }
  const std::vector<c10::Device>& devices() const { return devices_; }

 private:
  ModulePointer module_;
  std::vector<c10::Device> devices_;
  c10::Device output_device_;
};

}  // namespace ddp
