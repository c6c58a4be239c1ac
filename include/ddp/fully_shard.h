// ddp::fully_shard: parameters, gradients and optimizer state split across ranks (PyTorch's FSDP),
// each unit's parameters gathered just for its forward and its backward.
//
// libtorch's modules have no forward hooks and a non-virtual forward, so a unit cannot be
// intercepted from outside as FSDP2 intercepts a Python module. The unit boundary is declared
// instead (FSDP1's call model with FSDP2's sharding, DESIGN.md "Sharded training"): fully_shard
// rebuilds a Sequential so that each element with parameters becomes a FullyShardedUnit, and a
// FullyShardedUnit can also be built around any module of a model's own forward.
//
//   auto net = torch::nn::Sequential(block1, block2, head);   // the same on every rank
//   ddp::fully_shard(net);                                     // collective
//   torch::optim::Adam optimizer(net->parameters());           // the shards: state is sharded too
//   ...  optimizer.zero_grad(); loss_fn(net->forward(x), y).backward(); optimizer.step();
//   auto full = ddp::full_state_dict(*net);                    // collective: whole tensors
//
// Each parameter is split along its first dimension into group-size chunks of ceil(rows / size)
// rows (FSDP2's layout): rank r keeps rows [r * chunk, (r + 1) * chunk), fewer or none at the end.
// Outside forward and backward, a parameter's data IS this rank's shard: net->parameters() (and
// sharded_parameters) hold the shards, their .grad the shards of the averaged gradient, and an
// optimizer built on them keeps state for the shards only. Before a unit's forward its parameters
// are all-gathered and become whole; after it they become shards again and the whole copy is
// freed (reshard_after_forward, the default); its backward gathers them again, and as each unit's
// gradients are ready they are averaged and reduce-scattered to the shards, and the whole
// gradients freed. Reading a whole parameter outside forward and backward: full_state_dict.
//
// The parameters are broadcast from the group's first rank when the units are built, as DDP does.
// Buffers stay whole on every rank. Thread-safety: one training thread; building units,
// forward, backward and full_state_dict are collective over the group, in the same order on every
// member.
#pragma once

#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/ordered_dict.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ddp/process_group.h"

namespace ddp {

namespace detail {
class ShardedUnit;
}  // namespace detail

struct FullyShardOptions {
  /// Free each unit's whole parameters after its forward and gather them again for its backward:
  /// the least memory, one more all-gather per unit and step. false keeps them whole from forward
  /// to the end of backward. Default true, as PyTorch's.
  TORCH_ARG(bool, reshard_after_forward) = true;
  /// The ranks that share the parameters. Default: the world.
  TORCH_ARG(ProcessGroup, group) = ProcessGroup();
};

/// One unit of sharded training: `module`, whose parameters this rank keeps a shard of, gathered
/// whole for its forward and backward. Its parameters and submodules are registered under the
/// names `module` gave them, so that parameter names are those of the unsharded model.
/// Collective to build (over options.group).
class FullyShardedUnitImpl : public torch::nn::Module {
 public:
  explicit FullyShardedUnitImpl(torch::nn::AnyModule module,
                                const FullyShardOptions& options = FullyShardOptions());
  ~FullyShardedUnitImpl() override;

  /// Gathers the parameters, runs the module, and frees them again as the options say.
  torch::Tensor forward(torch::Tensor input);

  /// forward with the wrapped module's own arguments (a block's forward(h, mask)), for a model's
  /// own forward to call: module.forward(args...) between the gather and the free. Its output is
  /// a tensor.
  template <typename... Args>
  torch::Tensor call(Args&&... args) {
    begin_forward();
    torch::Tensor output;
    try {
      output = module_.forward(std::forward<Args>(args)...);
    } catch (...) {
      abandon_forward();
      throw;
    }
    return end_forward(std::move(output));
  }

  /// The wrapped module.
  std::shared_ptr<torch::nn::Module> module() const { return module_.ptr(); }

  /// Whether backward averages and reduce-scatters the gradients (true, the default). With false,
  /// the whole gradients accumulate on this rank until a backward with true, which reduces their
  /// sum: gradient accumulation without communication (PyTorch's name).
  void set_requires_gradient_sync(bool sync);

  // Internal: the unit's sharding state.
  const std::shared_ptr<detail::ShardedUnit>& sharded_unit() const { return unit_; }

 private:
  void begin_forward();
  torch::Tensor end_forward(torch::Tensor output);
  void abandon_forward();

  torch::nn::AnyModule module_;
  std::shared_ptr<detail::ShardedUnit> unit_;
};
TORCH_MODULE(FullyShardedUnit);

/// Rebuilds `model` so that each element with parameters is a FullyShardedUnit (elements without
/// parameters stay as they are). Collective over options.group. Throws InvalidArgumentError for a
/// model that is already sharded.
void fully_shard(torch::nn::Sequential& model,
                 const FullyShardOptions& options = FullyShardOptions());

/// The parameters of a sharded model (its shards: what an optimizer of sharded training takes).
/// Throws InvalidArgumentError where `model` holds no FullyShardedUnit, or holds parameters
/// outside every unit (those would be trained without any gradient averaging).
std::vector<at::Tensor> sharded_parameters(const torch::nn::Module& model);

/// set_requires_gradient_sync on every unit of `model`.
void set_requires_gradient_sync(torch::nn::Module& model, bool sync);

/// torch::nn::utils::clip_grad_norm_ for a sharded model: the norm of the whole model's gradient
/// (every rank's shards together; collective over the units' group), and every shard's gradient
/// scaled by max_norm / (norm + 1e-6) where that is below 1. Returns the norm before clipping.
double clip_grad_norm_(torch::nn::Module& model, double max_norm, double norm_type = 2.0);

/// Every parameter whole (gathered, copied out) and every buffer, under the names of the unsharded
/// model, on every rank: what model.named_parameters() and named_buffers() held before sharding.
/// Collective over the units' group.
torch::OrderedDict<std::string, at::Tensor> full_state_dict(const torch::nn::Module& model);

}  // namespace ddp
