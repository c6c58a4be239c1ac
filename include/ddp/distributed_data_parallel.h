// DistributedDataParallel: the C++ counterpart of torch.nn.parallel.DistributedDataParallel.
//
// Wraps a module so that backward averages the gradients over the ranks of a group, in buckets
// that are all-reduced while backward is still computing the remaining gradients. Construction is
// collective: every rank must wrap the same model (checked: an error names the first parameter that
// differs), and rank 0's parameters and buffers are broadcast to the others. See DESIGN.md and the
// reference notes for the semantics, which follow PyTorch 1.13.
//
//   auto net = std::make_shared<Net>();
//   ddp::DistributedDataParallel model(net, ddp::DDPOptions().bucket_cap_mb(25));
//   auto loss = torch::nll_loss(model(x), y);
//   loss.backward();                    // gradients are averaged over the ranks here
//   optimizer.step();
//
// With uneven inputs (a different number of batches per rank), wrap the loop in a ddp::Join
// (join.h); without it, a rank that leaves the loop early makes every rank raise an error that
// says so.
//
// Thread-safety: one training loop per DistributedDataParallel; forward and backward of one
// instance must not run concurrently. The reducer's hooks run on the autograd thread.
#pragma once

#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <map>
#include <memory>
#include <optional>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ddp/comm_hooks.h"
#include "ddp/ddp_stats.h"
#include "ddp/join.h"
#include "ddp/mixed_precision.h"
#include "ddp/process_group.h"

namespace ddp {

/// Options of DistributedDataParallel, with PyTorch's defaults.
struct DDPOptions {
  /// Upper size of a gradient bucket, in MiB (cap in bytes = int(mb * 1024 * 1024)). Default: 25.
  TORCH_ARG(double, bucket_cap_mb) = 25.0;
  /// Size of the first bucket, reduced first: small, so that communication starts early in
  /// backward (torch.distributed's _DEFAULT_FIRST_BUCKET_BYTES); never more than bucket_cap_mb.
  /// Default: 1.
  TORCH_ARG(double, first_bucket_cap_mb) = 1.0;
  /// Broadcast rank 0's buffers (batch-norm statistics...) before each forward. Default: true.
  TORCH_ARG(bool, broadcast_buffers) = true;
  /// Walk the autograd graph after each forward and treat parameters it does not reach as ready,
  /// so that a model whose forward skips some parameters does not fail. Default: false.
  TORCH_ARG(bool, find_unused_parameters) = false;
  /// Make each .grad a view into its bucket: no copy between the two, less memory. Default: false.
  TORCH_ARG(bool, gradient_as_bucket_view) = false;
  /// The set of used parameters never changes: find it once, in the first iteration. Default:
  /// false.
  TORCH_ARG(bool, static_graph) = false;
  /// The group to average over. Default: the world.
  TORCH_ARG(ProcessGroup, process_group) = ProcessGroup();
  /// The device of this process's module, as PyTorch's device_ids=[d] for one GPU per process:
  /// every parameter must be on it, and forward moves tensor arguments to it first. At most one
  /// device. A CPU device is accepted for a CPU module, so that device_ids({ddp::set_device()})
  /// runs on machines with and without GPUs. Default: {} (the parameters decide).
  ///   ddp::DistributedDataParallel model(net, ddp::DDPOptions().device_ids({device}));
  TORCH_ARG(std::vector<c10::Device>, device_ids) = {};
  /// Where forward's outputs are: with one device per process, that device (PyTorch's meaning;
  /// nothing is moved). Must equal device_ids[0] when given. Default: nullopt.
  TORCH_ARG(std::optional<c10::Device>, output_device) = std::nullopt;
  /// Forward and backward in low precision on copies of float32 master parameters, gradients
  /// averaged in reduce_dtype and handed to .grad in float32 (include/ddp/mixed_precision.h).
  /// Combines with find_unused_parameters and static_graph; refused, by name, with
  /// gradient_as_bucket_view, register_comm_hook and no_sync. Default: nullopt (off).
  ///   DDPOptions().mixed_precision(ddp::MixedPrecision().param_dtype(torch::kBFloat16))
  TORCH_ARG(std::optional<MixedPrecision>, mixed_precision) = std::nullopt;
};

namespace detail {

class Reducer;
class MixedPrecisionParams;

// The part of DDP that does not depend on the module's type (in src/ddp/).
class DDPCore {
 public:
  DDPCore(std::shared_ptr<torch::nn::Module> module, DDPOptions options);
  ~DDPCore();
  /// `join`: the options of the enabled Join the model is in, nullptr outside one.
  void before_forward(const JoinOptions* join);
  void after_forward(const std::vector<at::Tensor>& outputs);
  /// Refuses sync=false (no_sync) under mixed precision.
  void set_require_sync(bool sync);
  bool require_sync() const { return require_sync_; }
  void register_comm_hook(CommHook hook);
  const DDPOptions& options() const { return options_; }
  /// device_ids[0], where forward's tensor arguments go; nullopt without device_ids.
  const std::optional<c10::Device>& input_device() const { return input_device_; }
  /// The parameters' device.
  c10::Device device() const { return device_; }

  /// Joinable: the hook of a rank that finished (src/ddp/ddp_join_hook.cpp).
  std::unique_ptr<JoinHook> join_hook(const JoinOptions& options);
  /// On a rank that finished: one iteration of the ranks still training, with zeros.
  void shadow_iteration();
  /// When every rank finished: every rank takes the model of the highest rank that finished last.
  void sync_final_model(bool is_last_joiner);
  /// Mixed precision's param_dtype, what forward's floating-point tensor arguments are cast to.
  const std::optional<c10::ScalarType>& input_dtype() const { return input_dtype_; }

  /// In src/ddp/ddp_stats.cpp.
  DDPStats stats() const;
  void reset_stats();

 private:
  // Under Join, what the ranks do in this iteration (one exchange).
  struct JoinStep {
    int broadcasting = 0;  // ranks that broadcast buffers in this forward
    int reducing = 0;      // ranks whose backward reduces gradients
    int training = 0;      // ranks that have not finished
    int authority = -1;    // global rank whose buffers everyone takes: the highest training one
  };
  JoinStep exchange_join_step(bool training, bool broadcasting, bool reducing);
  void broadcast_buffers(int src);
  // Validates device_ids and output_device against the module's device.
  void check_device_options(const c10::Device& module_device);

  std::shared_ptr<torch::nn::Module> module_;
  DDPOptions options_;
  std::unique_ptr<MixedPrecisionParams> mixed_precision_;  // before reducer_: outlives it
  std::unique_ptr<Reducer> reducer_;
  bool require_sync_ = true;
  int64_t forward_started_us_ = 0;  // for the timeline: 0 when it is off
  std::optional<c10::Device> input_device_;
  c10::Device device_ = c10::kCPU;
  std::optional<c10::ScalarType> input_dtype_;
};

// Forward's arguments on the module's device (device_ids): tensors, and vectors of them, are
// moved; anything else passes through untouched.
inline at::Tensor on_device(const at::Tensor& value, const std::optional<c10::Device>& device) {
  return device && value.defined() && value.device() != *device ? value.to(*device) : value;
}
template <typename T>
std::vector<T> on_device(const std::vector<T>& values, const std::optional<c10::Device>& device) {
  std::vector<T> moved;
  moved.reserve(values.size());
  for (const auto& value : values) moved.push_back(on_device(value, device));
  return moved;
}
template <typename T>
struct HoldsTensors : std::is_convertible<const T&, at::Tensor> {};
template <typename T>
struct HoldsTensors<std::vector<T>> : HoldsTensors<T> {};
template <typename T, typename = std::enable_if_t<!HoldsTensors<std::decay_t<T>>::value>>
T&& on_device(T&& value, const std::optional<c10::Device>&) {
  return std::forward<T>(value);
}

// Forward's arguments under mixed precision: floating-point tensors, and vectors of them, cast to
// param_dtype; anything else passes through untouched.
inline at::Tensor cast_floating(const at::Tensor& value,
                                const std::optional<c10::ScalarType>& dtype) {
  return dtype && value.defined() && value.is_floating_point() && value.scalar_type() != *dtype
             ? value.to(*dtype)
             : value;
}
template <typename T>
std::vector<T> cast_floating(const std::vector<T>& values,
                             const std::optional<c10::ScalarType>& dtype) {
  std::vector<T> cast;
  cast.reserve(values.size());
  for (const auto& value : values) cast.push_back(cast_floating(value, dtype));
  return cast;
}
template <typename T, typename = std::enable_if_t<!HoldsTensors<std::decay_t<T>>::value>>
T&& cast_floating(T&& value, const std::optional<c10::ScalarType>&) {
  return std::forward<T>(value);
}

// Finds every tensor in a forward's result: tensors, and vectors, tuples, pairs and maps of them.
// Every overload is declared before any is defined, so that nested containers find each other.
inline void collect_tensors(const at::Tensor& value, std::vector<at::Tensor>& out);
template <typename T>
void collect_tensors(const std::vector<T>& values, std::vector<at::Tensor>& out);
template <typename A, typename B>
void collect_tensors(const std::pair<A, B>& value, std::vector<at::Tensor>& out);
template <typename... Ts>
void collect_tensors(const std::tuple<Ts...>& value, std::vector<at::Tensor>& out);
template <typename K, typename V>
void collect_tensors(const std::map<K, V>& values, std::vector<at::Tensor>& out);
template <typename K, typename V>
void collect_tensors(const std::unordered_map<K, V>& values, std::vector<at::Tensor>& out);
template <typename T>
void collect_tensors(const T&, std::vector<at::Tensor>&) {}  // anything else holds no tensor

inline void collect_tensors(const at::Tensor& value, std::vector<at::Tensor>& out) {
  if (value.defined()) out.push_back(value);
}
template <typename T>
void collect_tensors(const std::vector<T>& values, std::vector<at::Tensor>& out) {
  for (const auto& value : values) collect_tensors(value, out);
}
template <typename A, typename B>
void collect_tensors(const std::pair<A, B>& value, std::vector<at::Tensor>& out) {
  collect_tensors(value.first, out);
  collect_tensors(value.second, out);
}
template <typename... Ts>
void collect_tensors(const std::tuple<Ts...>& value, std::vector<at::Tensor>& out) {
  std::apply([&](const auto&... items) { (collect_tensors(items, out), ...); }, value);
}
template <typename K, typename V>
void collect_tensors(const std::map<K, V>& values, std::vector<at::Tensor>& out) {
  for (const auto& item : values) collect_tensors(item.second, out);
}
template <typename K, typename V>
void collect_tensors(const std::unordered_map<K, V>& values, std::vector<at::Tensor>& out) {
  for (const auto& item : values) collect_tensors(item.second, out);
}

template <typename T>
std::shared_ptr<torch::nn::Module> as_module_pointer(const torch::nn::ModuleHolder<T>& holder) {
  return holder.ptr();
}
template <typename T>
std::shared_ptr<torch::nn::Module> as_module_pointer(const std::shared_ptr<T>& pointer) {
  return pointer;
}

}  // namespace detail

/// RAII guard of DistributedDataParallel::no_sync(): while it lives, backward accumulates into
/// .grad locally, without communication.
class NoSyncGuard {
 public:
  explicit NoSyncGuard(detail::DDPCore& core) : core_(&core), previous_(core.require_sync()) {
    core.set_require_sync(false);
  }
  NoSyncGuard(NoSyncGuard&& other) noexcept : core_(other.core_), previous_(other.previous_) {
    other.core_ = nullptr;
  }
  NoSyncGuard(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(NoSyncGuard&&) = delete;
  ~NoSyncGuard() {
    if (core_) core_->set_require_sync(previous_);
  }

 private:
  detail::DDPCore* core_;
  bool previous_;
};

/// `ModulePointer` is a module holder (torch::nn::Sequential, a TORCH_MODULE type) or a
/// std::shared_ptr to a module; class template argument deduction picks it from the argument.
template <typename ModulePointer>
class DistributedDataParallel : public Joinable {
 public:
  explicit DistributedDataParallel(ModulePointer module, DDPOptions options = DDPOptions())
      : module_(std::move(module)),
        core_(std::make_unique<detail::DDPCore>(detail::as_module_pointer(module_),
                                                std::move(options))) {}

  /// Calls the wrapped module's forward with the same arguments, around DDP's bookkeeping.
  template <typename... Args>
  auto forward(Args&&... args) {
    Join::notify_join_context(*this);
    core_->before_forward(join_options());
    const auto& device = core_->input_device();
    const auto& dtype = core_->input_dtype();
    auto output = module_->forward(
        detail::cast_floating(detail::on_device(std::forward<Args>(args), device), dtype)...);
    std::vector<at::Tensor> tensors;
    detail::collect_tensors(output, tensors);
    core_->after_forward(tensors);
    return output;
  }
  template <typename... Args>
  auto operator()(Args&&... args) {
    return forward(std::forward<Args>(args)...);
  }

  /// The wrapped module, as given.
  ModulePointer& module() { return module_; }
  const ModulePointer& module() const { return module_; }
  /// Shorthand for module()->... , e.g. model->parameters().
  auto operator->() { return module_.operator->(); }

  /// While the returned guard lives, backward accumulates gradients locally; the first backward
  /// after it all-reduces the accumulated gradients.
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(*core_); }

  /// REQUIRES: called once, before the first backward.
  void register_comm_hook(CommHook hook) { core_->register_comm_hook(std::move(hook)); }

  const DDPOptions& options() const { return core_->options(); }

  /// DDP's own measurements: per step and averaged, forward time, backward compute, the
  /// communication backward did not hide, bytes reduced; the buckets and their sizes, rebuilds
  /// (include/ddp/ddp_stats.h says what each number measures). REQUIRES: not called while a
  /// backward of this model runs (between steps, from any thread).
  DDPStats stats() const { return core_->stats(); }
  /// Starts the averages anew: steps, average and total_bytes_reduced count from here.
  void reset_stats() { core_->reset_stats(); }

  /// Joinable (join.h): on a rank that finished, shadows DDP's gradient all-reduce (zeros), its
  /// buffer broadcast and its unused-parameter map; at the end every rank takes the model of a
  /// rank that finished last. Refused for a model with SyncBatchNorm unless
  /// throw_on_early_termination is set: its collectives cannot be shadowed.
  std::unique_ptr<JoinHook> join_hook(const JoinOptions& options) override {
    return core_->join_hook(options);
  }
  c10::Device join_device() const override { return core_->device(); }
  ProcessGroup join_process_group() const override { return core_->options().process_group(); }

 private:
  ModulePointer module_;
  std::unique_ptr<detail::DDPCore> core_;
};

}  // namespace ddp
