// DistributedDataParallel as a Joinable: what a rank that finished does under ddp::Join.
#include <ATen/ATen.h>

#include "common/error_context.h"
#include "ddp/distributed_data_parallel.h"
#include "ddp/sync_batchnorm.h"

namespace ddp::detail {
namespace {

class DDPJoinHook : public JoinHook {
 public:
  explicit DDPJoinHook(DDPCore& core) : core_(&core) {}
  void main_hook() override { core_->shadow_iteration(); }
  void post_hook(bool is_last_joiner) override { core_->sync_final_model(is_last_joiner); }

 private:
  DDPCore* core_;
};

bool is_sync_batchnorm(const torch::nn::Module& module) {
  return dynamic_cast<const SyncBatchNormImpl*>(&module) ||
         dynamic_cast<const SyncBatchNorm1dImpl*>(&module) ||
         dynamic_cast<const SyncBatchNorm2dImpl*>(&module) ||
         dynamic_cast<const SyncBatchNorm3dImpl*>(&module);
}

}  // namespace

std::unique_ptr<JoinHook> DDPCore::join_hook(const JoinOptions& options) {
  if (!options.throw_on_early_termination()) {
    for (const auto& item : module_->named_modules()) {
      if (!is_sync_batchnorm(*item.value())) continue;
      fail<InvalidArgumentError>(
          "Join",
          "the model has a SyncBatchNorm ('" + item.key() +
              "'), whose collectives in forward and backward a rank that finished cannot "
              "shadow. Make the Join with JoinOptions().throw_on_early_termination(true), as "
              "PyTorch requires, and leave the loop on every rank when ddp::UnevenInputsError "
              "is raised");
    }
  }
  return std::make_unique<DDPJoinHook>(*this);
}

}  // namespace ddp::detail
