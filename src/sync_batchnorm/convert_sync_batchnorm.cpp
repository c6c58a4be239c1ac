// convert_sync_batchnorm: BatchNorm1d/2d/3d become SyncBatchNorm1d/2d/3d wherever libtorch lets
// a module be swapped, the entries of Sequential, ModuleList and ModuleDict.
//
// The model is walked twice: first to find every BatchNorm and whether its parent can swap it,
// then, only when all can, to swap them. A refused model is thus left as it was, and the error
// names every BatchNorm at fault, not only the first.
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/moduledict.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>

#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/error_context.h"
#include "ddp/sync_batchnorm.h"

namespace ddp {
namespace {

constexpr const char* kConversion = "convert_sync_batchnorm";

// A BatchNorm's replacement, as a module and as the AnyModule that Sequential stores.
struct Replacement {
  std::shared_ptr<torch::nn::Module> module;
  torch::nn::AnyModule any;
};

template <typename SyncImpl, typename BatchNormImpl>
Replacement replace(const BatchNormImpl& batch_norm, const ProcessGroup& group) {
  SyncBatchNormOptions options(batch_norm.options);
  options.process_group(group);
  // The same tensors, not copies: an optimizer that holds them keeps training the new module.
  auto sync = std::make_shared<SyncImpl>(
      options, detail::BatchNormTensors{batch_norm.weight, batch_norm.bias, batch_norm.running_mean,
                                        batch_norm.running_var, batch_norm.num_batches_tracked});
  sync->train(batch_norm.is_training());
  return {sync, torch::nn::AnyModule(sync)};
}

// The SyncBatchNorm class that replaces `module` ("ddp::SyncBatchNorm2d"); null when `module` is
// no BatchNorm1d/2d/3d.
const char* sync_class_for(const torch::nn::Module& module) {
  if (module.as<torch::nn::BatchNorm1dImpl>()) return "ddp::SyncBatchNorm1d";
  if (module.as<torch::nn::BatchNorm2dImpl>()) return "ddp::SyncBatchNorm2d";
  if (module.as<torch::nn::BatchNorm3dImpl>()) return "ddp::SyncBatchNorm3d";
  return nullptr;
}

Replacement replacement_for(const torch::nn::Module& module, const ProcessGroup& group) {
  if (const auto* bn = module.as<torch::nn::BatchNorm1dImpl>()) {
    return replace<SyncBatchNorm1dImpl>(*bn, group);
  }
  if (const auto* bn = module.as<torch::nn::BatchNorm2dImpl>()) {
    return replace<SyncBatchNorm2dImpl>(*bn, group);
  }
  const auto* bn = module.as<torch::nn::BatchNorm3dImpl>();
  TORCH_INTERNAL_ASSERT(bn, "ddp::convert_sync_batchnorm: not a BatchNorm (a bug in ddp-cpp)");
  return replace<SyncBatchNorm3dImpl>(*bn, group);
}

// One BatchNorm to swap: the container that holds it, where, and the module itself.
struct Swap {
  torch::nn::Module* parent;
  size_t index;     // Sequential, ModuleList
  std::string key;  // the child's name; ModuleDict's key
  const torch::nn::Module* batch_norm;
};

bool swappable_parent(torch::nn::Module& parent) {
  return parent.as<torch::nn::SequentialImpl>() || parent.as<torch::nn::ModuleListImpl>() ||
         parent.as<torch::nn::ModuleDictImpl>();
}

// Finds the BatchNorms under `parent` (path `prefix`): those it can swap into `swaps`, the others,
// described, into `refused`. A module reached twice (shared) is walked once.
void find_batch_norms(torch::nn::Module& parent, const std::string& prefix,
                      std::vector<Swap>& swaps, std::vector<std::string>& refused,
                      std::unordered_set<const torch::nn::Module*>& walked) {
  const bool swappable = swappable_parent(parent);
  size_t index = 0;
  for (const auto& child : parent.named_children()) {
    const std::string path = prefix.empty() ? child.key() : prefix + "." + child.key();
    torch::nn::Module& module = *child.value();
    if (const char* sync_class = sync_class_for(module)) {
      if (swappable) {
        swaps.push_back({&parent, index, child.key(), &module});
      } else {
        refused.push_back("'" + path + "' (" + module.name() + ", a member of " + parent.name() +
                          ": declare it as " + sync_class + ")");
      }
    } else if (walked.insert(&module).second) {
      find_batch_norms(module, path, swaps, refused, walked);
    }
    ++index;
  }
}

void swap(const Swap& swap, const Replacement& replacement) {
  torch::nn::Module& parent = *swap.parent;
  if (auto* sequential = parent.as<torch::nn::SequentialImpl>()) {
    // Sequential keeps its modules twice: as AnyModules, which forward runs, and as children.
    auto entry = sequential->begin() + static_cast<std::ptrdiff_t>(swap.index);
    TORCH_INTERNAL_ASSERT(entry->ptr().get() == swap.batch_norm,
                          "ddp::convert_sync_batchnorm: Sequential's entries and children differ "
                          "(a bug in ddp-cpp)");
    *entry = replacement.any;
  } else if (auto* list = parent.as<torch::nn::ModuleListImpl>()) {
    auto entry = list->begin() + static_cast<std::ptrdiff_t>(swap.index);
    TORCH_INTERNAL_ASSERT(entry->get() == swap.batch_norm,
                          "ddp::convert_sync_batchnorm: ModuleList's entries and children differ "
                          "(a bug in ddp-cpp)");
    *entry = replacement.module;
  } else {
    auto* dict = parent.as<torch::nn::ModuleDictImpl>();
    TORCH_INTERNAL_ASSERT(dict, "ddp::convert_sync_batchnorm: not a container (a bug in ddp-cpp)");
    for (auto& item : *dict) {
      if (item.key() == swap.key) item.value() = replacement.module;
    }
  }
  parent.replace_module(swap.key, replacement.module);
}

}  // namespace

std::shared_ptr<torch::nn::Module> convert_sync_batchnorm(std::shared_ptr<torch::nn::Module> module,
                                                          const ProcessGroup& group) {
  if (!module) {
    detail::fail<InvalidArgumentError>(kConversion,
                                       "the module is null; pass a constructed module.");
  }
  if (sync_class_for(*module)) return replacement_for(*module, group).module;

  std::vector<Swap> swaps;
  std::vector<std::string> refused;
  std::unordered_set<const torch::nn::Module*> walked{module.get()};
  find_batch_norms(*module, "", swaps, refused, walked);
  if (!refused.empty()) {
    std::string list;
    for (const auto& entry : refused) list += (list.empty() ? "" : "; ") + entry;
    detail::fail<InvalidArgumentError>(
        kConversion,
        "cannot replace " + std::string(refused.size() == 1 ? "the BatchNorm" : "the BatchNorms") +
            " held as a typed member of a module: " + list +
            ". libtorch cannot swap a module that a class holds in a member variable, only the "
            "entries of torch::nn::Sequential, ModuleList and ModuleDict. Declare the member as "
            "the SyncBatchNorm named (its parameters and buffers have BatchNorm's names, so "
            "checkpoints still load), or hold it in one of those containers. Nothing was "
            "converted.");
  }
  // A BatchNorm held by two containers becomes one SyncBatchNorm held by both.
  std::unordered_map<const torch::nn::Module*, Replacement> replacements;
  for (const auto& entry : swaps) {
    auto found = replacements.find(entry.batch_norm);
    if (found == replacements.end()) {
      found =
          replacements.emplace(entry.batch_norm, replacement_for(*entry.batch_norm, group)).first;
    }
    swap(entry, found->second);
  }
  return module;
}

}  // namespace ddp
