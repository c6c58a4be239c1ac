// MixedPrecisionParams: DistributedDataParallel's parameters and buffers under mixed precision
// (include/ddp/mixed_precision.h says what the user sees).
//
// Each parameter keeps its float32 master (its data at construction, what the optimizer updates)
// and a param_dtype copy made once. Before a forward, the master is copied into the copy and the
// copy becomes the parameter's data (set_data: the same variable, so the module, the optimizer
// and the reducer's hooks see the same parameter), and the .grad left from before is set aside,
// so that backward writes its low-precision gradient alone into .grad. At the end of backward the
// reducer hands over the averages (finish_backward): the masters come back and each .grad becomes
// the one set aside plus the average, in float32. Floating-point buffers get a buffer_dtype copy
// for the same span; what forward wrote into it is copied back into the master.
//
// set_data to another dtype drops a parameter's gradient accumulator (autograd makes a new one
// for the new dtype), so the reducer re-attaches its hooks after each cast
// (Reducer::refresh_grad_accumulators).
//
// Thread-safety: the training thread calls cast/restore between backwards; finish_backward runs
// on the autograd thread at the end of backward, never concurrently with the others.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <memory>
#include <vector>

#include "ddp/distributed_data_parallel.h"
#include "ddp/mixed_precision.h"

namespace ddp::detail {

/// Refuses, by name, the options that mixed precision does not combine with
/// (gradient_as_bucket_view), dtypes that are not floating point, and float16 parameters on a
/// CPU whose libtorch cannot multiply float16 there. `device`: the parameters' device.
void check_mixed_precision_options(const DDPOptions& options, const c10::Device& device);

class MixedPrecisionParams {
 public:
  MixedPrecisionParams(std::vector<at::Tensor> parameters,
                       std::shared_ptr<torch::nn::Module> module, MixedPrecision config);
  MixedPrecisionParams(const MixedPrecisionParams&) = delete;
  MixedPrecisionParams& operator=(const MixedPrecisionParams&) = delete;

  /// Before a forward: parameters and floating-point buffers become their low-precision copies,
  /// each .grad is set aside. After a forward that no backward finished, restores first.
  void cast_for_forward();
  /// After a forward that no backward will finish (grad disabled): the masters come back, with
  /// their .grad as it was.
  void restore();
  /// The end of a synchronized backward. averages[i]: parameter i's average in reduce_dtype,
  /// undefined where no rank used it. .grad becomes the set-aside .grad plus the average.
  void finish_backward(const std::vector<at::Tensor>& averages);

  c10::ScalarType param_dtype() const { return config_.param_dtype(); }

 private:
  void restore_data();

  std::vector<at::Tensor> parameters_;
  std::vector<at::Tensor> masters_;     // the float32 data, what the optimizer updates
  std::vector<at::Tensor> copies_;      // param_dtype, the data during forward and backward
  std::vector<at::Tensor> grads_aside_;  // each .grad from before the forward
  std::shared_ptr<torch::nn::Module> module_;
  MixedPrecision config_;
  // The floating-point buffers cast for this forward, and their masters.
  std::vector<at::Tensor> buffers_;
  std::vector<at::Tensor> buffer_masters_;
  bool cast_ = false;  // the data are the copies
};

}  // namespace ddp::detail
