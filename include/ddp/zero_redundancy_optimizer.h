// ddp::ZeroRedundancyOptimizer: the optimizer state split across ranks (ZeRO stage 1), the C++
// counterpart of torch.distributed.optim.ZeroRedundancyOptimizer.
//
// Each rank owns a partition of the parameters, balanced by size as PyTorch balances it (in each
// parameter group, largest first, each to the rank with the fewest elements so far), and keeps the
// wrapped optimizer's state (Adam's two moments, SGD's momentum) for its partition only. step()
// updates the owned partition with the wrapped optimizer, then hands every rank the parameters the
// others updated. Gradients must be the same on every rank beforehand (DDP's averaged ones), as
// for any data-parallel optimizer.
//
//   ddp::DistributedDataParallel model(net);
//   ddp::ZeroRedundancyOptimizer optimizer(
//       model->parameters(),
//       ddp::zero_optimizer<torch::optim::Adam>(torch::optim::AdamOptions(1e-3)));
//   ...  loss.backward(); optimizer.step(); optimizer.zero_grad();
//   optimizer.consolidate_state_dict(0);           // collective
//   if (ddp::get_rank() == 0) auto state = optimizer.state_dict();
//
// It is a torch::optim::Optimizer whose param_groups() hold every parameter with the wrapped
// optimizer's options: learning-rate schedulers change those, and step() hands them to the wrapped
// optimizer. It is a ddp::Joinable: under ddp::Join a rank that finished goes on stepping with
// those still training, as PyTorch's join hook does: its partition with the gradients its
// parameters last received (nothing clears them there), then the exchange. List the DDP module
// first, then the optimizer.
//
// Thread-safety: one training thread; step(), consolidate_state_dict() and the constructor are
// collective over the optimizer's group and must be called on every member in the same order.
#pragma once

#include <torch/arg.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <vector>

#include "ddp/join.h"
#include "ddp/process_group.h"

namespace ddp {

/// Makes the wrapped optimizer of one rank's partition (PyTorch: optimizer_class and **defaults).
/// zero_optimizer<T>(options) builds one for libtorch's optimizers.
struct ZeroOptimizerFactory {
  /// The wrapped optimizer's type, for messages ("torch::optim::Adam").
  std::string name;
  /// The options of parameter groups made without their own (the wrapped optimizer's defaults).
  std::function<std::unique_ptr<torch::optim::OptimizerOptions>()> defaults;
  /// The wrapped optimizer over `groups`: this rank's partition, with every group present (some
  /// may be empty).
  std::function<std::unique_ptr<torch::optim::Optimizer>(
      std::vector<torch::optim::OptimizerParamGroup> groups)>
      make;
  /// True when the optimizer's step updates each parameter from its own gradient and state alone,
  /// so that a partition can step on its own (SGD, Adam, AdamW, RMSprop, Adagrad; not LBFGS,
  /// whose step needs the whole model). ZeroRedundancyOptimizer refuses a factory without it.
  bool elementwise = false;
};

namespace detail {
std::string optimizer_type_name(const std::type_info& type);
}  // namespace detail

/// The factory of a libtorch optimizer type, e.g.
/// zero_optimizer<torch::optim::SGD>(torch::optim::SGDOptions(0.1).momentum(0.9)).
template <typename OptimizerType, typename OptionsType>
ZeroOptimizerFactory zero_optimizer(const OptionsType& options) {
  ZeroOptimizerFactory factory;
  factory.name = detail::optimizer_type_name(typeid(OptimizerType));
  factory.defaults = [options] { return std::make_unique<OptionsType>(options); };
  factory.make = [options](std::vector<torch::optim::OptimizerParamGroup> groups) {
    return std::unique_ptr<torch::optim::Optimizer>(
        std::make_unique<OptimizerType>(std::move(groups), options));
  };
  factory.elementwise = std::is_same_v<OptimizerType, torch::optim::SGD> ||
                        std::is_same_v<OptimizerType, torch::optim::Adam> ||
                        std::is_same_v<OptimizerType, torch::optim::AdamW> ||
                        std::is_same_v<OptimizerType, torch::optim::RMSprop> ||
                        std::is_same_v<OptimizerType, torch::optim::Adagrad>;
  return factory;
}

/// How step() hands every rank the parameters the others updated.
enum class ZeroExchange {
  /// Broadcasts from each owner: its large parameters in place, one by one (as PyTorch's default),
  /// its small ones packed per device and dtype; each rank's bytes once, and no buffer of the
  /// partition's size.
  kBroadcast,
  /// One all_gather_into_tensor per device and dtype of every partition, padded to the largest:
  /// one collective instead of one per rank, at the price of the padding.
  kAllGather,
};

struct ZeroRedundancyOptimizerOptions {
  /// The group whose ranks share the optimizer state. Default: the world.
  TORCH_ARG(ProcessGroup, process_group) = ProcessGroup();
  /// Default: kBroadcast.
  TORCH_ARG(ZeroExchange, exchange) = ZeroExchange::kBroadcast;
};

class ZeroRedundancyOptimizer : public torch::optim::Optimizer, public Joinable {
 public:
  /// Collective: checks that every rank passes the same parameters (count, shapes, dtypes, in
  /// order; a difference is an InvalidArgumentError naming the parameter and both ranks), then
  /// partitions them and makes this rank's wrapped optimizer.
  ZeroRedundancyOptimizer(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                          ZeroOptimizerFactory factory,
                          ZeroRedundancyOptimizerOptions options = {});
  ZeroRedundancyOptimizer(std::vector<at::Tensor> params, ZeroOptimizerFactory factory,
                          ZeroRedundancyOptimizerOptions options = {});
  ~ZeroRedundancyOptimizer() override;

  /// Collective: steps the owned partition (closure as the wrapped optimizer takes it), then
  /// exchanges the parameters. Returns the wrapped optimizer's loss.
  at::Tensor step(LossClosure closure = nullptr) override;

  /// Collective: gathers every rank's state onto group rank `to`, for state_dict() there.
  void consolidate_state_dict(int to = 0);
  /// The whole optimizer's state in PyTorch's layout (parameters numbered across the groups),
  /// as consolidated last. Throws InvalidArgumentError on a rank that did not receive it.
  c10::IValue state_dict() const;
  /// Local: every rank passes the whole state (any world size saved it); each keeps its partition.
  void load_state_dict(const c10::IValue& state_dict);

  /// The wrapped optimizer of this rank's partition (PyTorch: .optim).
  torch::optim::Optimizer& optim();
  /// The global indices of the parameters each group rank owns (numbered across the groups).
  const std::vector<std::vector<int64_t>>& partition() const;
  /// Bytes of the wrapped optimizer's state tensors on this rank.
  int64_t local_state_bytes() const;

  std::unique_ptr<JoinHook> join_hook(const JoinOptions& options) override;
  c10::Device join_device() const override;
  ProcessGroup join_process_group() const override;

  /// Hands every rank the parameters their owners hold: step()'s exchange. Collective.
  void sync_parameters();

 private:
  struct Shards;
  std::unique_ptr<Shards> shards_;
};

}  // namespace ddp
