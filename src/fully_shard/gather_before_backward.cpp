#include "fully_shard/gather_before_backward.h"

#include <utility>

#include "fully_shard/sharded_unit.h"

namespace ddp::detail {
namespace {

constexpr const char* kUnitKey = "unit";

// saved_data holds IValues: a capsule carries the unit. Weakly: the graph must not keep a unit
// (and its buffers) alive after its module is gone.
struct UnitCapsule : torch::CustomClassHolder {
  explicit UnitCapsule(std::weak_ptr<ShardedUnit> unit) : unit(std::move(unit)) {}
  std::weak_ptr<ShardedUnit> unit;
};

}  // namespace

at::Tensor GatherBeforeBackward::forward(torch::autograd::AutogradContext* ctx,
                                         const at::Tensor& output,
                                         const std::shared_ptr<ShardedUnit>& unit) {
  ctx->saved_data[kUnitKey] = c10::IValue::make_capsule(c10::make_intrusive<UnitCapsule>(unit));
  return output;  // autograd returns it as a view with this node as its history
}

torch::autograd::variable_list GatherBeforeBackward::backward(
    torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grad_outputs) {
  const auto capsule = ctx->saved_data[kUnitKey].toCapsule();
  if (auto unit = static_cast<UnitCapsule*>(capsule.get())->unit.lock()) unit->before_backward();
  return {grad_outputs[0], at::Tensor()};
}

}  // namespace ddp::detail
