// The public side of fully_shard: the unit module, rebuilding a Sequential into units, and the
// views of a sharded model (its shards, its whole state).
#include "ddp/fully_shard.h"

#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "common/error_context.h"
#include "ddp/collectives.h"
#include "fully_shard/gather_before_backward.h"
#include "fully_shard/sharded_module.h"
#include "fully_shard/sharded_unit.h"

namespace ddp {
namespace {

// The model and its descendants, as plain pointers: modules() would need the model itself held
// by a shared_ptr (a module on the stack is a fine model here).
std::vector<torch::nn::Module*> modules_of(const torch::nn::Module& model) {
  // modules() of a const module is not offered: it is only read here.
  auto& mutable_model = const_cast<torch::nn::Module&>(model);
  std::vector<torch::nn::Module*> modules{&mutable_model};
  for (const auto& module : mutable_model.modules(/*include_self=*/false)) {
    modules.push_back(module.get());
  }
  return modules;
}

std::vector<std::shared_ptr<detail::ShardedUnit>> units_of(const torch::nn::Module& model) {
  std::vector<std::shared_ptr<detail::ShardedUnit>> units;
  for (auto* module : modules_of(model)) {
    if (auto* unit = dynamic_cast<FullyShardedUnitImpl*>(module)) {
      units.push_back(unit->sharded_unit());
    }
  }
  return units;
}

struct Owner {
  detail::ShardedUnit* unit;
  size_t index;
};

std::map<const c10::TensorImpl*, Owner> owners_of(
    const std::vector<std::shared_ptr<detail::ShardedUnit>>& units) {
  std::map<const c10::TensorImpl*, Owner> owners;
  for (const auto& unit : units) {
    for (size_t i = 0; i < unit->parameters().size(); ++i) {
      owners[unit->parameters()[i].unsafeGetTensorImpl()] = {unit.get(), i};
    }
  }
  return owners;
}

}  // namespace

namespace detail {

bool holds_fully_sharded_units(const torch::nn::Module& model) { return !units_of(model).empty(); }

at::Tensor ShardRows::of(const at::Tensor& whole) const {
  // A 0-dim parameter is one row; its shard is a vector of 1 or 0 elements.
  std::vector<int64_t> shard_shape = whole_shape.empty() ? std::vector<int64_t>{1} : whole_shape;
  const int64_t whole_rows = shard_shape[0];
  shard_shape[0] = rows;
  return whole.reshape({whole_rows, -1}).narrow(0, first_row, rows).reshape(shard_shape);
}

std::map<const c10::TensorImpl*, ShardRows> shard_rows_of(const torch::nn::Module& model) {
  std::map<const c10::TensorImpl*, ShardRows> rows;
  for (const auto& unit : units_of(model)) {
    for (size_t i = 0; i < unit->parameters().size(); ++i) {
      const ShardedParameter& p = unit->layout_of(i);
      rows[unit->parameters()[i].unsafeGetTensorImpl()] = {
          p.shape, p.first_row_of(unit->group_rank()), p.rows_of(unit->group_rank())};
    }
  }
  return rows;
}

at::Tensor gather_rows(const torch::nn::Module& model, const at::Tensor& parameter,
                       const at::Tensor& rows) {
  const auto owners = owners_of(units_of(model));
  const auto owner = owners.find(parameter.unsafeGetTensorImpl());
  TORCH_INTERNAL_ASSERT(owner != owners.end(), "gather_rows: not a parameter of a unit");
  return owner->second.unit->gather_rows(owner->second.index, rows);
}

std::vector<std::pair<std::string, at::Tensor>> whole_module_state(const torch::nn::Module& model) {
  std::vector<std::pair<std::string, at::Tensor>> state;
  for (const auto& item : full_state_dict(model)) state.emplace_back(item.key(), item.value());
  return state;
}

}  // namespace detail

FullyShardedUnitImpl::FullyShardedUnitImpl(torch::nn::AnyModule module,
                                           const FullyShardOptions& options)
    : module_(std::move(module)) {
  if (module_.is_empty()) {
    detail::fail<InvalidArgumentError>("fully_shard",
                                       "the module is empty; pass a constructed module");
  }
  const auto inner = module_.ptr();
  for (const auto& nested : inner->modules()) {
    if (dynamic_cast<FullyShardedUnitImpl*>(nested.get()) != nullptr) {
      detail::fail<InvalidArgumentError>(
          "fully_shard", "the module " + inner->name() +
                             " already holds a FullyShardedUnit; units do not nest: shard each "
                             "module once, the innermost units of your choice");
    }
  }
  // The unsharded model's names: the module's own parameters, buffers and children, here.
  for (const auto& item : inner->named_parameters(/*recurse=*/false)) {
    register_parameter(item.key(), item.value(), item.value().requires_grad());
  }
  for (const auto& item : inner->named_buffers(/*recurse=*/false)) {
    register_buffer(item.key(), item.value());
  }
  for (const auto& item : inner->named_children()) register_module(item.key(), item.value());
  unit_ = std::make_shared<detail::ShardedUnit>(inner->parameters(), options);
}

FullyShardedUnitImpl::~FullyShardedUnitImpl() = default;

torch::Tensor FullyShardedUnitImpl::forward(torch::Tensor input) { return call(std::move(input)); }

void FullyShardedUnitImpl::begin_forward() { unit_->before_forward(); }

torch::Tensor FullyShardedUnitImpl::end_forward(torch::Tensor output) {
  unit_->after_forward();
  if (c10::GradMode::is_enabled() && output.requires_grad()) {
    output = detail::GatherBeforeBackward::apply(output, unit_);
  }
  return output;
}

void FullyShardedUnitImpl::abandon_forward() { unit_->after_forward(); }

void FullyShardedUnitImpl::set_requires_gradient_sync(bool sync) {
  unit_->set_requires_gradient_sync(sync);
}

void fully_shard(torch::nn::Sequential& model, const FullyShardOptions& options) {
  if (model.is_empty()) {
    detail::fail<InvalidArgumentError>("fully_shard",
                                       "the Sequential is empty; pass a constructed one");
  }
  if (!units_of(*model).empty()) {
    detail::fail<InvalidArgumentError>("fully_shard",
                                       "the model already holds FullyShardedUnits; shard it once");
  }
  const auto names = model->named_children();
  torch::nn::Sequential rebuilt;
  size_t index = 0;
  for (const auto& element : *model) {
    const std::string& name = names[index++].key();
    if (element.ptr()->parameters().empty()) {
      rebuilt->push_back(name, element);
    } else {
      rebuilt->push_back(name, torch::nn::AnyModule(FullyShardedUnit(element, options)));
    }
  }
  model = rebuilt;
}

std::vector<at::Tensor> sharded_parameters(const torch::nn::Module& model) {
  const auto units = units_of(model);
  if (units.empty()) {
    detail::fail<InvalidArgumentError>(
        "sharded_parameters",
        "the model holds no FullyShardedUnit; shard it first (ddp::fully_shard)");
  }
  const auto owners = owners_of(units);
  std::vector<at::Tensor> shards;
  for (const auto& item : model.named_parameters()) {
    if (!owners.count(item.value().unsafeGetTensorImpl())) {
      detail::fail<InvalidArgumentError>(
          "sharded_parameters",
          "the parameter " + item.key() +
              " is outside every FullyShardedUnit: nothing would average its gradient across "
              "ranks. Put the module that holds it in a unit");
    }
    shards.push_back(item.value());
  }
  return shards;
}

void set_requires_gradient_sync(torch::nn::Module& model, bool sync) {
  for (auto* module : modules_of(model)) {
    if (auto* unit = dynamic_cast<FullyShardedUnitImpl*>(module)) {
      unit->set_requires_gradient_sync(sync);
    }
  }
}

double clip_grad_norm_(torch::nn::Module& model, double max_norm, double norm_type) {
  const auto shards = sharded_parameters(model);
  const ProcessGroup& group = units_of(model).front()->group();
  const bool infinity = std::isinf(norm_type);
  c10::NoGradGuard no_grad;
  // Each rank's part of the norm (a sum of |g|^p, or a maximum), then every rank's together: the
  // shards partition every parameter's rows, so each element counts once.
  at::Tensor part = at::zeros({1}, at::kDouble);
  for (const auto& shard : shards) {
    const at::Tensor& grad = shard.grad();
    if (!grad.defined() || grad.numel() == 0) continue;
    const at::Tensor norm = grad.detach().norm(norm_type).to(at::kDouble).reshape({1});
    part = infinity ? at::maximum(part, norm) : part + norm.pow(norm_type);
  }
  ddp::all_reduce(part, infinity ? ReduceOp::MAX : ReduceOp::SUM, group);
  const double total =
      infinity ? part.item<double>() : std::pow(part.item<double>(), 1.0 / norm_type);
  const double coefficient = max_norm / (total + 1e-6);
  if (coefficient < 1.0) {
    for (const auto& shard : shards) {
      if (shard.grad().defined()) shard.grad().mul_(coefficient);
    }
  }
  return total;
}

torch::OrderedDict<std::string, at::Tensor> full_state_dict(const torch::nn::Module& model) {
  const auto units = units_of(model);
  const auto owners = owners_of(units);
  std::vector<bool> gathered_here;
  for (const auto& unit : units) gathered_here.push_back(unit->gather_if_released());
  torch::OrderedDict<std::string, at::Tensor> state;
  c10::NoGradGuard no_grad;
  for (const auto& item : model.named_parameters()) {
    auto owner = owners.find(item.value().unsafeGetTensorImpl());
    state.insert(item.key(), owner == owners.end()
                                 ? item.value().detach().clone()
                                 : owner->second.unit->whole_view(owner->second.index).clone());
  }
  for (const auto& item : model.named_buffers()) state.insert(item.key(), item.value().clone());
  for (size_t i = 0; i < units.size(); ++i) {
    if (gathered_here[i]) units[i]->reshard();
  }
  return state;
}

}  // namespace ddp
