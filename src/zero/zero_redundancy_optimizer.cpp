// ZeroRedundancyOptimizer: construction (the cross-rank check, the partition, the wrapped
// optimizer), step() and the parameter exchange. The state dict lives in zero_state_dict.cpp.
#include "ddp/zero_redundancy_optimizer.h"

#include <ATen/ATen.h>
#include <c10/util/Type.h>
#include <torch/autograd.h>

#include <map>
#include <tuple>

#include "collectives/unverified.h"
#include "common/error_context.h"
#include "ddp/collectives.h"
#include "trace/flight_recorder.h"
#include "zero/zero_shards.h"

namespace ddp {
namespace detail {

std::string optimizer_type_name(const std::type_info& type) { return c10::demangle(type.name()); }

namespace {

constexpr const char* kZeroOperation = "ZeroRedundancyOptimizer";
constexpr int64_t kMaxDimsInPrint = 6;
// Per parameter: group, dtype, dimension count, element count, the first kMaxDimsInPrint sizes.
constexpr int64_t kParamPrintWidth = 4 + kMaxDimsInPrint;
// The broadcast exchange sends a parameter of at least this many elements in place, alone; the
// smaller ones packed together (64 Ki elements: 256 KiB of float32, well past a collective's own
// cost on every backend).
constexpr int64_t kInPlaceBroadcastElements = int64_t{1} << 16;

std::string describe_param_print(const int64_t* print) {
  std::string shape = "[";
  for (int64_t d = 0; d < std::min(print[2], kMaxDimsInPrint); ++d) {
    shape += (d ? ", " : "") + std::to_string(print[4 + d]);
  }
  shape += print[2] > kMaxDimsInPrint ? ", ...]" : "]";
  return "shape " + shape + " " + c10::toString(static_cast<c10::ScalarType>(print[1])) +
         " in parameter group " + std::to_string(print[0]);
}

// Every rank must pass the same parameters: the same count, then per parameter the same group,
// dtype and shape. The same error on every rank otherwise (each sees every rank's print).
void check_same_parameters_everywhere(const std::vector<torch::optim::OptimizerParamGroup>& groups,
                                      const ProcessGroup& group) {
  std::vector<int64_t> prints;
  for (size_t g = 0; g < groups.size(); ++g) {
    for (const auto& param : groups[g].params()) {
      prints.push_back(static_cast<int64_t>(g));
      prints.push_back(static_cast<int64_t>(param.scalar_type()));
      prints.push_back(param.dim());
      prints.push_back(param.numel());
      for (int64_t d = 0; d < kMaxDimsInPrint; ++d) {
        prints.push_back(d < param.dim() ? param.size(d) : -1);
      }
    }
  }
  const auto ranks = group.ranks();
  const int64_t count = static_cast<int64_t>(prints.size()) / kParamPrintWidth;
  auto counts = all_gather(at::tensor({count}, at::kLong), group);
  for (size_t r = 1; r < counts.size(); ++r) {
    const int64_t other = counts[r].item<int64_t>();
    const int64_t first = counts[0].item<int64_t>();
    if (other != first) {
      fail<InvalidArgumentError>(
          kZeroOperation,
          "rank " + std::to_string(ranks[0]) + " passes " + std::to_string(first) +
              " parameters but rank " + std::to_string(ranks[r]) + " passes " +
              std::to_string(other) +
              "; every rank must build the optimizer from the same parameters, in the same order "
              "(the model's parameters(), after DDP has checked the model)");
    }
  }
  if (count == 0) return;
  auto all = all_gather(at::tensor(at::ArrayRef<int64_t>(prints), at::kLong), group);
  const int64_t* base = all[0].data_ptr<int64_t>();
  for (size_t r = 1; r < all.size(); ++r) {
    const int64_t* other = all[r].data_ptr<int64_t>();
    for (int64_t i = 0; i < count; ++i) {
      const int64_t* a = base + i * kParamPrintWidth;
      const int64_t* b = other + i * kParamPrintWidth;
      if (std::equal(a, a + kParamPrintWidth, b)) continue;
      fail<InvalidArgumentError>(
          kZeroOperation, "parameter " + std::to_string(i) + " has " + describe_param_print(a) +
                              " on rank " + std::to_string(ranks[0]) + " but " +
                              describe_param_print(b) + " on rank " + std::to_string(ranks[r]) +
                              "; every rank must build the optimizer from the same parameters, "
                              "in the same order");
    }
  }
}

}  // namespace
}  // namespace detail

namespace {

std::vector<torch::optim::OptimizerParamGroup> one_group(std::vector<at::Tensor> params) {
  return {torch::optim::OptimizerParamGroup(std::move(params))};
}

std::unique_ptr<torch::optim::OptimizerOptions> defaults_of(const ZeroOptimizerFactory& factory) {
  if (!factory.defaults || !factory.make) {
    detail::fail<InvalidArgumentError>(
        detail::kZeroOperation,
        "the factory of '" + factory.name +
            "' lacks defaults or make; build it with ddp::zero_optimizer<OptimizerType>(options)");
  }
  return factory.defaults();
}

}  // namespace

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<at::Tensor> params,
                                                 ZeroOptimizerFactory factory,
                                                 ZeroRedundancyOptimizerOptions options)
    : ZeroRedundancyOptimizer(one_group(std::move(params)), std::move(factory),
                              std::move(options)) {}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(
    std::vector<torch::optim::OptimizerParamGroup> param_groups, ZeroOptimizerFactory factory,
    ZeroRedundancyOptimizerOptions options)
    : Optimizer(std::move(param_groups), defaults_of(factory)),
      shards_(std::make_unique<Shards>()) {
  if (!factory.elementwise) {
    detail::fail<InvalidArgumentError>(
        detail::kZeroOperation,
        "cannot shard " + factory.name +
            ": its step() is not known to update each parameter from its own gradient and state "
            "alone (LBFGS, for one, needs the whole model at once), so a rank cannot step its "
            "partition on its own. Use torch::optim::SGD, Adam, AdamW, RMSprop or Adagrad, or a "
            "factory of your own with elementwise = true if its step is per parameter");
  }
  Shards& s = *shards_;
  s.factory = std::move(factory);
  s.group = options.process_group();
  s.exchange = options.exchange();
  s.rank = s.group.rank();
  if (s.rank < 0) {
    detail::fail<InvalidArgumentError>(detail::kZeroOperation,
                                       "this rank is not a member of the optimizer's group '" +
                                           s.group.name() + "'; only its members may make it");
  }
  s.world_size = s.group.size();
  detail::check_same_parameters_everywhere(param_groups_, s.group);

  std::vector<std::vector<int64_t>> numels;
  for (const auto& group : param_groups_) {
    numels.emplace_back();
    for (const auto& param : group.params()) {
      s.params.push_back(param);
      numels.back().push_back(param.numel());
    }
  }
  s.partition = detail::partition_by_size(numels, s.world_size);
  for (const auto& per_group : s.partition.owned) {
    s.owned_flat.emplace_back();
    for (const auto& indices : per_group) {
      s.owned_flat.back().insert(s.owned_flat.back().end(), indices.begin(), indices.end());
    }
  }
  std::vector<torch::optim::OptimizerParamGroup> mine;
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    std::vector<at::Tensor> owned;
    for (int64_t index : s.partition.owned[s.rank][g]) owned.push_back(s.params[index]);
    mine.emplace_back(std::move(owned), param_groups_[g].options().clone());
  }
  s.local = s.factory.make(std::move(mine));
  s.device = s.params.empty() ? c10::Device(c10::kCPU) : s.params[0].device();
}

ZeroRedundancyOptimizer::~ZeroRedundancyOptimizer() = default;

at::Tensor ZeroRedundancyOptimizer::step(LossClosure closure) {
  Join::notify_join_context(*this);
  // The options of our groups are the user's (a learning-rate scheduler changes them): the
  // wrapped optimizer steps with them.
  auto& local_groups = shards_->local->param_groups();
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    local_groups[g].set_options(param_groups_[g].options().clone());
  }
  at::Tensor loss = shards_->local->step(std::move(closure));
  sync_parameters();
  return loss;
}

void ZeroRedundancyOptimizer::sync_parameters() {
  Shards& s = *shards_;
  if (s.world_size == 1) return;
  torch::NoGradGuard no_grad;
  detail::TraceLabel label("ZeroRedundancyOptimizer parameter exchange (step)");
  // Per device and dtype, the parameters each rank owns, in the order it owns them.
  std::map<std::tuple<int, int, int>, std::vector<std::vector<at::Tensor>>> classes;
  for (int rank = 0; rank < s.world_size; ++rank) {
    for (int64_t index : s.owned_flat[rank]) {
      const at::Tensor& param = s.params[index];
      auto key = std::make_tuple(static_cast<int>(param.device().type()),
                                 static_cast<int>(param.device().index()),
                                 static_cast<int>(param.scalar_type()));
      auto& per_rank = classes[key];
      per_rank.resize(s.world_size);
      per_rank[rank].push_back(param);
    }
  }
  const auto ranks = s.group.ranks();
  for (auto& [key, per_rank] : classes) {
    (void)key;
    std::vector<int64_t> lengths;
    for (const auto& params : per_rank) {
      int64_t length = 0;
      for (const auto& param : params) length += param.numel();
      lengths.push_back(length);
    }
    const at::Tensor& like = [&]() -> const at::Tensor& {
      for (const auto& params : per_rank) {
        if (!params.empty()) return params[0];
      }
      return s.params[0];
    }();
    auto unpack = [](const at::Tensor& flat, const std::vector<at::Tensor>& params) {
      int64_t offset = 0;
      for (const auto& param : params) {
        param.copy_(flat.narrow(0, offset, param.numel()).view_as(param));
        offset += param.numel();
      }
    };
    auto pack = [](const std::vector<at::Tensor>& params) {
      std::vector<at::Tensor> lines;
      for (const auto& param : params) lines.push_back(param.reshape(-1));
      return at::cat(lines);
    };
    if (s.exchange == ZeroExchange::kBroadcast) {
      // Each large parameter is broadcast in place, from its owner into every copy: no buffer of
      // the partition's size (which would cost, at its peak, what sharding the state saved) and
      // no copies in or out. The small ones (biases, norms) travel packed, so that a model of
      // many small tensors does not pay a collective for each.
      std::vector<std::pair<std::vector<at::Tensor>, at::Tensor>> packs;  // params, their pack
      std::vector<Work> pending;
      for (int rank = 0; rank < s.world_size; ++rank) {
        std::vector<at::Tensor> small;
        for (const auto& param : per_rank[rank]) {
          if (param.numel() < detail::kInPlaceBroadcastElements || !param.is_contiguous()) {
            small.push_back(param);
            continue;
          }
          at::Tensor in_place = param;
          pending.push_back(
              detail::broadcast_async(in_place, ranks[rank], s.group, /*verify=*/false));
        }
        if (small.empty()) continue;
        int64_t length = 0;
        for (const auto& param : small) length += param.numel();
        at::Tensor flat = rank == s.rank ? pack(small) : at::empty({length}, like.options());
        pending.push_back(detail::broadcast_async(flat, ranks[rank], s.group, /*verify=*/false));
        if (rank != s.rank) packs.emplace_back(std::move(small), flat);
      }
      for (auto& work : pending) work.wait();
      for (const auto& [params, flat] : packs) unpack(flat, params);
    } else {
      const int64_t longest = *std::max_element(lengths.begin(), lengths.end());
      if (longest == 0) continue;
      at::Tensor input = at::zeros({longest}, like.options());
      if (lengths[s.rank] > 0) input.narrow(0, 0, lengths[s.rank]).copy_(pack(per_rank[s.rank]));
      at::Tensor output = at::empty({longest * s.world_size}, like.options());
      detail::all_gather_into_tensor_async(output, input, s.group, /*verify=*/false,
                                           detail::Launch::kWaitNow)
          .wait();
      for (int rank = 0; rank < s.world_size; ++rank) {
        if (rank != s.rank && lengths[rank] > 0) {
          unpack(output.narrow(0, rank * longest, lengths[rank]), per_rank[rank]);
        }
      }
    }
  }
}

torch::optim::Optimizer& ZeroRedundancyOptimizer::optim() { return *shards_->local; }

const std::vector<std::vector<int64_t>>& ZeroRedundancyOptimizer::partition() const {
  return shards_->owned_flat;
}

int64_t ZeroRedundancyOptimizer::local_state_bytes() const {
  return detail::optimizer_state_bytes(*shards_->local);
}

namespace {

// A rank that finished keeps stepping with the ranks still training (PyTorch's _ZeROJoinHook):
// its partition is stepped with the gradients its parameters hold (nothing clears them on a
// finished rank), then it takes part in the exchange.
class ZeroJoinHook : public JoinHook {
 public:
  explicit ZeroJoinHook(ZeroRedundancyOptimizer& optimizer) : optimizer_(&optimizer) {}
  void main_hook() override { optimizer_->step(); }

 private:
  ZeroRedundancyOptimizer* optimizer_;
};

}  // namespace

std::unique_ptr<JoinHook> ZeroRedundancyOptimizer::join_hook(const JoinOptions&) {
  return std::make_unique<ZeroJoinHook>(*this);
}

c10::Device ZeroRedundancyOptimizer::join_device() const { return shards_->device; }

ProcessGroup ZeroRedundancyOptimizer::join_process_group() const { return shards_->group; }

}  // namespace ddp
