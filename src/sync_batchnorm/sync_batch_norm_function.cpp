// SyncBatchNormFunction: the statistics and gradient sums of every rank, one collective each way.
#include "sync_batchnorm/sync_batch_norm_function.h"

#include <ATen/ATen.h>

#include <utility>

#include "ddp/collectives.h"
#include "sync_batchnorm/batch_norm_kernels.h"

namespace ddp::detail {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr const char* kGroupKey = "process_group";

// The group travels from forward to backward in the context's saved_data, whose values are
// IValues: a capsule holds any intrusive_ptr target without registering a TorchScript class.
struct GroupCapsule : torch::CustomClassHolder {
  explicit GroupCapsule(ProcessGroup group) : group(std::move(group)) {}
  ProcessGroup group;
};

// As PyTorch: the kernels want a contiguous tensor, channels-last memory included.
at::Tensor dense(at::Tensor tensor) {
  if (tensor.is_contiguous(at::MemoryFormat::ChannelsLast) ||
      tensor.is_contiguous(at::MemoryFormat::ChannelsLast3d)) {
    return tensor;
  }
  return tensor.contiguous();
}

// The dtype of the per-channel statistics: what batch_norm_stats returns for this input (float
// for 16-bit input). An empty rank packs its zeros in it too, so that every rank all-gathers the
// same dtype (PyTorch's empty rank uses the input's dtype, which differs for half input).
c10::ScalarType statistics_type(const at::Tensor& input) {
  const auto type = input.scalar_type();
  return type == at::kHalf || type == at::kBFloat16 ? at::kFloat : type;
}

}  // namespace

at::Tensor SyncBatchNormFunction::forward(AutogradContext* ctx, at::Tensor input,
                                          const at::Tensor& weight, const at::Tensor& bias,
                                          const at::Tensor& running_mean,
                                          const at::Tensor& running_var, double eps,
                                          double momentum, const ProcessGroup& group) {
  input = dense(std::move(input));
  const at::Tensor contiguous_weight = weight.defined() ? weight.contiguous() : weight;
  const int64_t channels = input.size(1);
  const auto options = input.options().dtype(statistics_type(input));

  at::Tensor packed;
  if (input.numel() > 0) {
    auto [mean, invstd] = detail::batch_norm_stats(input, eps);
    auto count = at::full({1}, static_cast<double>(input.numel() / channels), mean.options());
    packed = at::cat({mean, invstd, count});
  } else {
    packed = at::zeros({2 * channels + 1}, options);
  }
  // All-gather, not all-reduce: the ranks' counts may differ, and combining means and variances
  // needs each rank's own.
  const auto gathered = at::stack(ddp::all_gather(packed, group));
  auto mean_all = gathered.narrow(1, 0, channels);
  auto invstd_all = gathered.narrow(1, channels, channels);
  auto count_all = gathered.narrow(1, 2 * channels, 1).reshape({-1});
  // Ranks with empty batches have no statistics to combine.
  const auto nonempty = count_all >= 1;
  mean_all = mean_all.index({nonempty});
  invstd_all = invstd_all.index({nonempty});
  count_all = count_all.index({nonempty});
  // PyTorch 2.x's cast: the kernel reads the counts in the running statistics' dtype.
  const auto counts = running_mean.defined() ? count_all.to(running_mean.scalar_type()) : count_all;
  auto [mean, invstd] = detail::batch_norm_gather_stats_with_counts(
      input, mean_all, invstd_all, running_mean, running_var, momentum, eps, counts);

  ctx->save_for_backward({input, contiguous_weight, mean, invstd, count_all.to(at::kInt)});
  ctx->saved_data[kGroupKey] = c10::IValue::make_capsule(c10::make_intrusive<GroupCapsule>(group));
  if (input.numel() == 0) return at::empty_like(input);
  return detail::batch_norm_elemt(input, contiguous_weight, bias, mean, invstd, eps);
}

variable_list SyncBatchNormFunction::backward(AutogradContext* ctx, variable_list grad_outputs) {
  const auto saved = ctx->get_saved_variables();
  const at::Tensor& input = saved[0];
  at::Tensor weight = saved[1];
  const at::Tensor& mean = saved[2];
  const at::Tensor& invstd = saved[3];
  const at::Tensor& counts = saved[4];
  const auto capsule = ctx->saved_data[kGroupKey].toCapsule();
  const ProcessGroup& group = static_cast<GroupCapsule*>(capsule.get())->group;
  const bool input_g = ctx->needs_input_grad(0);
  const bool weight_g = weight.defined() && ctx->needs_input_grad(1);
  const bool bias_g = weight.defined() && ctx->needs_input_grad(2);
  const int64_t channels = input.size(1);

  at::Tensor grad_input, grad_weight, grad_bias;
  if (input.numel() > 0) {
    const auto grad_output = dense(grad_outputs[0]);
    at::Tensor sum_dy, sum_dy_xmu;
    std::tie(sum_dy, sum_dy_xmu, grad_weight, grad_bias) = detail::batch_norm_backward_reduce(
        grad_output, input, mean, invstd, weight, input_g, weight_g, bias_g);
    if (input_g) {
      auto packed = at::cat({sum_dy, sum_dy_xmu});
      ddp::all_reduce(packed, ReduceOp::SUM, group);
      // PyTorch 2.x's cast, for a weight kept in another dtype than the statistics.
      if (weight.defined() && weight.scalar_type() != mean.scalar_type()) {
        weight = weight.to(mean.scalar_type());
      }
      grad_input = detail::batch_norm_backward_elemt(grad_output, input, mean, invstd, weight,
                                                     packed.narrow(0, 0, channels),
                                                     packed.narrow(0, channels, channels), counts);
    }
    if (!weight_g) grad_weight = at::Tensor();
    if (!bias_g) grad_bias = at::Tensor();
  } else if (input_g) {
    // No gradient of our own, but the peers' all-reduce needs this rank: join it with zeros.
    // Undefined gradients stand for zeros in autograd.
    auto packed = at::zeros({2 * channels}, mean.options());
    ddp::all_reduce(packed, ReduceOp::SUM, group);
    grad_weight = grad_bias = at::Tensor();
  }
  // One entry per forward argument: the group, eps, momentum and running statistics get none.
  return {grad_input,   grad_weight,  grad_bias,    at::Tensor(), at::Tensor(),
          at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
}

}  // namespace ddp::detail
