// SyncBatchNorm's per-channel steps: libtorch's CUDA kernels, or the same arithmetic elsewhere.
#include "sync_batchnorm/batch_norm_kernels.h"

#include <ATen/ATen.h>

#include <vector>

namespace ddp::detail {
namespace {

// Where libtorch has the kernels. Only CUDA registers them (see the header); any other device
// takes the tensor-operation path, which is correct everywhere, only slower.
bool has_native_kernels(const at::Tensor& input) { return input.is_cuda(); }

// The dtype the CUDA kernels accumulate in: float for the 16-bit floating types.
c10::ScalarType accumulate_type(const at::Tensor& input) {
  const auto type = input.scalar_type();
  return type == at::kHalf || type == at::kBFloat16 ? at::kFloat : type;
}

// Every dimension but the channels' (1): the values one channel's statistics range over.
std::vector<int64_t> reduced_dims(const at::Tensor& input) {
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < input.dim(); ++d) dims.push_back(d);
  return dims;
}

// A per-channel vector shaped [1, C, 1, ...] to broadcast against `input`.
at::Tensor per_channel(const at::Tensor& values, const at::Tensor& input) {
  std::vector<int64_t> shape(static_cast<size_t>(input.dim()), 1);
  shape[1] = values.numel();
  return values.reshape(shape);
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> batch_norm_stats(const at::Tensor& input, double eps) {
  if (has_native_kernels(input)) return at::batch_norm_stats(input, eps);
  const auto x = input.to(accumulate_type(input));
  const auto dims = reduced_dims(input);
  auto mean = x.mean(dims);
  // The biased variance, as batch normalization uses it.
  auto variance = (x - per_channel(mean, input)).square().mean(dims);
  return {mean, (variance + eps).rsqrt()};
}

std::tuple<at::Tensor, at::Tensor> batch_norm_gather_stats_with_counts(
    const at::Tensor& input, const at::Tensor& mean_all, const at::Tensor& invstd_all,
    const at::Tensor& running_mean, const at::Tensor& running_var, double momentum, double eps,
    const at::Tensor& counts) {
  if (has_native_kernels(input)) {
    return at::batch_norm_gather_stats_with_counts(input, mean_all, invstd_all, running_mean,
                                                   running_var, momentum, eps, counts);
  }
  const auto weights = counts.to(mean_all.scalar_type()).reshape({-1, 1});
  const auto total = weights.sum(0);
  auto mean = (mean_all * weights).sum(0) / total;
  // Each rank's biased variance back from its invstd, then the law of total variance: the mean of
  // the ranks' variances plus the variance of their means, weighted by their counts.
  const auto rank_variances = invstd_all.pow(-2) - eps;
  const auto variance = ((rank_variances + (mean_all - mean).square()) * weights).sum(0) / total;
  if (running_mean.defined()) {
    running_mean.mul_(1 - momentum).add_(mean.to(running_mean.scalar_type()) * momentum);
  }
  if (running_var.defined()) {
    const auto unbiased = variance * total / (total - 1);
    running_var.mul_(1 - momentum).add_(unbiased.to(running_var.scalar_type()) * momentum);
  }
  return {mean, (variance + eps).rsqrt()};
}

at::Tensor batch_norm_elemt(const at::Tensor& input, const at::Tensor& weight,
                            const at::Tensor& bias, const at::Tensor& mean,
                            const at::Tensor& invstd, double eps) {
  if (has_native_kernels(input)) {
    return at::batch_norm_elemt(input, weight, bias, mean, invstd, eps);
  }
  const auto type = accumulate_type(input);
  auto output = (input.to(type) - per_channel(mean, input)) * per_channel(invstd, input);
  if (weight.defined()) output = output * per_channel(weight.to(type), input);
  if (bias.defined()) output = output + per_channel(bias.to(type), input);
  return output.to(input.scalar_type());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> batch_norm_backward_reduce(
    const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& mean,
    const at::Tensor& invstd, const at::Tensor& weight, bool input_g, bool weight_g, bool bias_g) {
  if (has_native_kernels(input)) {
    return at::batch_norm_backward_reduce(grad_out, input, mean, invstd, weight, input_g, weight_g,
                                          bias_g);
  }
  const auto type = accumulate_type(input);
  const auto dims = reduced_dims(input);
  const auto dy = grad_out.to(type);
  const auto sum_dy = dy.sum(dims);
  const auto sum_dy_xmu = (dy * (input.to(type) - per_channel(mean, input))).sum(dims);
  const auto weight_type = weight.defined() ? weight.scalar_type() : type;
  at::Tensor grad_weight, grad_bias;
  if (weight_g) grad_weight = (sum_dy_xmu * invstd).to(weight_type);
  if (bias_g) grad_bias = sum_dy.to(weight_type);
  if (!input_g) return {at::Tensor(), at::Tensor(), grad_weight, grad_bias};
  return {sum_dy, sum_dy_xmu, grad_weight, grad_bias};
}

at::Tensor batch_norm_backward_elemt(const at::Tensor& grad_out, const at::Tensor& input,
                                     const at::Tensor& mean, const at::Tensor& invstd,
                                     const at::Tensor& weight, const at::Tensor& sum_dy,
                                     const at::Tensor& sum_dy_xmu, const at::Tensor& counts) {
  if (has_native_kernels(input)) {
    return at::batch_norm_backward_elemt(grad_out, input, mean, invstd, weight, sum_dy, sum_dy_xmu,
                                         counts);
  }
  const auto type = accumulate_type(input);
  const auto total = counts.sum().to(type);
  const auto mean_dy = sum_dy / total;
  const auto mean_dy_xmu = sum_dy_xmu / total;
  const auto xmu_factor = invstd.square() * mean_dy_xmu;
  const auto scale = weight.defined() ? weight.to(type) * invstd : invstd;
  const auto grad_input =
      (grad_out.to(type) - per_channel(mean_dy, input) -
       (input.to(type) - per_channel(mean, input)) * per_channel(xmu_factor, input)) *
      per_channel(scale, input);
  return grad_input.to(input.scalar_type());
}

}  // namespace ddp::detail
