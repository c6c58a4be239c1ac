// Reducer: averages gradients over a group in buckets, overlapped with backward.
//
// A post hook on each parameter's gradient accumulator marks the parameter ready once its
// gradient is accumulated; its gradient is copied (multiplied by 1/group size, unless a comm hook
// is set) into its slot of the bucket's flat buffer. When every parameter of a bucket is ready,
// the bucket's reduction starts asynchronously through the comm hook, strictly in bucket order,
// so that every rank issues the same collectives in the same order whatever order its gradients
// arrive in. The last launch queues finalize_backward on the autograd engine, which runs once
// backward is over: it waits for every bucket and writes the averaged gradients to .grad.
// Where a backend of the group reduces lists of tensors where they are (shm on one host) and no
// comm hook is set, the multiplication happens as the backend sums, and each gradient takes one
// of the routes of gradient_routes.h: read where autograd left it, without the copies into and
// out of the bucket. A bucket's buffer is allocated only while some gradient goes through it
// (after a backward in which none did, it is freed). A kInGrad .grad is written by the backend's
// thread while backward goes on (as gradient_as_bucket_view's bucket is); it holds its average
// once backward returns, like every other.
// On CUDA, buckets live on the gradients' device and the backend's work (NCCL) is ordered with
// the stream that reads the averages when the reducer waits for it, without a host sync.
// The buckets are built once from the order in which gradients actually become ready (rank 0's
// order, broadcast), so that the first bucket fills first. That order is recorded during the
// first synchronized backward, which therefore reduces only once backward has ended, already in
// the rebuilt buckets: no reduction ever uses the buckets of construction (a reverse-registration
// guess). A bucket's layout decides the order in which gloo's ring sums each element at 3 ranks
// and more; were the first step reduced in other buckets than the later ones, a run resumed from
// a checkpoint (a fresh DDP) would round differently from the uninterrupted run at that step.
// The price is one backward without overlap. With find_unused_parameters (and no static_graph)
// the set of ready parameters may change, so the buckets of construction stay, as in PyTorch.
//
// Thread-safety: the hooks run on the autograd thread; prepare_* run on the training thread,
// never concurrently with a backward of the same model. A mutex guards the per-iteration state.
#pragma once

#include <torch/csrc/autograd/function.h>

#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "compat/libtorch_compat.h"
#include "ddp/comm_hooks.h"
#include "ddp/process_group.h"
#include "reducer/gradient_routes.h"
#include "reducer/step_stats.h"

namespace ddp::detail {

struct ReducerOptions {
  size_t bucket_cap_bytes = 25u << 20;
  size_t first_bucket_cap_bytes = 1u << 20;
  bool find_unused_parameters = false;
  bool gradient_as_bucket_view = false;
  bool static_graph = false;
  // Mixed precision (src/ddp/mixed_precision_params.h): the buckets are of this dtype (never the
  // in-place list route), and finalize hands each average, by parameter index (undefined where
  // no rank used it), to deliver_averages instead of writing .grad.
  std::optional<c10::ScalarType> reduce_dtype;
  std::function<void(const std::vector<at::Tensor>& averages)> deliver_averages;
};

class Reducer {
 public:
  Reducer(std::vector<at::Tensor> parameters, std::vector<std::string> names, ProcessGroup group,
          ReducerOptions options);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  /// Before a forward that will be followed by a synchronized backward: fails if the previous
  /// backward left reductions unfinished (parameters that got no gradient).
  void prepare_for_forward();
  /// After such a forward: arms the hooks and, with find_unused_parameters, finds the parameters
  /// that the outputs do not reach.
  void prepare_for_backward(const std::vector<at::Tensor>& outputs);
  /// After a forward without synchronization (no_sync, or grad disabled): hooks stay idle.
  void disarm();

  /// REQUIRES: no backward has run yet; called at most once.
  void register_comm_hook(CommHook hook);
  /// After a parameter's data changed dtype (set_data, mixed precision), which drops its gradient
  /// accumulator: moves the hooks to the accumulator autograd uses now.
  void refresh_grad_accumulators();

  /// The number the gradients are averaged over from the next backward on (the group's size;
  /// under Join, possibly the ranks still training). Not used by comm hooks.
  void set_divisor(int divisor);
  /// On a rank that finished under Join: the collectives of one backward of the others, with
  /// zeros for this rank's gradients (.grad is untouched).
  void shadow_backward();

  /// For tests and logging: the parameter indices of each bucket, in reduction order.
  std::vector<std::vector<size_t>> bucket_indices() const;
  /// How a parameter's gradient reached the reduction in this iteration.
  using Route = detail::Route;
  /// For tests: each parameter's route in the last backward, by parameter index.
  std::vector<Route> routes() const;
  /// For tests: the bytes of the buckets' buffers now allocated.
  size_t bucket_bytes() const;

  /// For DDP's statistics (include/ddp/ddp_stats.h): the recorder that the reducer marks in
  /// backward, each bucket's bytes in its dtype (reduction order), the rebuilds so far.
  StepStatsRecorder& stats() { return stats_; }
  std::vector<int64_t> bucket_sizes_bytes() const;
  int64_t rebuilds() const { return has_rebuilt_ ? 1 : 0; }
  bool has_comm_hook() const { return static_cast<bool>(comm_hook_); }
  const std::vector<at::Tensor>& parameters() const { return parameters_; }

 private:
  struct Bucket {
    std::vector<size_t> parameters;  // indices into parameters_
    at::Tensor buffer;               // flat gradients; undefined until a gradient goes through it
    std::vector<at::Tensor> views;   // one per parameter, shaped like it, into buffer (or none)
    std::vector<Route> routes;       // this iteration's, by position
    std::vector<at::Tensor> grads;   // the .grad seen by the hook, for kReadGrad and kInGrad
    size_t pending = 0;
    Work work;
    int64_t launched_us = 0;  // when its reduction started, for the timeline
  };
  struct Slot {
    size_t bucket = 0;
    size_t position = 0;
  };

  void install_hooks();
  void initialize_buckets(const std::vector<std::vector<size_t>>& assignment);
  // The dtype and device of the bucket's buffer.
  at::TensorOptions bucket_options(const Bucket& bucket) const;
  // Starts the reduction of bucket `index`'s gradients, flattened into `flat` (its buffer, or
  // zeros on a rank that finished under Join): through the comm hook, or summed.
  Work reduce_flat_async(size_t index, const at::Tensor& flat);
  // Gives the bucket its flat buffer and views (zeros), when a gradient first needs them.
  void allocate(Bucket& bucket);
  // After backward: frees the buffers that no gradient of this iteration went through.
  void release_unused_buffers();
  // Rank 0's recorded ready order, broadcast (collective).
  std::vector<size_t> agree_on_ready_order();
  // Builds the buckets from rank 0's recorded order and moves the staged gradients into them.
  void rebuild_buckets();
  void reset_iteration();
  std::vector<size_t> find_unused(const std::vector<at::Tensor>& outputs) const;
  void autograd_hook(size_t index);
  // got_gradient: false for a parameter marked ready because the outputs do not reach it.
  void mark_ready(size_t index, bool got_gradient);
  bool reduces_in_place(const Bucket& bucket) const;
  // Copies (or, in place, leaves) the gradient where the bucket's reduction will find it.
  void stage_gradient(size_t index, bool got_gradient);
  // kReadGrad: makes averaged_[index] ready to take the average of grad.
  void prepare_average_of(size_t index, const at::Tensor& grad);
  // kReadGrad, after backward: averaged_[index] becomes .grad, or is copied into it.
  void hand_average_to_grad(size_t index, const at::Tensor& grad_at_hook);
  // Before the step's first collective: every rank is in this step (uneven inputs are caught).
  void verify_step();
  // Starts the reductions of the complete buckets, in bucket order; true once all have started.
  bool launch_ready_buckets();
  // The recording backward's end: rebuilds the buckets, reduces them all, finalizes.
  void reduce_in_recorded_order();
  void finalize_backward();
  std::string parameter_list(const std::vector<size_t>& indices) const;

  std::vector<at::Tensor> parameters_;
  std::vector<std::string> names_;
  ProcessGroup group_;
  ReducerOptions options_;
  int world_size_;
  int divisor_;                // world_size, or under Join the ranks still training
  double average_;             // 1/divisor_
  at::Tensor average_factor_;  // the same, a wrapped scalar as PyTorch's reducer uses
  // By parameter: a backend of the group reduces lists of tensors like it in place (unverified.h).
  std::vector<bool> reduced_in_place_;
  std::vector<compat::AutogradNodePtr> grad_accumulators_;
  std::vector<uintptr_t> hook_keys_;

  std::vector<Bucket> buckets_;
  std::vector<Slot> slots_;
  CommHook comm_hook_;
  bool any_backward_ = false;

  // Per-iteration state, guarded by mutex_.
  std::mutex mutex_;
  bool armed_ = false;        // this backward must reduce
  bool hooks_fired_ = false;  // a hook ran in this backward
  bool finalized_ = false;    // finalize_backward ran for this backward
  std::vector<bool> ready_;
  size_t unready_ = 0;      // parameters not yet marked ready in this backward
  bool recording_ = false;  // this backward records the ready order; it reduces once it ends
  size_t next_bucket_ = 0;
  bool step_verified_ = false;  // verify_step ran in this backward
  std::vector<size_t> unused_;        // locally unused this iteration (find_unused)
  bool static_unused_known_ = false;  // static_graph: unused_ was found once, in iteration 1
  at::Tensor local_used_;             // int32 per parameter: got a gradient (find_unused)
  Work used_work_;
  at::Tensor global_used_;
  std::vector<size_t> ready_order_;       // the recording backward's order, for the rebuild
  std::vector<GradBefore> grads_before_;  // each .grad at prepare_for_backward (lists only)
  // Per parameter, for kReadGrad: the tensor its average is written into, which then replaces
  // the .grad that backward made. It stays .grad until zero_grad drops it, and is written again
  // only once nothing but the reducer holds it.
  std::vector<at::Tensor> averaged_;
  bool has_rebuilt_ = false;
  int64_t backward_started_us_ = 0;  // the first hook of this backward, for the timeline
  StepStatsRecorder stats_;
};

}  // namespace ddp::detail
