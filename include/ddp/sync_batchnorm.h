// SyncBatchNorm: the C++ counterpart of torch.nn.SyncBatchNorm, and convert_sync_batchnorm.
//
// Batch normalization whose statistics, in training, are those of the whole batch across the
// ranks of a process group rather than of this rank's part: each forward all-gathers every rank's
// per-channel count, mean and inverse standard deviation (one collective), each backward
// all-reduces the two per-channel sums the input gradient needs (one more). Ranks may hold batches
// of different sizes, empty ones included (they still join both collectives). In eval mode, with a
// group of one rank, or before init_process_group, it is exactly torch::nn::BatchNorm: no
// communication.
//
// The parameters and buffers have BatchNorm's names (weight, bias, running_mean, running_var,
// num_batches_tracked), so state dicts and checkpoints move between the two. The running
// statistics are updated from the global statistics, hence identical on every rank: DDP's
// broadcast_buffers (rank 0's buffers before each forward) is then redundant but harmless.
//
//   torch::nn::Sequential net(torch::nn::Conv2d(3, 64, 3),
//                             ddp::SyncBatchNorm2d(torch::nn::BatchNormOptions(64)),
//                             torch::nn::ReLU());
//   ddp::DistributedDataParallel model(net);
//
// On CUDA tensors it runs PyTorch's own kernels; libtorch has none for other devices, where the
// same arithmetic is done with ordinary tensor operations (CPU tensors work on "gloo" and "shm").
//
// Thread-safety: as any module, one forward or backward at a time. In training, forward and
// backward are collective over the group: every member runs them, in the same order relative to
// its other collectives on that group.
#pragma once

#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/options/batchnorm.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <iosfwd>
#include <memory>

#include "ddp/process_group.h"

namespace ddp {

/// Options of SyncBatchNorm: torch::nn::BatchNormOptions' fields, with PyTorch's defaults, and the
/// group. Made from BatchNormOptions implicitly, so that BatchNorm's options serve both:
///   ddp::SyncBatchNorm2d(torch::nn::BatchNormOptions(64).momentum(0.01))
///   ddp::SyncBatchNorm2d(ddp::SyncBatchNormOptions(64).process_group(group))
struct SyncBatchNormOptions {
  /* implicit */ SyncBatchNormOptions(int64_t num_features) : num_features_(num_features) {}
  /* implicit */ SyncBatchNormOptions(const torch::nn::BatchNormOptions& options);

  /// The number of channels (dimension 1 of the input).
  TORCH_ARG(int64_t, num_features);
  /// Added to the variance for numerical stability. Default: 1e-5.
  TORCH_ARG(double, eps) = 1e-5;
  /// The running statistics' update factor; nullopt: a cumulative average. Default: 0.1.
  TORCH_ARG(c10::optional<double>, momentum) = 0.1;
  /// Learn a per-channel weight and bias. Default: true.
  TORCH_ARG(bool, affine) = true;
  /// Keep running_mean and running_var (and use them in eval mode). Default: true.
  TORCH_ARG(bool, track_running_stats) = true;
  /// The ranks whose batches are normalized together. Default: the world.
  TORCH_ARG(ProcessGroup, process_group) = ProcessGroup();
};

namespace detail {

/// A batch-norm module's tensors, undefined where its options have none.
struct BatchNormTensors {
  at::Tensor weight, bias, running_mean, running_var, num_batches_tracked;
};

/// Fresh tensors for `options`: weight 1, bias 0, running mean 0, running variance 1, count 0.
BatchNormTensors fresh_batch_norm_tensors(const SyncBatchNormOptions& options);
/// Registers `tensors` in `module` under BatchNorm's names.
void register_batch_norm_tensors(torch::nn::Module& module, const BatchNormTensors& tensors);
void reset_running_stats(const SyncBatchNormOptions& options, const BatchNormTensors& tensors);
void reset_affine(const SyncBatchNormOptions& options, const BatchNormTensors& tensors);
at::Tensor sync_batch_norm_forward(const SyncBatchNormOptions& options, bool training,
                                   const at::Tensor& input, const BatchNormTensors& tensors);
void print_sync_batch_norm(std::ostream& stream, const char* name,
                           const SyncBatchNormOptions& options);

/// What SyncBatchNorm and SyncBatchNorm1d/2d/3d share; they differ in the input they accept.
template <typename Derived>
class SyncBatchNormImplBase : public torch::nn::Cloneable<Derived> {
 public:
  explicit SyncBatchNormImplBase(const SyncBatchNormOptions& options_) : options(options_) {
    reset();
  }
  /// Takes `tensors` over (shared, not copied) in place of fresh ones: how convert_sync_batchnorm
  /// keeps a BatchNorm's parameters, so that an optimizer that holds them still trains them.
  SyncBatchNormImplBase(const SyncBatchNormOptions& options_, const BatchNormTensors& tensors)
      : options(options_) {
    adopt(tensors);
  }

  void reset() override { adopt(fresh_batch_norm_tensors(options)); }
  void reset_running_stats() { detail::reset_running_stats(options, tensors()); }
  void reset_parameters() {
    reset_running_stats();
    reset_affine(options, tensors());
  }

  /// REQUIRES: input of the dimensions this module accepts, options.num_features() channels at
  /// dimension 1. In training, collective over options.process_group().
  at::Tensor forward(const at::Tensor& input) {
    _check_input_dim(input);
    return sync_batch_norm_forward(options, this->is_training(), input, tensors());
  }

  SyncBatchNormOptions options;
  /// Defined when options.affine().
  at::Tensor weight, bias;
  /// Defined when options.track_running_stats().
  at::Tensor running_mean, running_var, num_batches_tracked;

 protected:
  /// Throws InvalidArgumentError for an input of dimensions this module does not accept.
  virtual void _check_input_dim(const at::Tensor& input) const = 0;

 private:
  BatchNormTensors tensors() const {
    return {weight, bias, running_mean, running_var, num_batches_tracked};
  }
  void adopt(const BatchNormTensors& adopted) {
    register_batch_norm_tensors(*this, adopted);
    weight = adopted.weight;
    bias = adopted.bias;
    running_mean = adopted.running_mean;
    running_var = adopted.running_var;
    num_batches_tracked = adopted.num_batches_tracked;
  }
};

}  // namespace detail

/// torch.nn.SyncBatchNorm: any input of two dimensions or more, channels at dimension 1.
class SyncBatchNormImpl : public detail::SyncBatchNormImplBase<SyncBatchNormImpl> {
 public:
  using SyncBatchNormImplBase::SyncBatchNormImplBase;
  void pretty_print(std::ostream& stream) const override;

 protected:
  void _check_input_dim(const at::Tensor& input) const override;
};
TORCH_MODULE(SyncBatchNorm);

/// SyncBatchNorm that accepts BatchNorm1d's input: (N, C) or (N, C, L).
class SyncBatchNorm1dImpl : public detail::SyncBatchNormImplBase<SyncBatchNorm1dImpl> {
 public:
  using SyncBatchNormImplBase::SyncBatchNormImplBase;
  void pretty_print(std::ostream& stream) const override;

 protected:
  void _check_input_dim(const at::Tensor& input) const override;
};
TORCH_MODULE(SyncBatchNorm1d);

/// SyncBatchNorm that accepts BatchNorm2d's input: (N, C, H, W).
class SyncBatchNorm2dImpl : public detail::SyncBatchNormImplBase<SyncBatchNorm2dImpl> {
 public:
  using SyncBatchNormImplBase::SyncBatchNormImplBase;
  void pretty_print(std::ostream& stream) const override;

 protected:
  void _check_input_dim(const at::Tensor& input) const override;
};
TORCH_MODULE(SyncBatchNorm2d);

/// SyncBatchNorm that accepts BatchNorm3d's input: (N, C, D, H, W).
class SyncBatchNorm3dImpl : public detail::SyncBatchNormImplBase<SyncBatchNorm3dImpl> {
 public:
  using SyncBatchNormImplBase::SyncBatchNormImplBase;
  void pretty_print(std::ostream& stream) const override;

 protected:
  void _check_input_dim(const at::Tensor& input) const override;
};
TORCH_MODULE(SyncBatchNorm3d);

/// torch.nn.SyncBatchNorm.convert_sync_batchnorm: replaces every torch::nn::BatchNorm1d/2d/3d in
/// `module` by a ddp::SyncBatchNorm1d/2d/3d on `group` that takes over its parameters and
/// running statistics (the same tensors: an optimizer made before still trains them), its options
/// and its training mode. Returns `module`, converted in place, or, when `module` is itself a
/// BatchNorm, its replacement.
///
/// libtorch cannot swap a module held as a typed member (`torch::nn::BatchNorm2d bn1;` in a
/// struct), only the entries of torch::nn::Sequential, ModuleList and ModuleDict. A BatchNorm held
/// anywhere else is an InvalidArgumentError naming its path ("encoder.bn1"): declare it as a
/// ddp::SyncBatchNorm2d there instead. The check comes first: a refused model is left unchanged.
std::shared_ptr<torch::nn::Module> convert_sync_batchnorm(
    std::shared_ptr<torch::nn::Module> module, const ProcessGroup& group = ProcessGroup());

/// The same, for a module holder (torch::nn::Sequential, a TORCH_MODULE type).
template <typename ModuleType>
std::shared_ptr<torch::nn::Module> convert_sync_batchnorm(
    const torch::nn::ModuleHolder<ModuleType>& module, const ProcessGroup& group = ProcessGroup()) {
  return convert_sync_batchnorm(std::shared_ptr<torch::nn::Module>(module.ptr()), group);
}

}  // namespace ddp
