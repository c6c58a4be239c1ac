#include "fully_shard/sharded_unit.h"

#include <ATen/ATen.h>
#include <ATen/ScalarOps.h>  // wrapped_scalar_tensor
#include <c10/core/StorageImpl.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/variable.h>

#include <utility>

#include "common/error_context.h"
#include "ddp/collectives.h"
#include "reducer/call_after_accumulation.h"

namespace ddp::detail {
namespace {

// A whole buffer's storage between uses: no bytes, while the tensors that view it (the whole
// parameters, what autograd saved of them) keep their shapes, to be refilled in place.
void release_storage(const at::Tensor& tensor) {
  c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, storage->device()));
  storage->set_nbytes(0);
}

void allocate_storage(const at::Tensor& tensor, size_t nbytes) {
  c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(storage->allocator()->allocate(nbytes));
  storage->set_nbytes(nbytes);
}

std::vector<std::vector<int64_t>> shapes_of(const std::vector<at::Tensor>& parameters) {
  std::vector<std::vector<int64_t>> shapes;
  for (const auto& parameter : parameters) shapes.emplace_back(parameter.sizes().vec());
  return shapes;
}

// The unit whose reduce-scatter is in flight, if any (one training thread).
std::weak_ptr<ShardedUnit>& unit_reducing_now() {
  static std::weak_ptr<ShardedUnit> unit;
  return unit;
}

}  // namespace

ShardedUnit::ShardedUnit(std::vector<at::Tensor> parameters, const FullyShardOptions& options)
    : parameters_(std::move(parameters)), options_(options) {
  const ProcessGroup& group = options_.group();
  if (!group.is_member()) {
    fail<InvalidArgumentError>("fully_shard",
                               "this rank is not a member of the group given in "
                               "FullyShardOptions().group; build the units on its members only");
  }
  group_size_ = group.size();
  group_rank_ = group.rank();
  for (const auto& parameter : parameters_) {
    if (!parameter.is_floating_point() || parameter.is_sparse()) {
      fail<InvalidArgumentError>("fully_shard",
                                 "a parameter of " + std::string(parameter.toString()) +
                                     " cannot be sharded: fully_shard shards dense floating-point "
                                     "parameters (every parameter of a unit must be one)");
    }
    if (parameter.scalar_type() != parameters_.front().scalar_type() ||
        parameter.device() != parameters_.front().device()) {
      fail<InvalidArgumentError>(
          "fully_shard", "a unit's parameters must share one dtype and device (found " +
                             std::string(parameters_.front().toString()) + " on " +
                             parameters_.front().device().str() + " and " + parameter.toString() +
                             " on " + parameter.device().str() +
                             "); convert the module with ->to() before sharding it");
    }
  }
  layout_ = ShardLayout::of(shapes_of(parameters_), group_size_);
  const auto options_of = parameters_.empty() ? at::TensorOptions(at::kFloat)
                                              : parameters_.front().options().requires_grad(false);
  shards_ = at::zeros({layout_.shard_numel}, options_of);
  whole_ = at::empty({layout_.whole_numel}, options_of);
  whole_allocated_ = true;

  const int source = group.ranks().front();
  c10::NoGradGuard no_grad;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const ShardedParameter& p = layout_.parameters[i];
    at::Tensor& parameter = parameters_[i];
    at::Tensor data = parameter.detach();
    ddp::broadcast(data, source, group);
    whole_views_.push_back(whole_.narrow(0, p.whole_offset, p.numel()).view(p.shape));
    whole_views_.back().copy_(data);
    const int64_t rows = p.rows_of(group_rank_);
    at::Tensor shard = shards_.narrow(0, p.shard_offset, rows * p.row_numel);
    shard.copy_(data.reshape({p.rows, p.row_numel})
                    .narrow(0, p.first_row_of(group_rank_), rows)
                    .reshape({-1}));
    std::vector<int64_t> shard_shape = p.shape.empty() ? std::vector<int64_t>{1} : p.shape;
    shard_shape[0] = rows;
    shard_views_.push_back(shard.view(shard_shape));
    parameter.set_data(whole_views_.back());
  }
  gathered_ = true;
  install_gradient_hooks();  // while the parameters are whole
  reshard();
}

ShardedUnit::~ShardedUnit() {
  for (size_t i = 0; i < accumulators_.size(); ++i) {
    if (accumulators_[i]) accumulators_[i]->del_post_hook(hook_keys_[i]);
  }
}

void ShardedUnit::install_gradient_hooks() {
  accumulators_.resize(parameters_.size());
  hook_keys_.resize(parameters_.size());
  ready_.assign(parameters_.size(), false);
  earlier_grads_.resize(parameters_.size());
  unsynced_.resize(parameters_.size());
  for (size_t i = 0; i < parameters_.size(); ++i) {
    all_require_grad_ = all_require_grad_ && parameters_[i].requires_grad();
    if (!parameters_[i].requires_grad()) continue;
    auto accumulator = torch::autograd::impl::grad_accumulator(parameters_[i]);
    // The destructor removes the hook before the unit goes.
    hook_keys_[i] = accumulator->add_post_hook(
        std::make_unique<CallAfterAccumulation>([this, i] { on_gradient_ready(i); }));
    accumulators_[i] = std::move(accumulator);
  }
}

void ShardedUnit::allocate_whole() {
  if (whole_allocated_) return;
  allocate_storage(whole_, static_cast<size_t>(whole_.nbytes()));
  whole_allocated_ = true;
}

bool ShardedUnit::gather_if_released() {
  if (gathered_) return false;
  allocate_whole();
  c10::NoGradGuard no_grad;
  at::Tensor gathered = at::empty({group_size_ * layout_.shard_numel}, shards_.options());
  ddp::all_gather_into_tensor(gathered, shards_, group());
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const ShardedParameter& p = layout_.parameters[i];
    at::Tensor whole = whole_views_[i].view({p.rows, p.row_numel});
    for (int r = 0; r < group_size_; ++r) {
      const int64_t rows = p.rows_of(r);
      if (rows == 0) break;
      whole.narrow(0, r * p.chunk_rows, rows)
          .copy_(gathered.narrow(0, r * layout_.shard_numel + p.shard_offset, rows * p.row_numel)
                     .view({rows, p.row_numel}));
    }
  }
  gathered_ = true;
  return true;
}

at::Tensor ShardedUnit::gather_rows(size_t index, const at::Tensor& rows) const {
  const ShardedParameter& p = layout_.parameters[index];
  c10::NoGradGuard no_grad;
  at::Tensor padded = at::zeros({p.chunk_numel()}, rows.options());
  padded.narrow(0, 0, rows.numel()).copy_(rows.reshape({-1}));
  at::Tensor gathered = at::empty({group_size_ * p.chunk_numel()}, rows.options());
  ddp::all_gather_into_tensor(gathered, padded, group());
  // Only the last ranks hold fewer rows than a chunk (or none): the whole parameter is the first
  // rows of the chunks one after another.
  return gathered.narrow(0, 0, p.numel()).view(p.shape);
}

void ShardedUnit::reshard() {
  for (size_t i = 0; i < parameters_.size(); ++i) parameters_[i].set_data(shard_views_[i]);
  if (whole_allocated_) release_storage(whole_);
  whole_allocated_ = false;
  gathered_ = false;
}

void ShardedUnit::before_forward() {
  gather_if_released();
  for (size_t i = 0; i < parameters_.size(); ++i) parameters_[i].set_data(whole_views_[i]);
}

void ShardedUnit::after_forward() {
  // Without autograd no backward follows to free them: a forward under NoGradGuard reshards.
  if (options_.reshard_after_forward() || !c10::GradMode::is_enabled()) reshard();
}

void ShardedUnit::before_backward() {
  if (in_backward_) return;  // the unit ran more than once in this forward
  in_backward_ = true;
  launched_ = false;
  pending_ = 0;
  gather_if_released();
  for (size_t i = 0; i < parameters_.size(); ++i) {
    at::Tensor& parameter = parameters_[i];
    parameter.set_data(whole_views_[i]);
    // The shards' gradient is set aside: backward accumulates whole ones into .grad.
    earlier_grads_[i] = parameter.grad();
    parameter.mutable_grad() = at::Tensor();
    ready_[i] = !parameter.requires_grad();
    if (!ready_[i]) ++pending_;
  }
  std::weak_ptr<ShardedUnit> weak = weak_from_this();
  torch::autograd::Engine::get_default_engine().queue_callback([weak] {
    if (auto unit = weak.lock()) unit->finish_backward();
  });
}

void ShardedUnit::on_gradient_ready(size_t index) {
  if (!in_backward_ || ready_[index]) return;
  ready_[index] = true;
  if (--pending_ == 0) launch_reduce_scatter();
}

void ShardedUnit::launch_reduce_scatter() {
  launched_ = true;
  c10::NoGradGuard no_grad;
  if (!sync_gradients_) {
    for (size_t i = 0; i < parameters_.size(); ++i) {
      at::Tensor grad = parameters_[i].grad();
      if (grad.defined()) unsynced_[i] = unsynced_[i].defined() ? unsynced_[i] + grad : grad;
      parameters_[i].mutable_grad() = at::Tensor();
    }
    if (all_require_grad_) reshard();
    return;
  }
  // As DDP averages: each gradient times 1 / group size, then the sum (the same bits on shm).
  const at::Tensor average = at::native::wrapped_scalar_tensor(1.0 / group_size_);
  at::Tensor packed = at::zeros({group_size_ * layout_.shard_numel}, shards_.options());
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const ShardedParameter& p = layout_.parameters[i];
    at::Tensor grad = parameters_[i].grad();
    if (unsynced_[i].defined()) grad = grad.defined() ? grad + unsynced_[i] : unsynced_[i];
    unsynced_[i] = at::Tensor();
    parameters_[i].mutable_grad() = at::Tensor();
    if (!grad.defined()) continue;  // unused in this forward: zeros
    at::Tensor rows_of_grad = grad.reshape({p.rows, p.row_numel});
    for (int r = 0; r < group_size_; ++r) {
      const int64_t rows = p.rows_of(r);
      if (rows == 0) break;
      at::Tensor destination =
          packed.narrow(0, r * layout_.shard_numel + p.shard_offset, rows * p.row_numel)
              .view({rows, p.row_numel});
      at::mul_out(destination, rows_of_grad.narrow(0, r * p.chunk_rows, rows), average);
    }
  }
  // One reduce-scatter in flight at a time: each holds its packed gradients (and, where the
  // backend composes it from an all-reduce, a copy of them) until it ends, so a backward that
  // kept every unit's in flight would hold the whole model's gradients twice at its end.
  std::weak_ptr<ShardedUnit>& in_flight = unit_reducing_now();
  if (auto previous = in_flight.lock()) previous->complete_reduction();
  reduced_ = at::empty({layout_.shard_numel}, shards_.options());
  reduction_ = ddp::reduce_scatter_tensor_async(reduced_, packed, ReduceOp::SUM, group());
  reduction_pending_ = true;
  in_flight = weak_from_this();
  // The whole gradients are packed, and every node that computes a gradient of these parameters
  // has run: the whole parameters can go, unless a frozen one may still be read by a node that
  // computes only its input's gradient (then at the end of backward).
  if (all_require_grad_) reshard();
}

void ShardedUnit::finish_backward() {
  if (!in_backward_) return;
  in_backward_ = false;
  // A parameter unused in this forward never reports its gradient: zeros stand in for it.
  if (!launched_) launch_reduce_scatter();
  reshard();
  c10::NoGradGuard no_grad;
  if (!sync_gradients_) {
    for (size_t i = 0; i < parameters_.size(); ++i) {
      parameters_[i].mutable_grad() = earlier_grads_[i];
      earlier_grads_[i] = at::Tensor();
    }
    return;
  }
  complete_reduction();
}

void ShardedUnit::complete_reduction() {
  if (!reduction_pending_) return;
  reduction_pending_ = false;
  c10::NoGradGuard no_grad;
  reduction_.wait();
  for (size_t i = 0; i < parameters_.size(); ++i) {
    if (!parameters_[i].requires_grad()) continue;
    const ShardedParameter& p = layout_.parameters[i];
    // The shard's place in the reduced buffer, as a tensor of its own rather than a view: an
    // optimizer's zero_grad may detach_() it, which autograd refuses for views.
    at::Tensor shard = at::empty({0}, reduced_.options());
    shard.set_(reduced_.storage(), reduced_.storage_offset() + p.shard_offset,
               shard_views_[i].sizes(), shard_views_[i].strides());
    at::Tensor earlier = std::move(earlier_grads_[i]);
    parameters_[i].mutable_grad() = earlier.defined() ? earlier.add_(shard) : shard;
  }
  reduced_ = at::Tensor();
  reduction_ = Work();
}

}  // namespace ddp::detail
