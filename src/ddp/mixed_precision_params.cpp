#include "ddp/mixed_precision_params.h"

#include <ATen/ATen.h>
#include <torch/version.h>

#include <string>

#include "common/error_context.h"

namespace ddp::detail {
namespace {

constexpr const char* kMixedPrecisionOperation = "DistributedDataParallel";

std::string dtype_name(c10::ScalarType dtype) { return c10::toString(dtype); }

// libtorch 1.13 has no float16 matrix product on the CPU ("addmm_impl_cpu_" not implemented for
// 'Half'); 2.x has. Asked of the libtorch itself rather than of its version number.
bool cpu_multiplies_float16() {
  try {
    at::Tensor a = at::ones({2, 2}, at::TensorOptions().dtype(at::kHalf));
    (void)at::mm(a, a);
    return true;
  } catch (const c10::Error&) {
    return false;
  }
}

}  // namespace

void check_mixed_precision_options(const DDPOptions& options, const c10::Device& device) {
  const MixedPrecision& config = *options.mixed_precision();
  if (options.gradient_as_bucket_view()) {
    fail<InvalidArgumentError>(
        kMixedPrecisionOperation,
        "mixed_precision does not combine with gradient_as_bucket_view(true): the buckets hold "
        "reduce_dtype averages while .grad stays float32, so .grad cannot be a view of a bucket. "
        "Use gradient_as_bucket_view(false) (the default).");
  }
  const std::pair<const char*, c10::ScalarType> dtypes[] = {
      {"param_dtype", config.param_dtype()},
      {"reduce_dtype", config.effective_reduce_dtype()},
      {"buffer_dtype", config.effective_buffer_dtype()}};
  for (const auto& [what, dtype] : dtypes) {
    if (!c10::isFloatingType(dtype)) {
      fail<InvalidArgumentError>(kMixedPrecisionOperation,
                                 std::string("MixedPrecision's ") + what +
                                     " must be a floating-point dtype (torch::kBFloat16, "
                                     "torch::kFloat16, torch::kFloat32), got " +
                                     dtype_name(dtype));
    }
  }
  if (device.is_cpu() && config.param_dtype() == at::kHalf && !cpu_multiplies_float16()) {
    fail<InvalidArgumentError>(
        kMixedPrecisionOperation,
        "MixedPrecision().param_dtype(torch::kFloat16) on a CPU module: this libtorch (" +
            std::string(TORCH_VERSION) +
            ") cannot multiply float16 matrices on the CPU (libtorch 2.x can). Use "
            "param_dtype(torch::kBFloat16) on the CPU, or float16 on a CUDA module.");
  }
}

MixedPrecisionParams::MixedPrecisionParams(std::vector<at::Tensor> parameters,
                                           std::shared_ptr<torch::nn::Module> module,
                                           MixedPrecision config)
    : parameters_(std::move(parameters)), module_(std::move(module)), config_(config) {
  for (const auto& parameter : parameters_) {
    masters_.push_back(parameter.detach());
    copies_.push_back(at::empty_like(parameter, parameter.options().dtype(config_.param_dtype())));
  }
  grads_aside_.resize(parameters_.size());
}

void MixedPrecisionParams::cast_for_forward() {
  if (cast_) restore();  // a forward with grad enabled that no backward finished
  c10::NoGradGuard no_grad;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    at::Tensor& parameter = parameters_[i];
    grads_aside_[i] = parameter.grad();
    parameter.mutable_grad() = at::Tensor();
    copies_[i].copy_(masters_[i]);
    parameter.set_data(copies_[i]);
  }
  // Read again each time, as DDP's buffer broadcast does: a module may replace its buffers.
  buffers_.clear();
  buffer_masters_.clear();
  const auto buffer_dtype = config_.effective_buffer_dtype();
  for (const auto& item : module_->named_buffers(/*recurse=*/true)) {
    at::Tensor buffer = item.value();
    if (!buffer.defined() || !buffer.is_floating_point() || buffer.scalar_type() == buffer_dtype) {
      continue;
    }
    buffer_masters_.push_back(buffer.detach());
    buffer.set_data(buffer.to(buffer_dtype));
    buffers_.push_back(buffer);
  }
  cast_ = true;
}

void MixedPrecisionParams::restore_data() {
  c10::NoGradGuard no_grad;
  for (size_t i = 0; i < parameters_.size(); ++i) parameters_[i].set_data(masters_[i]);
  // What forward wrote into a buffer (running statistics) is kept, in the master's dtype.
  for (size_t i = 0; i < buffers_.size(); ++i) {
    buffer_masters_[i].copy_(buffers_[i].detach());
    buffers_[i].set_data(buffer_masters_[i]);
  }
  buffers_.clear();
  buffer_masters_.clear();
  cast_ = false;
}

void MixedPrecisionParams::restore() {
  if (!cast_) return;
  restore_data();
  for (size_t i = 0; i < parameters_.size(); ++i) {
    parameters_[i].mutable_grad() = std::move(grads_aside_[i]);
    grads_aside_[i] = at::Tensor();
  }
}

void MixedPrecisionParams::finish_backward(const std::vector<at::Tensor>& averages) {
  restore_data();
  c10::NoGradGuard no_grad;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    at::Tensor grad = std::move(grads_aside_[i]);
    grads_aside_[i] = at::Tensor();
    if (averages[i].defined()) {
      // Added in the master's dtype: accumulation without zero_grad never sums in low precision.
      // The averages are the bucket's views, shaped like their parameters. A fresh .grad must
      // be no view: libtorch 1.13's Optimizer::zero_grad detaches it in place.
      if (grad.defined()) {
        grad.add_(averages[i]);
      } else {
        grad = averages[i].to(masters_[i].scalar_type(), /*non_blocking=*/false, /*copy=*/true);
      }
    }
    parameters_[i].mutable_grad() = grad;
  }
}

}  // namespace ddp::detail
