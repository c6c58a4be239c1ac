// MixedPrecision: the dtypes a data-parallel wrapper computes, reduces and keeps buffers in, after
// PyTorch's private torch.distributed._MixedPrecision (DistributedDataParallel's mixed_precision=).
//
// It only names dtypes, so that every wrapper (DistributedDataParallel now, sharded training
// later) can take it; what each does with it is said where it is taken. For DDP
// (DDPOptions().mixed_precision, README "Mixed precision"):
//   - forward and backward run on param_dtype copies of the parameters: before each forward the
//     float32 master of each parameter is copied into its param_dtype copy, which becomes the
//     parameter's data; floating-point tensor arguments of forward are cast to param_dtype;
//   - gradients are averaged in buckets of reduce_dtype, then handed to .grad in the master's
//     dtype (float32), added to the .grad that was there before the forward (accumulation without
//     zero_grad keeps PyTorch's meaning, without summing in low precision);
//   - once backward ends (or right after a forward under torch::NoGradGuard), the parameters'
//     data are the float32 masters again: the optimizer updates them, state_dict and checkpoints
//     hold them;
//   - floating-point buffers are buffer_dtype copies for the same span; what forward wrote into
//     them (BatchNorm's running statistics) is copied back into their float32 masters. Those
//     statistics are therefore computed in buffer_dtype: set buffer_dtype(torch::kFloat32) to
//     keep them in full precision (SyncBatchNorm accepts float32 statistics with bfloat16 input).
//
//   ddp::DDPOptions().mixed_precision(ddp::MixedPrecision()
//       .param_dtype(torch::kBFloat16).reduce_dtype(torch::kFloat32));
//
// A plain value type; copy it freely.
#pragma once

#include <c10/core/ScalarType.h>
#include <torch/arg.h>

#include <optional>

namespace ddp {

struct MixedPrecision {
  /// The dtype of the parameters' copies that forward and backward run on. bfloat16 works on the
  /// CPU and CUDA; float16 on CUDA, and on the CPU only with a libtorch that multiplies float16
  /// there (2.x; not 1.13: refused by name). Default: torch::kBFloat16.
  TORCH_ARG(c10::ScalarType, param_dtype) = c10::ScalarType::BFloat16;
  /// The dtype in which gradients are averaged across ranks (the buckets' dtype). Default:
  /// nullopt, meaning param_dtype.
  TORCH_ARG(std::optional<c10::ScalarType>, reduce_dtype) = std::nullopt;
  /// The dtype of floating-point buffers during forward (and backward). Default: nullopt,
  /// meaning param_dtype, as in PyTorch.
  TORCH_ARG(std::optional<c10::ScalarType>, buffer_dtype) = std::nullopt;

 public:  // TORCH_ARG leaves the fields private
  /// reduce_dtype, or param_dtype when unset.
  c10::ScalarType effective_reduce_dtype() const { return reduce_dtype_.value_or(param_dtype_); }
  /// buffer_dtype, or param_dtype when unset.
  c10::ScalarType effective_buffer_dtype() const { return buffer_dtype_.value_or(param_dtype_); }
};

}  // namespace ddp
