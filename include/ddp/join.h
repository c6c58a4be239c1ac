// ddp::Join: training with uneven inputs, the C++ counterpart of torch.distributed.algorithms.Join.
//
// When the ranks have different numbers of batches, a rank that runs out leaves the loop while the
// others are still in DDP's collectives, and the job fails (without Join, every rank raises a
// MismatchError or PeerLostError that says "uneven inputs"). Join lets it finish instead: the rank
// that is done calls finish(), which shadows the collectives of the ranks still training (DDP's
// gradient all-reduce with zeros, its buffer broadcast, its unused-parameter map) until every rank
// has finished; then every joinable's state is made the same on all ranks (DDP: the model of a
// rank that finished last).
//
//   ddp::DistributedDataParallel model(net);
//   {
//     ddp::Join join({&model}, ddp::JoinOptions().divide_by_initial_world_size(true));
//     for (auto& batch : *loader) {   // a different number of batches on each rank
//       optimizer.zero_grad();
//       loss_of(model(batch.data), batch.target).backward();
//       optimizer.step();
//     }
//     join.finish();                  // collective: returns once every rank has finished
//   }
//
// Each iteration, the first joinable (list DDP first) tells the others that this rank still trains:
// one small all-reduce per forward. The ranks that are done take part in it from finish().
// With throw_on_early_termination, the first rank to run out makes every rank raise an
// UnevenInputsError in the same iteration instead (the others in their next forward, itself in
// finish()), so that all can leave the loop together. SyncBatchNorm under Join requires it, as in
// PyTorch: its collectives cannot be shadowed.
// A Join destroyed without finish() (an exception unwinding through it) runs no collective: its
// peers then fail with the error of the rank that left (PeerLostError when it exits).
//
// divide_by_initial_world_size(true) (the default) averages gradients over the whole group, the
// finished ranks counting as zeros, so that late iterations weigh less; false averages over the
// ranks still training (DDP without a comm hook; a comm hook averages as it does).
//
// Thread-safety: a Join and its joinables belong to the training thread.
#pragma once

#include <c10/core/Device.h>
#include <torch/arg.h>

#include <memory>
#include <vector>

#include "ddp/process_group.h"

namespace ddp {

/// Options of Join, PyTorch's keyword arguments.
struct JoinOptions {
  /// false: Join does nothing (finish() returns at once, no per-iteration collective), so that one
  /// program runs with and without uneven inputs. Default: true.
  TORCH_ARG(bool, enable) = true;
  /// Raise an UnevenInputsError on every rank as soon as one rank runs out of inputs, instead of
  /// shadowing its peers. Default: false.
  TORCH_ARG(bool, throw_on_early_termination) = false;
  /// DDP: average gradients over the initial group size (true) or over the ranks that have not
  /// finished yet (false). Default: true.
  TORCH_ARG(bool, divide_by_initial_world_size) = true;
};

/// What a joinable does on a rank that has finished (torch.distributed.algorithms.JoinHook).
class JoinHook {
 public:
  virtual ~JoinHook() = default;
  /// Called once per iteration of the ranks still training: issues the collectives one such
  /// iteration issues for this joinable, with this rank's share neutral (zeros).
  virtual void main_hook() {}
  /// Called once when every rank has finished. is_last_joiner: this rank finished in the last
  /// iteration (it was among the last to run out).
  virtual void post_hook(bool is_last_joiner) { (void)is_last_joiner; }
};

/// A class whose per-iteration collectives Join can shadow (DistributedDataParallel; an optimizer
/// that communicates in step()).
class Joinable {
 public:
  virtual ~Joinable() = default;
  /// The hook a finished rank runs for this joinable, under the Join's options.
  virtual std::unique_ptr<JoinHook> join_hook(const JoinOptions& options) = 0;
  /// Where the Join's own collectives run: the device of this joinable's tensors.
  virtual c10::Device join_device() const = 0;
  /// The group this joinable communicates in.
  virtual ProcessGroup join_process_group() const = 0;

  /// The options of the enabled Join this joinable is in; nullptr outside one.
  const JoinOptions* join_options() const { return in_join_ ? &join_options_ : nullptr; }
  /// True for the first joinable of its Join: the one whose notify_join_context communicates.
  bool is_first_joinable() const { return in_join_ && is_first_; }

 private:
  friend class Join;
  JoinOptions join_options_;
  bool in_join_ = false;
  bool is_first_ = false;
};

class Join {
 public:
  /// Enters the joinables (not null, one group; list them in the order of their per-iteration
  /// collectives, DDP before an optimizer that communicates) into the join context. Local: no
  /// collective.
  explicit Join(std::vector<Joinable*> joinables, JoinOptions options = JoinOptions());
  /// Leaves the context; without finish(), no collective runs (see above).
  ~Join();
  Join(const Join&) = delete;
  Join& operator=(const Join&) = delete;

  /// Collective: call once this rank's inputs are exhausted. Shadows the iterations of the ranks
  /// still training until every rank has called it, then runs the post hooks (DDP: every rank
  /// takes the model of one that finished last). Throws UnevenInputsError with
  /// throw_on_early_termination when some rank was still training; a DistributedError when a
  /// peer fails. REQUIRES: called at most once.
  void finish();

  /// For a joinable, once at the start of each iteration's collectives: when it is the first
  /// joinable of an enabled Join, tells the ranks that have finished that this one still trains
  /// (one all-reduce), and throws UnevenInputsError when, with throw_on_early_termination, some
  /// rank has run out. Does nothing otherwise.
  static void notify_join_context(Joinable& joinable);

 private:
  void leave();

  std::vector<Joinable*> joinables_;
  JoinOptions options_;
  std::vector<std::unique_ptr<JoinHook>> hooks_;
  bool finished_ = false;
};

}  // namespace ddp
