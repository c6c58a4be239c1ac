// The five per-channel steps of SyncBatchNorm, as torch::batch_norm_stats & co. compute them.
//
// libtorch registers these operators for CUDA only (1.13 and 2.x alike: their ATen/ops headers
// have a CUDA dispatch and no CPU one), so a CPU tensor would fail with "Could not run
// 'aten::batch_norm_stats' with arguments from the 'CPU' backend". On CUDA each function calls
// libtorch's kernel, exactly what torch.nn.SyncBatchNorm calls; elsewhere it does the same
// arithmetic with ordinary tensor operations, in the dtype the CUDA kernels accumulate in (float
// for half and bfloat16 input, the input's own otherwise).
//
// The arguments and results are those of the ATen operators of the same names:
//   mean, invstd       per channel, invstd = 1 / sqrt(biased variance + eps)
//   counts             per rank, the number of values per channel it holds
//   sum_dy, sum_dy_xmu per channel, sum of grad_out and of grad_out * (input - mean)
// batch_norm_backward_elemt takes the SUMS over all ranks and the per-rank counts in both 1.13 and
// 2.x (1.13's schema names the two "mean_dy" and "mean_dy_xmu", but its kernel and PyTorch 1.13's
// Python already pass sums with the counts), so no version difference applies.
//
// Thread-safety: pure functions of their arguments, except that gather_stats updates the given
// running statistics in place.
#pragma once

#include <ATen/core/Tensor.h>

#include <tuple>

namespace ddp::detail {

/// This rank's (mean, invstd) per channel. REQUIRES: input.numel() > 0, channels at dim 1.
std::tuple<at::Tensor, at::Tensor> batch_norm_stats(const at::Tensor& input, double eps);

/// The global (mean, invstd) from every rank's mean_all[r], invstd_all[r] and counts[r] (ranks
/// with count 0 already removed); updates running_mean and running_var (when defined) with
/// momentum, the variance unbiased with the global count.
std::tuple<at::Tensor, at::Tensor> batch_norm_gather_stats_with_counts(
    const at::Tensor& input, const at::Tensor& mean_all, const at::Tensor& invstd_all,
    const at::Tensor& running_mean, const at::Tensor& running_var, double momentum, double eps,
    const at::Tensor& counts);

/// (input - mean) * invstd * weight + bias, weight and bias optional (undefined).
at::Tensor batch_norm_elemt(const at::Tensor& input, const at::Tensor& weight,
                            const at::Tensor& bias, const at::Tensor& mean,
                            const at::Tensor& invstd, double eps);

/// (sum_dy, sum_dy_xmu, grad_weight, grad_bias) of this rank; each is undefined where its flag
/// says it is not needed (the sums go with input_g).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> batch_norm_backward_reduce(
    const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& mean,
    const at::Tensor& invstd, const at::Tensor& weight, bool input_g, bool weight_g, bool bias_g);

/// The input gradient from the global sums and the per-rank counts (int32).
at::Tensor batch_norm_backward_elemt(const at::Tensor& grad_out, const at::Tensor& input,
                                     const at::Tensor& mean, const at::Tensor& invstd,
                                     const at::Tensor& weight, const at::Tensor& sum_dy,
                                     const at::Tensor& sum_dy_xmu, const at::Tensor& counts);

}  // namespace ddp::detail
