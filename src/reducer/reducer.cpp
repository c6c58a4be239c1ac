#include "reducer/reducer.h"

#include <ATen/ATen.h>
#include <ATen/ScalarOps.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <unordered_set>

#include "collectives/collective_call.h"
#include "collectives/unverified.h"
#include "common/error_context.h"
#include "reducer/bucket_assignment.h"
#include "reducer/call_after_accumulation.h"
#include "reducer/low_precision_sum.h"
#include "trace/flight_recorder.h"
#include "trace/timeline.h"

namespace ddp::detail {
namespace {

std::vector<int64_t> strides_of_contiguous(at::IntArrayRef sizes) {
  std::vector<int64_t> strides(sizes.size());
  int64_t stride = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= std::max<int64_t>(sizes[i], 1);
  }
  return strides;
}

// dtype: the buckets' (mixed precision's reduce_dtype), else each parameter's own.
std::vector<TensorSpec> specs_of(const std::vector<at::Tensor>& parameters,
                                 std::optional<c10::ScalarType> dtype) {
  std::vector<TensorSpec> specs;
  for (const auto& p : parameters) {
    const auto type = dtype.value_or(p.scalar_type());
    specs.push_back({type, p.device(), static_cast<size_t>(p.numel()) * c10::elementSize(type)});
  }
  return specs;
}

}  // namespace

Reducer::Reducer(std::vector<at::Tensor> parameters, std::vector<std::string> names,
                 ProcessGroup group, ReducerOptions options)
    : parameters_(std::move(parameters)),
      names_(std::move(names)),
      group_(std::move(group)),
      options_(options),
      world_size_(group_.size()),
      // As PyTorch's DDP averages: each gradient times 1/world_size, then the sum. One value for
      // the bucket copies and the backend's lists, so that both routes give the same bits.
      divisor_(world_size_),
      average_(1.0 / world_size_),
      average_factor_(at::native::wrapped_scalar_tensor(average_)) {
  for (const auto& parameter : parameters_) {
    const auto dtype = parameter.scalar_type();
    // PREMUL_SUM with a double factor is defined for floats and doubles.
    // Not with mixed precision: its buckets are of reduce_dtype, its gradients of param_dtype.
    reduced_in_place_.push_back(!options_.reduce_dtype &&
                                (dtype == at::kFloat || dtype == at::kDouble) &&
                                reduces_lists_in_place(group_, parameter));
  }
  // Gradients become ready roughly in reverse registration order: start from that order, with a
  // small first bucket, until the first iteration tells the real order.
  std::vector<size_t> order;
  for (size_t i = parameters_.size(); i-- > 0;) order.push_back(i);
  initialize_buckets(assign_buckets(specs_of(parameters_, options_.reduce_dtype), order,
                                    {options_.first_bucket_cap_bytes, options_.bucket_cap_bytes}));
  local_used_ = at::zeros({static_cast<int64_t>(parameters_.size())}, at::kInt);
  grads_before_.resize(parameters_.size());
  averaged_.resize(parameters_.size());
  install_hooks();
  reset_iteration();
}

Reducer::~Reducer() {
  for (size_t i = 0; i < grad_accumulators_.size(); ++i) {
    grad_accumulators_[i]->del_post_hook(hook_keys_[i]);
  }
}

void Reducer::install_hooks() {
  for (size_t i = 0; i < parameters_.size(); ++i) {
    auto accumulator = torch::autograd::impl::grad_accumulator(parameters_[i]);
    hook_keys_.push_back(accumulator->add_post_hook(
        std::make_unique<CallAfterAccumulation>([this, i] { autograd_hook(i); })));
    grad_accumulators_.push_back(std::move(accumulator));
  }
}

void Reducer::refresh_grad_accumulators() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t i = 0; i < parameters_.size(); ++i) {
    auto accumulator = torch::autograd::impl::grad_accumulator(parameters_[i]);
    if (accumulator == grad_accumulators_[i]) continue;
    grad_accumulators_[i]->del_post_hook(hook_keys_[i]);
    hook_keys_[i] = accumulator->add_post_hook(
        std::make_unique<CallAfterAccumulation>([this, i] { autograd_hook(i); }));
    grad_accumulators_[i] = std::move(accumulator);
  }
}

void Reducer::initialize_buckets(const std::vector<std::vector<size_t>>& assignment) {
  c10::NoGradGuard no_grad;
  buckets_.clear();
  slots_.assign(parameters_.size(), Slot{});
  for (const auto& indices : assignment) {
    Bucket bucket;
    bucket.parameters = indices;
    bucket.pending = indices.size();
    bucket.routes.assign(indices.size(), Route::kBucket);
    bucket.grads.assign(indices.size(), at::Tensor());
    for (size_t position = 0; position < indices.size(); ++position) {
      slots_[indices[position]] = {buckets_.size(), position};
    }
    if (options_.gradient_as_bucket_view) {
      allocate(bucket);
      for (size_t position = 0; position < indices.size(); ++position) {
        at::Tensor& grad = parameters_[indices[position]].mutable_grad();
        if (!grad.defined()) continue;
        bucket.views[position].copy_(grad);
        grad = bucket.views[position];
      }
    }
    buckets_.push_back(std::move(bucket));
  }
}

at::TensorOptions Reducer::bucket_options(const Bucket& bucket) const {
  auto options = parameters_[bucket.parameters[0]].options();
  return options_.reduce_dtype ? options.dtype(*options_.reduce_dtype) : options;
}

void Reducer::allocate(Bucket& bucket) {
  c10::NoGradGuard no_grad;
  int64_t total = 0;
  for (size_t index : bucket.parameters) total += parameters_[index].numel();
  const auto options = bucket_options(bucket);
  bucket.buffer = at::zeros({total}, options);
  bucket.views.clear();
  int64_t offset = 0;
  for (size_t index : bucket.parameters) {
    const at::Tensor& parameter = parameters_[index];
    // A plain alias of the buffer's storage rather than an autograd view: libtorch's
    // Optimizer::zero_grad calls detach_() on each .grad, which views do not allow.
    at::Tensor view = at::empty({0}, options);
    view.set_(bucket.buffer.storage(), offset, parameter.sizes(),
              strides_of_contiguous(parameter.sizes()));
    bucket.views.push_back(view);
    offset += parameter.numel();
  }
}

void Reducer::release_unused_buffers() {
  for (auto& bucket : buckets_) {
    if (!bucket.buffer.defined() || !reduces_in_place(bucket)) continue;
    const bool unused = std::none_of(bucket.routes.begin(), bucket.routes.end(),
                                     [](Route route) { return route == Route::kBucket; });
    if (unused) {
      bucket.buffer = at::Tensor();
      bucket.views.clear();
    }
  }
}

std::vector<int64_t> Reducer::bucket_sizes_bytes() const {
  std::vector<int64_t> sizes;
  for (const auto& bucket : buckets_) {
    int64_t elements = 0;
    for (size_t index : bucket.parameters) elements += parameters_[index].numel();
    sizes.push_back(elements * static_cast<int64_t>(bucket_options(bucket).dtype().itemsize()));
  }
  return sizes;
}

size_t Reducer::bucket_bytes() const {
  size_t bytes = 0;
  for (const auto& bucket : buckets_) {
    if (bucket.buffer.defined()) bytes += bucket.buffer.nbytes();
  }
  return bytes;
}

std::vector<size_t> Reducer::agree_on_ready_order() {
  // Every rank must use the same buckets: rank 0's observed order decides. A rank 0 that never
  // ran a backward (it finished under Join before its first batch) gives the order of
  // construction.
  std::vector<size_t> mine = ready_order_;
  if (mine.size() != parameters_.size()) {
    mine.clear();
    for (size_t i = parameters_.size(); i-- > 0;) mine.push_back(i);
  }
  auto order = at::empty({static_cast<int64_t>(parameters_.size())}, at::kLong);
  for (size_t i = 0; i < mine.size(); ++i) {
    order[static_cast<int64_t>(i)] = static_cast<int64_t>(mine[i]);
  }
  TraceLabel label("DistributedDataParallel bucket order (first backward)");
  broadcast_async(order, group_.ranks()[0], group_, /*verify=*/false, Launch::kWaitNow).wait();
  std::vector<size_t> rank0_order;
  for (int64_t i = 0; i < order.numel(); ++i) {
    rank0_order.push_back(static_cast<size_t>(order[i].item<int64_t>()));
  }
  return rank0_order;
}

void Reducer::rebuild_buckets() {
  c10::NoGradGuard no_grad;
  const std::vector<size_t> rank0_order = agree_on_ready_order();
  std::vector<Bucket> staged = std::move(buckets_);
  const std::vector<Slot> staged_slots = slots_;
  initialize_buckets(assign_buckets(specs_of(parameters_, options_.reduce_dtype), rank0_order,
                                    {options_.first_bucket_cap_bytes, options_.bucket_cap_bytes}));
  // Backward staged every gradient in the buckets of construction: each moves to its new slot,
  // with its route (gradient_as_bucket_view's .grad already points into the new buffer).
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const Bucket& from = staged[staged_slots[i].bucket];
    const size_t from_position = staged_slots[i].position;
    Bucket& to = buckets_[slots_[i].bucket];
    const size_t to_position = slots_[i].position;
    to.routes[to_position] = from.routes[from_position];
    to.grads[to_position] = from.grads[from_position];
    if (to.routes[to_position] != Route::kBucket) continue;
    if (!to.buffer.defined()) allocate(to);
    to.views[to_position].copy_(from.views[from_position]);
  }
  for (auto& bucket : buckets_) bucket.pending = 0;
  next_bucket_ = 0;
  has_rebuilt_ = true;
}

void Reducer::reset_iteration() {
  armed_ = false;
  hooks_fired_ = false;
  finalized_ = false;
  ready_.assign(parameters_.size(), false);
  unready_ = parameters_.size();
  // PyTorch's rule for rebuilding: not while the set of used parameters may change.
  recording_ = !has_rebuilt_ && (options_.static_graph || !options_.find_unused_parameters);
  ready_order_.clear();
  next_bucket_ = 0;
  step_verified_ = false;
  for (auto& bucket : buckets_) {
    bucket.pending = bucket.parameters.size();
    bucket.routes.assign(bucket.parameters.size(), Route::kBucket);
    bucket.grads.assign(bucket.parameters.size(), at::Tensor());
    bucket.work = Work();
  }
}

std::string Reducer::parameter_list(const std::vector<size_t>& indices) const {
  std::string text;
  for (size_t i = 0; i < indices.size(); ++i) {
    if (i == 8) {
      text += ", ... (" + std::to_string(indices.size()) + " in all)";
      break;
    }
    if (i) text += ", ";
    text += "'" + names_[indices[i]] + "' (index " + std::to_string(indices[i]) + ")";
  }
  return text;
}

void Reducer::prepare_for_forward() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (armed_ && hooks_fired_ && !finalized_) {
    std::vector<size_t> missing;
    for (size_t i = 0; i < parameters_.size(); ++i) {
      if (!ready_[i]) missing.push_back(i);
    }
    fail("DistributedDataParallel.forward",
         "expected to have finished reduction in the prior iteration before starting a new one. "
         "These parameters received no gradient in the previous backward: " +
             parameter_list(missing) +
             ". Either the forward did not use them, or not all forward outputs were used in the "
             "loss. Construct DDP with DDPOptions().find_unused_parameters(true), or make every "
             "output take part in the loss.");
  }
  reset_iteration();
}

void Reducer::disarm() {
  std::lock_guard<std::mutex> lock(mutex_);
  armed_ = false;
}

std::vector<size_t> Reducer::find_unused(const std::vector<at::Tensor>& outputs) const {
  std::unordered_set<const torch::autograd::Node*> seen;
  std::vector<const torch::autograd::Node*> stack;
  for (const auto& output : outputs) {
    const auto& grad_fn = output.grad_fn();
    if (grad_fn && seen.insert(grad_fn.get()).second) stack.push_back(grad_fn.get());
    if (!grad_fn && output.requires_grad()) {  // an output that is itself a parameter
      auto accumulator = torch::autograd::impl::try_get_grad_accumulator(output);
      if (accumulator) seen.insert(accumulator.get());
    }
  }
  while (!stack.empty()) {
    const torch::autograd::Node* node = stack.back();
    stack.pop_back();
    for (const auto& edge : node->next_edges()) {
      const auto* next = edge.function.get();
      if (next && seen.insert(next).second) stack.push_back(next);
    }
  }
  std::vector<size_t> unused;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    if (!seen.count(grad_accumulators_[i].get())) unused.push_back(i);
  }
  return unused;
}

void Reducer::prepare_for_backward(const std::vector<at::Tensor>& outputs) {
  std::lock_guard<std::mutex> lock(mutex_);
  armed_ = true;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    if (reduced_in_place_[i]) grads_before_[i] = GradBefore::of(parameters_[i].grad());
  }
  if (!options_.find_unused_parameters) return;
  if (!options_.static_graph || !static_unused_known_) {
    unused_ = find_unused(outputs);
    static_unused_known_ = options_.static_graph;
  }
}

void Reducer::register_comm_hook(CommHook hook) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (comm_hook_) {
    fail<InvalidArgumentError>(
        "DistributedDataParallel.register_comm_hook",
        "a comm hook is already registered; register_comm_hook can only be called once");
  }
  if (any_backward_) {
    fail<InvalidArgumentError>("DistributedDataParallel.register_comm_hook",
                               "register_comm_hook must be called before the first backward");
  }
  if (!hook)
    fail<InvalidArgumentError>("DistributedDataParallel.register_comm_hook", "the hook is empty");
  comm_hook_ = std::move(hook);
}

std::vector<std::vector<size_t>> Reducer::bucket_indices() const {
  std::vector<std::vector<size_t>> indices;
  for (const auto& bucket : buckets_) indices.push_back(bucket.parameters);
  return indices;
}

std::vector<Reducer::Route> Reducer::routes() const {
  std::vector<Route> routes(parameters_.size());
  for (size_t i = 0; i < parameters_.size(); ++i) {
    routes[i] = buckets_[slots_[i].bucket].routes[slots_[i].position];
  }
  return routes;
}

void Reducer::autograd_hook(size_t index) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (options_.find_unused_parameters && parameters_[index].grad().defined()) {
    local_used_.data_ptr<int32_t>()[index] = 1;  // accumulates over no_sync iterations too
  }
  if (!armed_) return;  // no_sync, or a backward DDP did not prepare: plain accumulation
  any_backward_ = true;
  if (!hooks_fired_) {
    hooks_fired_ = true;
    if (timeline_on()) {
      name_timeline_thread("autograd");
      backward_started_us_ = timeline_now_us();
    }
    for (size_t unused : unused_) mark_ready(unused, /*got_gradient=*/false);
  }
  mark_ready(index, /*got_gradient=*/true);
}

void Reducer::mark_ready(size_t index, bool got_gradient) {
  if (ready_[index]) {
    fail("DistributedDataParallel backward",
         "expected to mark a variable ready only once, but parameter " + parameter_list({index}) +
             " has been marked as ready twice in this iteration. Either it is used in several "
             "forward passes before one backward, the same layer is checkpointed or re-entered "
             "twice, or (with find_unused_parameters) a parameter thought unused received a "
             "gradient. Use DDPOptions().static_graph(true) if the graph is the same every "
             "iteration, or find_unused_parameters(false).");
  }
  ready_[index] = true;
  stage_gradient(index, got_gradient);
  Bucket& bucket = buckets_[slots_[index].bucket];
  --bucket.pending;
  if (--unready_ == 0) stats_.gradients_ready();
  auto& engine = torch::autograd::Engine::get_default_engine();
  if (recording_) {
    ready_order_.push_back(index);
    if (unready_ == 0) engine.queue_callback([this] { reduce_in_recorded_order(); });
    return;
  }
  if (bucket.pending != 0) return;
  if (timeline_on()) {
    timeline_instant("ready", "ddp", timeline_now_us(), static_cast<int>(slots_[index].bucket));
  }
  if (launch_ready_buckets()) engine.queue_callback([this] { finalize_backward(); });
}

void Reducer::reduce_in_recorded_order() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    verify_step();
    rebuild_buckets();
    launch_ready_buckets();  // all of them: every gradient is staged
  }
  finalize_backward();
}

bool Reducer::reduces_in_place(const Bucket& bucket) const {
  // A bucket's parameters share one dtype and device.
  return !comm_hook_ && reduced_in_place_[bucket.parameters[0]];
}

void Reducer::stage_gradient(size_t index, bool got_gradient) {
  c10::NoGradGuard no_grad;
  at::Tensor& grad = parameters_[index].mutable_grad();
  Bucket& bucket = buckets_[slots_[index].bucket];
  const size_t position = slots_[index].position;
  // The backend multiplies while it reduces lists; otherwise multiplying while copying saves a
  // pass over the bucket. A comm hook averages itself.
  const bool in_place = reduces_in_place(bucket);
  const bool multiply = !comm_hook_ && !in_place;
  // Not for a parameter this rank did not use: its .grad must stay untouched if no rank used it.
  const Route route =
      in_place && got_gradient && grad.defined() && !options_.gradient_as_bucket_view
          ? route_of(parameters_[index], grad, grads_before_[index])
          : Route::kBucket;
  if (route == Route::kBucket && !bucket.buffer.defined()) allocate(bucket);
  at::Tensor* view = route == Route::kBucket ? &bucket.views[position] : nullptr;
  if (!grad.defined()) {
    view->zero_();
  } else if (options_.gradient_as_bucket_view && grad.is_alias_of(*view)) {
    if (multiply) view->mul_(average_factor_);
  } else if (route != Route::kBucket) {
    // Read where autograd left it: no copy in (and, for kInGrad, none back).
    bucket.routes[position] = route;
    bucket.grads[position] = grad;
    if (route == Route::kReadGrad) prepare_average_of(index, grad);
  } else {
    if (multiply) {
      at::mul_out(*view, grad, average_factor_);
    } else {
      view->copy_(grad);
    }
    if (options_.gradient_as_bucket_view) grad = *view;
  }
}

void Reducer::prepare_average_of(size_t index, const at::Tensor& grad) {
  at::Tensor& average = averaged_[index];
  if (!can_reuse_average(average, grad)) average = at::empty(grad.sizes(), grad.options());
}

void Reducer::hand_average_to_grad(size_t index, const at::Tensor& grad_at_hook) {
  at::Tensor& grad = parameters_[index].mutable_grad();
  // Otherwise (it shares memory with another parameter's .grad, a hook replaced or kept it) the
  // average is copied into it, as PyTorch's DDP does.
  if (can_replace_grad(grad, grad_at_hook)) {
    grad = averaged_[index];
  } else {
    grad.copy_(averaged_[index]);
  }
}

void Reducer::set_divisor(int divisor) {
  if (divisor == divisor_) return;
  divisor_ = divisor;
  average_ = 1.0 / divisor;
  average_factor_ = at::native::wrapped_scalar_tensor(average_);
}

void Reducer::shadow_backward() {
  std::lock_guard<std::mutex> lock(mutex_);
  c10::NoGradGuard no_grad;
  reset_iteration();
  verify_step();
  if (recording_) {
    // The others reduce their first backward in the buckets of their recorded order.
    initialize_buckets(
        assign_buckets(specs_of(parameters_, options_.reduce_dtype), agree_on_ready_order(),
                       {options_.first_bucket_cap_bytes, options_.bucket_cap_bytes}));
    has_rebuilt_ = true;
  }
  any_backward_ = true;
  // Zeros where the others have their gradients, through the same collective each bucket takes.
  TraceLabel label("ddp::Join shadow of DistributedDataParallel's gradient buckets");
  std::vector<Work> works;
  for (size_t index = 0; index < buckets_.size(); ++index) {
    const Bucket& bucket = buckets_[index];
    int64_t elements = 0;
    for (size_t parameter : bucket.parameters) elements += parameters_[parameter].numel();
    at::Tensor zeros = at::zeros({elements}, bucket_options(bucket));
    works.push_back(reduces_in_place(bucket)
                        ? premul_sum_async({zeros}, {zeros}, average_, group_)
                        : reduce_flat_async(index, zeros));
  }
  if (options_.find_unused_parameters) {
    at::Tensor unused = at::zeros({static_cast<int64_t>(parameters_.size())},
                                  at::TensorOptions().dtype(at::kInt).device(
                                      parameters_.front().device()));
    works.push_back(all_reduce_async(unused, ReduceOp::SUM, group_, /*verify=*/false));
  }
  for (auto& work : works) work.wait();
  reset_iteration();
}

void Reducer::verify_step() {
  if (step_verified_) return;
  step_verified_ = true;
  int64_t elements = 0;
  for (const auto& parameter : parameters_) elements += parameter.numel();
  // The buckets' dtype: under mixed precision the parameters' dtype changes within a step.
  const auto dtype = options_.reduce_dtype.value_or(parameters_.front().scalar_type());
  verify_ddp_step(kDdpBackwardStep, dtype, elements, group_);
}

Work Reducer::reduce_flat_async(size_t index, const at::Tensor& flat) {
  if (comm_hook_) {
    std::vector<at::Tensor> members;
    for (size_t parameter : buckets_[index].parameters) members.push_back(parameters_[parameter]);
    GradBucket grad_bucket(index, buckets_.size(), flat, std::move(members));
    return comm_hook_(group_, grad_bucket);
  }
  at::Tensor buffer = flat;
  if (options_.reduce_dtype) return sum_over_ranks_async(buffer, group_);  // bfloat16 on gloo too
  return all_reduce_async(buffer, ReduceOp::SUM, group_, /*verify=*/false);
}

bool Reducer::launch_ready_buckets() {
  TraceLabel label("DistributedDataParallel gradient bucket");
  if (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) verify_step();
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) {
    Bucket& bucket = buckets_[next_bucket_];
    if (timeline_on()) bucket.launched_us = timeline_now_us();
    if (reduces_in_place(bucket)) {
      std::vector<at::Tensor> inputs, outputs;
      for (size_t position = 0; position < bucket.parameters.size(); ++position) {
        const Route route = bucket.routes[position];
        if (route == Route::kBucket) {
          inputs.push_back(bucket.views[position]);
          outputs.push_back(bucket.views[position]);
        } else {
          inputs.push_back(bucket.grads[position]);
          outputs.push_back(route == Route::kInGrad ? bucket.grads[position]
                                                    : averaged_[bucket.parameters[position]]);
        }
      }
      int64_t bytes = 0;
      for (const auto& input : inputs) bytes += static_cast<int64_t>(input.nbytes());
      stats_.bucket_launched(bytes);
      bucket.work = premul_sum_async(std::move(inputs), std::move(outputs), average_, group_);
    } else {
      stats_.bucket_launched(static_cast<int64_t>(bucket.buffer.nbytes()));
      bucket.work = reduce_flat_async(next_bucket_, bucket.buffer);
    }
    ++next_bucket_;
  }
  if (next_bucket_ < buckets_.size()) return false;
  if (options_.find_unused_parameters) {
    // Reduced on the parameters' device, as PyTorch does: on GPUs the map goes to NCCL with the
    // buckets instead of crossing to the CPU backend every step.
    global_used_ = local_used_.to(at::TensorOptions().device(parameters_.front().device()),
                                  /*non_blocking=*/false, /*copy=*/true);
    used_work_ = all_reduce_async(global_used_, ReduceOp::SUM, group_, /*verify=*/false);
  }
  return true;
}

void Reducer::finalize_backward() {
  std::lock_guard<std::mutex> lock(mutex_);
  c10::NoGradGuard no_grad;
  const bool timeline = timeline_on();
  const int64_t wait_started_us = timeline ? timeline_now_us() : 0;
  for (size_t index = 0; index < buckets_.size(); ++index) {
    buckets_[index].work.wait();
    if (timeline) {
      timeline_bucket_span(static_cast<int>(index), "all-reduce", buckets_[index].launched_us,
                           timeline_now_us(),
                           "\"bytes\":" + std::to_string(buckets_[index].buffer.defined()
                                                             ? buckets_[index].buffer.nbytes()
                                                             : 0));
    }
  }
  if (timeline) {
    timeline_span("wait for the gradient all-reduces", "ddp", wait_started_us, timeline_now_us());
  }
  const int32_t* used = nullptr;
  at::Tensor used_on_host;
  if (options_.find_unused_parameters) {
    used_work_.wait();
    used_on_host = global_used_.cpu();
    used = used_on_host.data_ptr<int32_t>();
  }
  std::vector<at::Tensor> averages;  // mixed precision: handed to deliver_averages
  if (options_.deliver_averages) averages.resize(parameters_.size());
  for (size_t i = 0; i < parameters_.size(); ++i) {
    if (used && used[i] == 0) continue;  // unused on every rank: .grad stays as it was
    const Bucket& bucket = buckets_[slots_[i].bucket];
    if (options_.deliver_averages) {  // always Route::kBucket (no list route)
      averages[i] = bucket.views[slots_[i].position];
      continue;
    }
    if (bucket.routes[slots_[i].position] == Route::kInGrad) {
      // Written by the backend, not through an op: tell autograd the tensor changed.
      torch::autograd::impl::bump_version(parameters_[i].grad());
      continue;
    }
    if (bucket.routes[slots_[i].position] == Route::kReadGrad) {
      hand_average_to_grad(i, bucket.grads[slots_[i].position]);
      continue;
    }
    const at::Tensor& view = bucket.views[slots_[i].position];
    at::Tensor& grad = parameters_[i].mutable_grad();
    if (options_.gradient_as_bucket_view) {
      if (!grad.defined() || !grad.is_alias_of(view)) grad = view;
    } else if (grad.defined()) {
      grad.copy_(view);
    } else {
      grad = view.clone();
    }
  }
  if (options_.find_unused_parameters) local_used_.zero_();
  for (auto& bucket : buckets_) bucket.grads.assign(bucket.grads.size(), at::Tensor());
  release_unused_buffers();
  grads_before_.assign(parameters_.size(), GradBefore());
  if (options_.deliver_averages) options_.deliver_averages(averages);
  finalized_ = true;
  armed_ = false;
  stats_.backward_finished(static_cast<int64_t>(unused_.size()));
  if (timeline && backward_started_us_ > 0) {
    timeline_span("DistributedDataParallel backward", "ddp", backward_started_us_,
                  timeline_now_us());
  }
}

}  // namespace ddp::detail
