// DDPCore: the module-type-independent part of DistributedDataParallel.
#include "ddp/distributed_data_parallel.h"

#include <ATen/ATen.h>

#include <unordered_set>

#include "collectives/collective_call.h"
#include "collectives/unverified.h"
#include "common/error_context.h"
#include "ddp/mixed_precision_params.h"
#include "ddp/model_verification.h"
#include "reducer/reducer.h"
#include "trace/flight_recorder.h"
#include "trace/timeline.h"

namespace ddp::detail {
namespace {

constexpr const char* kOperation = "DistributedDataParallel";

// Parameters that require grad, shared ones once (by identity), in registration order.
NamedTensors trainable_parameters(torch::nn::Module& module) {
  NamedTensors result;
  std::unordered_set<const void*> seen;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    const at::Tensor& p = item.value();
    if (!p.requires_grad() || !seen.insert(p.unsafeGetTensorImpl()).second) continue;
    result.names.push_back(item.key());
    result.tensors.push_back(p);
  }
  return result;
}

NamedTensors module_buffers(torch::nn::Module& module) {
  NamedTensors result;
  for (const auto& item : module.named_buffers(/*recurse=*/true)) {
    if (!item.value().defined()) continue;
    result.names.push_back(item.key());
    result.tensors.push_back(item.value());
  }
  return result;
}

size_t megabytes_to_bytes(double mb, const char* option) {
  if (!(mb > 0)) {
    fail<InvalidArgumentError>(
        kOperation, std::string(option) + " must be positive, got " + std::to_string(mb));
  }
  return static_cast<size_t>(mb * 1024 * 1024);
}

}  // namespace

DDPCore::DDPCore(std::shared_ptr<torch::nn::Module> module, DDPOptions options)
    : module_(std::move(module)), options_(std::move(options)) {
  if (!module_) fail<InvalidArgumentError>(kOperation, "the module is null");
  const ProcessGroup& group = options_.process_group();
  if (!group.is_member()) {
    fail<InvalidArgumentError>(
        kOperation, "this rank is not a member of the process group given in DDPOptions");
  }
  NamedTensors parameters = trainable_parameters(*module_);
  if (parameters.tensors.empty()) {
    fail<InvalidArgumentError>(
        kOperation,
        "DistributedDataParallel is not needed when a module doesn't have any parameter that "
        "requires a gradient");
  }
  for (size_t i = 0; i < parameters.tensors.size(); ++i) {
    if (parameters.tensors[i].device() != parameters.tensors[0].device()) {
      fail<InvalidArgumentError>(
          kOperation, "all parameters must be on one device, but '" + parameters.names[i] +
                          "' is on " + parameters.tensors[i].device().str() + " and '" +
                          parameters.names[0] + "' on " + parameters.tensors[0].device().str());
    }
  }
  device_ = parameters.tensors[0].device();
  check_device_options(device_);
  if (options_.mixed_precision()) check_mixed_precision_options(options_, device_);
  NamedTensors buffers = module_buffers(*module_);
  verify_model_across_ranks(parameters, buffers, group);
  std::vector<at::Tensor> state = parameters.tensors;
  state.insert(state.end(), buffers.tensors.begin(), buffers.tensors.end());
  if (group.size() > 1) {
    TraceLabel label("DistributedDataParallel construction (rank 0's state)");
    broadcast_coalesced(state, group, group.ranks()[0]);
  }

  ReducerOptions reducer_options;
  reducer_options.bucket_cap_bytes = megabytes_to_bytes(options_.bucket_cap_mb(), "bucket_cap_mb");
  // The first bucket is the small one: never larger than the cap of the others.
  reducer_options.first_bucket_cap_bytes =
      std::min(megabytes_to_bytes(options_.first_bucket_cap_mb(), "first_bucket_cap_mb"),
               reducer_options.bucket_cap_bytes);
  reducer_options.find_unused_parameters = options_.find_unused_parameters();
  reducer_options.gradient_as_bucket_view = options_.gradient_as_bucket_view();
  reducer_options.static_graph = options_.static_graph();
  if (options_.mixed_precision()) {
    mixed_precision_ = std::make_unique<MixedPrecisionParams>(parameters.tensors, module_,
                                                              *options_.mixed_precision());
    input_dtype_ = options_.mixed_precision()->param_dtype();
    reducer_options.reduce_dtype = options_.mixed_precision()->effective_reduce_dtype();
    reducer_options.deliver_averages = [mixed = mixed_precision_.get()](
                                           const std::vector<at::Tensor>& averages) {
      mixed->finish_backward(averages);
    };
  }
  reducer_ = std::make_unique<Reducer>(std::move(parameters.tensors), std::move(parameters.names),
                                       group, reducer_options);
}

DDPCore::~DDPCore() = default;

void DDPCore::check_device_options(const c10::Device& module_device) {
  const auto& ids = options_.device_ids();
  if (ids.empty()) {
    if (options_.output_device() && *options_.output_device() != module_device) {
      fail<InvalidArgumentError>(kOperation,
                                 "output_device " + options_.output_device()->str() +
                                     " differs from the module's device " + module_device.str() +
                                     "; DDP does not move outputs (one device per process)");
    }
    return;
  }
  if (ids.size() != 1) {
    fail<InvalidArgumentError>(
        kOperation,
        "device_ids takes one device, this process's GPU (one process per GPU, as "
        "in PyTorch), got " +
            std::to_string(ids.size()));
  }
  c10::Device device = ids[0];
  // A CPU device is taken for a CPU module, so that one program (device_ids({set_device()})) runs
  // on machines with and without GPUs; PyTorch wants None there.
  if (device.is_cuda() && !device.has_index()) {
    device = c10::Device(c10::kCUDA, module_device.index());
  }
  if (module_device != device) {
    fail<InvalidArgumentError>(
        kOperation, "device_ids says " + device.str() + " but the module's parameters are on " +
                        module_device.str() +
                        ". Move the module to its device before wrapping it: "
                        "net->to(ddp::set_device()).");
  }
  if (options_.output_device() && *options_.output_device() != device) {
    fail<InvalidArgumentError>(kOperation,
                               "output_device " + options_.output_device()->str() +
                                   " must be device_ids[0] (" + device.str() +
                                   "): with one device per process, outputs stay on it");
  }
  input_device_ = device;
}

void DDPCore::broadcast_buffers(int src) {
  NamedTensors buffers = module_buffers(*module_);  // re-read: a module may replace its buffers
  if (buffers.tensors.empty()) return;
  TraceLabel label("DistributedDataParallel buffer broadcast (forward)");
  int64_t elements = 0;
  for (const auto& buffer : buffers.tensors) elements += buffer.numel();
  verify_ddp_step(kDdpForwardStep, buffers.tensors.front().scalar_type(), elements,
                  options_.process_group());
  broadcast_coalesced(buffers.tensors, options_.process_group(), src);
}

DDPCore::JoinStep DDPCore::exchange_join_step(bool training, bool broadcasting, bool reducing) {
  const ProcessGroup& group = options_.process_group();
  const int size = group.size();
  std::vector<int64_t> mine(2 + size, 0);
  mine[0] = broadcasting ? 1 : 0;
  mine[1] = reducing ? 1 : 0;
  if (training) mine[2 + group.rank()] = 1;
  TraceLabel label("ddp::Join round (DistributedDataParallel)");
  const auto sums = sum_counts(mine, group, device_);
  JoinStep step;
  step.broadcasting = static_cast<int>(sums[0]);
  step.reducing = static_cast<int>(sums[1]);
  for (int i = 0; i < size; ++i) {
    if (sums[2 + i] == 0) continue;
    ++step.training;
    step.authority = group.ranks()[i];
  }
  return step;
}

void DDPCore::before_forward(const JoinOptions* join) {
  forward_started_us_ = detail::timeline_on() ? detail::timeline_now_us() : 0;
  const ProcessGroup& group = options_.process_group();
  const bool reduces = require_sync_ && at::GradMode::is_enabled();
  if (reduces) {
    reducer_->stats().forward_started();
    reducer_->prepare_for_forward();
  }
  int buffers_from = group.ranks()[0];
  int divisor = group.size();
  if (join && group.size() > 1) {
    // The ranks that finished learn what to shadow; the buffers come from a rank still training.
    const JoinStep step = exchange_join_step(/*training=*/true, require_sync_, reduces);
    buffers_from = step.authority;
    if (!join->divide_by_initial_world_size()) divisor = step.training;
  }
  reducer_->set_divisor(divisor);
  if (require_sync_ && options_.broadcast_buffers() && group.size() > 1) {
    broadcast_buffers(buffers_from);
  }
  if (mixed_precision_) {
    mixed_precision_->cast_for_forward();
    reducer_->refresh_grad_accumulators();
  }
}

void DDPCore::after_forward(const std::vector<at::Tensor>& outputs) {
  if (require_sync_ && at::GradMode::is_enabled()) {
    reducer_->prepare_for_backward(outputs);
    reducer_->stats().forward_ended();
  } else {
    reducer_->disarm();
    if (mixed_precision_) mixed_precision_->restore();  // no backward will end this forward
  }
  if (forward_started_us_ > 0 && detail::timeline_on()) {
    detail::timeline_span("DistributedDataParallel forward", "ddp", forward_started_us_,
                          detail::timeline_now_us());
  }
}

void DDPCore::shadow_iteration() {
  const JoinStep step =
      exchange_join_step(/*training=*/false, /*broadcasting=*/false, /*reducing=*/false);
  if (step.broadcasting > 0 && options_.broadcast_buffers()) broadcast_buffers(step.authority);
  if (step.reducing > 0) reducer_->shadow_backward();
}

void DDPCore::sync_final_model(bool is_last_joiner) {
  const ProcessGroup& group = options_.process_group();
  if (group.size() == 1) return;
  std::vector<int64_t> last(group.size(), 0);
  if (is_last_joiner) last[group.rank()] = 1;
  const auto sums = sum_counts(last, group, device_);
  int src = -1;
  for (int i = 0; i < group.size(); ++i) {
    if (sums[i] > 0) src = group.ranks()[i];  // ties: the highest rank, as PyTorch breaks them
  }
  std::vector<at::Tensor> state = trainable_parameters(*module_).tensors;
  for (const auto& buffer : module_buffers(*module_).tensors) state.push_back(buffer);
  broadcast_coalesced(state, group, src);
}

void DDPCore::register_comm_hook(CommHook hook) {
  if (mixed_precision_) {
    fail<InvalidArgumentError>(
        "DistributedDataParallel.register_comm_hook",
        "comm hooks do not combine with mixed_precision: its buckets are already reduced in "
        "reduce_dtype. Set MixedPrecision().reduce_dtype(torch::kBFloat16) instead of "
        "bf16_compress(), or construct DDP without mixed_precision to use a hook.");
  }
  reducer_->register_comm_hook(std::move(hook));
}

void DDPCore::set_require_sync(bool sync) {
  if (!sync && mixed_precision_) {
    fail<InvalidArgumentError>(
        "DistributedDataParallel.no_sync",
        "no_sync() does not combine with mixed_precision: gradients would accumulate in "
        "param_dtype between synchronizations. Run a synchronized backward for each micro-batch "
        "instead (each adds its float32 average to .grad), or construct DDP without "
        "mixed_precision.");
  }
  require_sync_ = sync;
}

}  // namespace ddp::detail
