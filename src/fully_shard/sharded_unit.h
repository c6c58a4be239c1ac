// ShardedUnit: the state of one unit of fully_shard, and the moments of its step.
//
// Its parameters are the module's own tensors (those that the module's forward and an optimizer
// hold). Their data is switched (set_data) between two views:
//   - the shard: this rank's rows, a view into `shards_`, the flat buffer that the all-gather
//     sends and that the optimizer updates in place;
//   - the whole parameter: a view into `whole_`, whose storage is allocated for a forward or a
//     backward and released (size 0) between them. What autograd saves in forward (the parameter
//     itself, or views of it such as Linear's weight.t()) shares that storage, so the gather
//     before backward refills exactly what backward reads.
// Each parameter's gradient accumulator is taken while the parameter is whole (its metadata then
// has the whole shape) and kept, so that backward accumulates whole gradients; a post hook on it
// counts the unit's ready gradients, and the last one packs them (times 1 / group size, as DDP
// averages), launches the reduce-scatter and frees the whole parameters and gradients. A callback
// at the end of backward waits for it and hands each parameter the shard of its gradient.
//
// Between forward and backward with reshard_after_forward false, and within them, parameters are
// whole; otherwise they are shards. Thread-safety: one training thread (and autograd's, in turn).
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "compat/libtorch_compat.h"
#include "ddp/fully_shard.h"
#include "ddp/process_group.h"
#include "fully_shard/shard_layout.h"

namespace ddp::detail {

class ShardedUnit : public std::enable_shared_from_this<ShardedUnit> {
 public:
  /// Broadcasts the parameters from the group's first rank, then shards them. Collective.
  ShardedUnit(std::vector<at::Tensor> parameters, const FullyShardOptions& options);
  ~ShardedUnit();
  ShardedUnit(const ShardedUnit&) = delete;
  ShardedUnit& operator=(const ShardedUnit&) = delete;

  void before_forward();
  void after_forward();
  /// From autograd, when the gradient of the unit's output arrives.
  void before_backward();

  void set_requires_gradient_sync(bool sync) { sync_gradients_ = sync; }

  /// The whole value of parameter `index`. REQUIRES: gathered (gather_if_released).
  const at::Tensor& whole_view(size_t index) const { return whole_views_[index]; }
  /// Gathers the whole parameters if they are not (collective), and reports whether it did.
  bool gather_if_released();
  /// `rows` (this rank's rows of parameter `index`, shaped like its shard: an optimizer's
  /// per-element state) with every other rank's, whole. Collective over the group.
  at::Tensor gather_rows(size_t index, const at::Tensor& rows) const;
  /// Makes the parameters shards again and frees their whole storage.
  void reshard();

  const std::vector<at::Tensor>& parameters() const { return parameters_; }
  const ShardedParameter& layout_of(size_t index) const { return layout_.parameters[index]; }
  int group_rank() const { return group_rank_; }
  const ProcessGroup& group() const { return options_.group(); }

 private:
  void install_gradient_hooks();
  void on_gradient_ready(size_t index);
  void launch_reduce_scatter();
  void finish_backward();
  /// Waits for this unit's reduce-scatter, if one is pending, and hands each shard its gradient.
  void complete_reduction();
  void allocate_whole();

  std::vector<at::Tensor> parameters_;
  FullyShardOptions options_;
  int group_size_ = 1;
  int group_rank_ = 0;
  ShardLayout layout_;
  at::Tensor shards_;  // this rank's flat shard buffer, padding included
  at::Tensor whole_;   // every whole parameter; its storage is released between uses
  std::vector<at::Tensor> shard_views_;
  std::vector<at::Tensor> whole_views_;
  bool whole_allocated_ = false;
  bool gathered_ = false;  // whole_ holds the current values

  // Backward.
  std::vector<compat::AutogradNodePtr> accumulators_;  // kept alive: see above
  std::vector<uintptr_t> hook_keys_;
  std::vector<bool> ready_;
  bool all_require_grad_ = true;
  size_t pending_ = 0;                     // gradients not yet ready in this backward
  bool in_backward_ = false;               // before_backward ran, finish_backward not yet
  bool launched_ = false;                  // the reduce-scatter of this backward
  std::vector<at::Tensor> earlier_grads_;  // the shards' .grad before this backward
  std::vector<at::Tensor> unsynced_;       // whole gradients kept while sync is off
  at::Tensor reduced_;                     // this rank's averaged shard of the gradients
  Work reduction_;
  bool reduction_pending_ = false;
  bool sync_gradients_ = true;
};

}  // namespace ddp::detail
