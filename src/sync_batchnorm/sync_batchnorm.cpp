// SyncBatchNorm and SyncBatchNorm1d/2d/3d: BatchNorm's module, with the batch statistics of the
// whole group in training (torch.nn.SyncBatchNorm.forward).
#include "ddp/sync_batchnorm.h"

#include <torch/nn/functional/batchnorm.h>
#include <torch/nn/init.h>

#include <ostream>
#include <string>

#include "common/error_context.h"
#include "ddp/init.h"
#include "sync_batchnorm/sync_batch_norm_function.h"

namespace ddp {

SyncBatchNormOptions::SyncBatchNormOptions(const torch::nn::BatchNormOptions& options)
    : num_features_(options.num_features()),
      eps_(options.eps()),
      momentum_(options.momentum()),
      affine_(options.affine()),
      track_running_stats_(options.track_running_stats()) {}

namespace detail {
namespace {

// "expected 4D input (got 3D input)", the words of libtorch's BatchNorm2d, and what to do.
[[noreturn]] void fail_dimensions(const char* module, const std::string& expected,
                                  const at::Tensor& input, const char* accepts) {
  fail<InvalidArgumentError>(
      module, "expected " + expected + " input (got " + std::to_string(input.dim()) +
                  "D input). It accepts " + accepts +
                  " (channels at dimension 1); reshape the input, or use ddp::SyncBatchNorm, "
                  "which accepts any input of 2 or more dimensions.");
}

}  // namespace

BatchNormTensors fresh_batch_norm_tensors(const SyncBatchNormOptions& options) {
  BatchNormTensors tensors;
  const int64_t channels = options.num_features();
  if (options.affine()) {
    tensors.weight = torch::ones({channels}).requires_grad_();
    tensors.bias = torch::zeros({channels}).requires_grad_();
  }
  if (options.track_running_stats()) {
    tensors.running_mean = torch::zeros({channels});
    tensors.running_var = torch::ones({channels});
    tensors.num_batches_tracked = torch::tensor(0, torch::dtype(torch::kLong));
  }
  return tensors;
}

void register_batch_norm_tensors(torch::nn::Module& module, const BatchNormTensors& tensors) {
  // Each parameter keeps its requires_grad: fresh ones require it, and a frozen BatchNorm that
  // convert_sync_batchnorm hands over stays frozen. Undefined tensors are registered too, as
  // libtorch's BatchNorm does, so that the names always exist.
  const auto trainable = [](const at::Tensor& t) { return t.defined() && t.requires_grad(); };
  module.register_parameter("weight", tensors.weight, trainable(tensors.weight));
  module.register_parameter("bias", tensors.bias, trainable(tensors.bias));
  module.register_buffer("running_mean", tensors.running_mean);
  module.register_buffer("running_var", tensors.running_var);
  module.register_buffer("num_batches_tracked", tensors.num_batches_tracked);
}

void reset_running_stats(const SyncBatchNormOptions& options, const BatchNormTensors& tensors) {
  if (!options.track_running_stats()) return;
  torch::NoGradGuard no_grad;
  tensors.running_mean.zero_();
  tensors.running_var.fill_(1);
  tensors.num_batches_tracked.zero_();
}

void reset_affine(const SyncBatchNormOptions& options, const BatchNormTensors& tensors) {
  if (!options.affine()) return;
  torch::nn::init::ones_(tensors.weight);
  torch::nn::init::zeros_(tensors.bias);
}

at::Tensor sync_batch_norm_forward(const SyncBatchNormOptions& options, bool training,
                                   const at::Tensor& input, const BatchNormTensors& tensors) {
  if (input.size(1) != options.num_features()) {
    fail<InvalidArgumentError>("SyncBatchNorm",
                               "the input has " + std::to_string(input.size(1)) +
                                   " channels at dimension 1, but the module was made for " +
                                   std::to_string(options.num_features()) +
                                   " (num_features); make it with num_features " +
                                   std::to_string(input.size(1)) + ", or give it (N, " +
                                   std::to_string(options.num_features()) + ", ...) input.");
  }
  // The update factor of the running statistics, as torch.nn.SyncBatchNorm chooses it.
  double factor = options.momentum().value_or(0.0);
  if (training && options.track_running_stats() && tensors.num_batches_tracked.defined()) {
    tensors.num_batches_tracked.add_(1);
    factor = options.momentum().has_value() ? *options.momentum()
                                            : 1.0 / tensors.num_batches_tracked.item<double>();
  }
  // Batch statistics in training, and in eval mode when there are no running statistics.
  const bool batch_statistics =
      training || (!tensors.running_mean.defined() && !tensors.running_var.defined());
  // As PyTorch: synchronize only in training (never in eval mode, even with batch statistics),
  // and only with someone to synchronize with; a process outside the group (world size -1)
  // normalizes its own batch.
  const ProcessGroup& group = options.process_group();
  const bool synchronize =
      batch_statistics && training && ddp::is_initialized() && ddp::get_world_size(group) > 1;
  if (!synchronize) {
    return torch::nn::functional::detail::batch_norm(
        input, tensors.running_mean, tensors.running_var, tensors.weight, tensors.bias,
        batch_statistics, factor, options.eps());
  }
  return SyncBatchNormFunction::apply(input, tensors.weight, tensors.bias, tensors.running_mean,
                                      tensors.running_var, options.eps(), factor, group);
}

void print_sync_batch_norm(std::ostream& stream, const char* name,
                           const SyncBatchNormOptions& options) {
  stream << "ddp::" << name << "(" << options.num_features() << ", eps=" << options.eps()
         << ", momentum=";
  if (options.momentum().has_value()) {
    stream << *options.momentum();
  } else {
    stream << "None";
  }
  stream << ", affine=" << (options.affine() ? "true" : "false")
         << ", track_running_stats=" << (options.track_running_stats() ? "true" : "false") << ")";
}

}  // namespace detail

void SyncBatchNormImpl::_check_input_dim(const at::Tensor& input) const {
  if (input.dim() < 2) {
    detail::fail_dimensions("SyncBatchNorm", "at least 2D", input, "(N, C, ...) input");
  }
}
void SyncBatchNormImpl::pretty_print(std::ostream& stream) const {
  detail::print_sync_batch_norm(stream, "SyncBatchNorm", options);
}

void SyncBatchNorm1dImpl::_check_input_dim(const at::Tensor& input) const {
  if (input.dim() != 2 && input.dim() != 3) {
    detail::fail_dimensions("SyncBatchNorm1d", "2D or 3D", input, "(N, C) or (N, C, L) input");
  }
}
void SyncBatchNorm1dImpl::pretty_print(std::ostream& stream) const {
  detail::print_sync_batch_norm(stream, "SyncBatchNorm1d", options);
}

void SyncBatchNorm2dImpl::_check_input_dim(const at::Tensor& input) const {
  if (input.dim() != 4) {
    detail::fail_dimensions("SyncBatchNorm2d", "4D", input, "(N, C, H, W) input");
  }
}
void SyncBatchNorm2dImpl::pretty_print(std::ostream& stream) const {
  detail::print_sync_batch_norm(stream, "SyncBatchNorm2d", options);
}

void SyncBatchNorm3dImpl::_check_input_dim(const at::Tensor& input) const {
  if (input.dim() != 5) {
    detail::fail_dimensions("SyncBatchNorm3d", "5D", input, "(N, C, D, H, W) input");
  }
}
void SyncBatchNorm3dImpl::pretty_print(std::ostream& stream) const {
  detail::print_sync_batch_norm(stream, "SyncBatchNorm3d", options);
}

}  // namespace ddp
