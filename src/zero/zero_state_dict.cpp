// ZeroRedundancyOptimizer's state dict: consolidate_state_dict gathers every rank's wrapped state
// (PyTorch's layout, local numbering) onto one rank and renumbers it globally; load_state_dict
// takes a whole state, saved at any world size, and keeps this rank's partition of it.
#include <ATen/ATen.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <cstring>
#include <map>

#include "checkpoint/optimizer_state.h"
#include "common/error_context.h"
#include "ddp/collectives.h"
#include "zero/zero_shards.h"

namespace ddp {
namespace detail {
namespace {

int64_t state_tensor_bytes(const at::Tensor& tensor) {
  return tensor.defined() ? tensor.nbytes() : 0;
}

}  // namespace

c10::impl::GenericDict zero_string_dict() {
  return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
}

int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer) {
  int64_t total = 0;
  for (const auto& entry : optimizer.state()) {
    const auto* state = entry.second.get();
    if (const auto* sgd = dynamic_cast<const torch::optim::SGDParamState*>(state)) {
      total += state_tensor_bytes(sgd->momentum_buffer());
    } else if (const auto* adam = dynamic_cast<const torch::optim::AdamParamState*>(state)) {
      total += state_tensor_bytes(adam->exp_avg()) + state_tensor_bytes(adam->exp_avg_sq()) +
               state_tensor_bytes(adam->max_exp_avg_sq());
    } else if (const auto* adamw = dynamic_cast<const torch::optim::AdamWParamState*>(state)) {
      total += state_tensor_bytes(adamw->exp_avg()) + state_tensor_bytes(adamw->exp_avg_sq()) +
               state_tensor_bytes(adamw->max_exp_avg_sq());
    } else if (const auto* rms = dynamic_cast<const torch::optim::RMSpropParamState*>(state)) {
      total += state_tensor_bytes(rms->square_avg()) + state_tensor_bytes(rms->momentum_buffer()) +
               state_tensor_bytes(rms->grad_avg());
    } else if (const auto* ada = dynamic_cast<const torch::optim::AdagradParamState*>(state)) {
      total += state_tensor_bytes(ada->sum());
    }
  }
  return total;
}

}  // namespace detail

namespace {

constexpr const char* kZeroConsolidate = "ZeroRedundancyOptimizer::consolidate_state_dict";
constexpr const char* kZeroLoad = "ZeroRedundancyOptimizer::load_state_dict";

c10::impl::GenericDict zero_dict_entry(const c10::impl::GenericDict& dict, const std::string& key,
                                       const char* operation) {
  auto it = dict.find(key);
  if (it == dict.end() || !it->value().isGenericDict()) {
    detail::fail<InvalidArgumentError>(operation, "the state dict has no dict \"" + key +
                                                      "\"; pass a state in PyTorch's optimizer "
                                                      "layout (state_dict() of this optimizer)");
  }
  return it->value().toGenericDict();
}

c10::List<c10::IValue> zero_list_entry(const c10::impl::GenericDict& dict, const std::string& key,
                                       const char* operation) {
  auto it = dict.find(key);
  if (it == dict.end() || !it->value().isList()) {
    detail::fail<InvalidArgumentError>(operation, "the state dict has no list \"" + key + "\"");
  }
  return it->value().toList();
}

}  // namespace

void ZeroRedundancyOptimizer::consolidate_state_dict(int to) {
  Shards& s = *shards_;
  if (to < 0 || to >= s.world_size) {
    detail::fail<InvalidArgumentError>(kZeroConsolidate,
                                       "to=" + std::to_string(to) +
                                           " is not a rank of the optimizer's group "
                                           "of " +
                                           std::to_string(s.world_size) +
                                           " (to is a group rank, as in PyTorch)");
  }
  // Local states in PyTorch's layout, pickled, gathered as bytes padded to the longest.
  c10::IValue mine = detail::optimizer_state_dict(*s.local, kZeroConsolidate);
  std::vector<char> bytes = torch::jit::pickle_save(mine);
  auto lengths = all_gather(at::tensor({static_cast<int64_t>(bytes.size())}, at::kLong), s.group);
  int64_t longest = 0;
  for (const auto& length : lengths) longest = std::max(longest, length.item<int64_t>());
  at::Tensor padded = at::zeros({longest}, at::kByte);
  std::memcpy(padded.data_ptr(), bytes.data(), bytes.size());
  auto gathered = gather(padded, s.group.ranks()[to], s.group);
  s.has_consolidated = false;
  s.consolidated = c10::IValue();
  if (s.rank != to) return;

  std::map<int64_t, c10::IValue> state;  // sorted by global index, as PyTorch sorts it
  c10::impl::GenericList own_groups(c10::AnyType::get());
  for (int rank = 0; rank < s.world_size; ++rank) {
    const char* data = static_cast<const char*>(gathered[rank].data_ptr());
    auto local =
        torch::jit::pickle_load(std::vector<char>(data, data + lengths[rank].item<int64_t>()))
            .toGenericDict();
    auto local_state = zero_dict_entry(local, "state", kZeroConsolidate);
    auto local_groups = zero_list_entry(local, "param_groups", kZeroConsolidate);
    if (rank == to) own_groups = local_groups;
    for (size_t g = 0; g < local_groups.size(); ++g) {
      auto indices = zero_list_entry(c10::IValue(local_groups.get(g)).toGenericDict(), "params",
                                     kZeroConsolidate);
      const auto& globals = s.partition.owned[rank][g];
      TORCH_CHECK(indices.size() == globals.size(), "ddp-cpp bug: rank ", rank,
                  "'s wrapped optimizer has ", indices.size(), " parameters in group ", g,
                  " but its partition ", globals.size());
      for (size_t j = 0; j < indices.size(); ++j) {
        auto found = local_state.find(indices.get(j));
        if (found != local_state.end()) state[globals[j]] = found->value();
      }
    }
  }
  c10::impl::GenericDict merged_state(c10::IntType::get(), c10::AnyType::get());
  for (auto& [index, value] : state) merged_state.insert(index, value);
  c10::impl::GenericList groups(c10::AnyType::get());
  int64_t first = 0;
  for (size_t g = 0; g < own_groups.size(); ++g) {
    auto group = c10::IValue(own_groups.get(g)).toGenericDict().copy();
    c10::impl::GenericList indices(c10::AnyType::get());
    for (size_t i = 0; i < param_groups_[g].params().size(); ++i) indices.push_back(first++);
    group.insert_or_assign("params", indices);
    groups.push_back(group);
  }
  auto result = detail::zero_string_dict();
  result.insert("state", merged_state);
  result.insert("param_groups", groups);
  s.consolidated = result;
  s.has_consolidated = true;
}

c10::IValue ZeroRedundancyOptimizer::state_dict() const {
  if (!shards_->has_consolidated) {
    detail::fail<InvalidArgumentError>(
        "ZeroRedundancyOptimizer::state_dict",
        "the optimizer state has not been consolidated on this rank (group rank " +
            std::to_string(shards_->rank) +
            "); call consolidate_state_dict(to) on every rank first, then state_dict() on rank "
            "to");
  }
  return shards_->consolidated;
}

void ZeroRedundancyOptimizer::load_state_dict(const c10::IValue& saved) {
  Shards& s = *shards_;
  if (!saved.isGenericDict()) {
    detail::fail<InvalidArgumentError>(kZeroLoad, "the state dict is a " + saved.tagKind() +
                                                      ", not a dict in PyTorch's optimizer layout");
  }
  auto top = saved.toGenericDict();
  auto state = zero_dict_entry(top, "state", kZeroLoad);
  auto groups = zero_list_entry(top, "param_groups", kZeroLoad);
  if (groups.size() != param_groups_.size()) {
    detail::fail<InvalidArgumentError>(kZeroLoad, "the state dict has " +
                                                      std::to_string(groups.size()) +
                                                      " parameter group(s); this optimizer has " +
                                                      std::to_string(param_groups_.size()));
  }
  // This rank's part, renumbered as its wrapped optimizer numbers its parameters.
  c10::impl::GenericDict local_state(c10::IntType::get(), c10::AnyType::get());
  c10::impl::GenericList local_groups(c10::AnyType::get());
  int64_t first = 0;
  int64_t local_index = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    auto group = c10::IValue(groups.get(g)).toGenericDict();
    auto saved_indices = zero_list_entry(group, "params", kZeroLoad);
    const int64_t count = static_cast<int64_t>(param_groups_[g].params().size());
    if (static_cast<int64_t>(saved_indices.size()) != count) {
      detail::fail<InvalidArgumentError>(
          kZeroLoad, "the state dict has " + std::to_string(saved_indices.size()) +
                         " parameters in param_groups[" + std::to_string(g) +
                         "]; this optimizer has " + std::to_string(count) +
                         " there. Load a state saved from the same model");
    }
    c10::impl::GenericList indices(c10::AnyType::get());
    for (int64_t global : s.partition.owned[s.rank][g]) {
      auto found = state.find(saved_indices.get(global - first));
      if (found != state.end()) local_state.insert(local_index, found->value());
      indices.push_back(local_index++);
    }
    auto local_group = group.copy();
    local_group.insert_or_assign("params", indices);
    local_groups.push_back(local_group);
    first += count;
  }
  auto local = detail::zero_string_dict();
  local.insert("state", local_state);
  local.insert("param_groups", local_groups);
  detail::load_optimizer_state_dict(*s.local, local, "the state dict given", kZeroLoad);
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    param_groups_[g].set_options(s.local->param_groups()[g].options().clone());
  }
}

}  // namespace ddp
