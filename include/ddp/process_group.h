// ProcessGroup, ReduceOp and Work: the handles of ddp-cpp's collectives.
//
// A ProcessGroup is a cheap, copyable handle. A default-constructed handle means "the default
// (world) group", resolved when it is used, just as Python's group=None. Handles from new_group
// name one sub-group; they stay valid objects after destroy_process_group, but using them then is
// an error. Thread-safety: handles may be copied and queried from any thread; collectives on one
// group must be issued in the same order on every rank (from one thread, or serialized by the
// caller).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace ddp {

namespace detail {
struct GroupState;
struct WorkState;
}  // namespace detail

/// Reduction operators, numbered as torch.distributed.ReduceOp.
enum class ReduceOp : std::uint8_t {
  SUM = 0,
  AVG = 1,
  PRODUCT = 2,
  MIN = 3,
  MAX = 4,
  BAND = 5,
  BOR = 6,
  BXOR = 7,
};

/// "SUM", "AVG", ... for messages.
const char* to_string(ReduceOp op);

class ProcessGroup {
 public:
  /// The default (world) group.
  ProcessGroup() = default;

  /// True for the default-constructed handle.
  bool is_world() const { return state_ == nullptr; }
  /// True when this process belongs to the group.
  bool is_member() const;
  /// This process's rank within the group, -1 for a non-member.
  int rank() const;
  /// Number of ranks in the group.
  int size() const;
  /// The global ranks of the members, in group-rank order.
  std::vector<int> ranks() const;
  /// The group rank of a global rank; -1 when that rank is not a member.
  int group_rank(int global_rank) const;
  /// The name the group's keys live under in the store ("default_pg", "group1", ...).
  std::string name() const;

  // Internal: the state of the group this handle names (the world when default-constructed).
  // REQUIRES: a default group exists. Throws DistributedError otherwise.
  std::shared_ptr<detail::GroupState> state() const;
  explicit ProcessGroup(std::shared_ptr<detail::GroupState> state) : state_(std::move(state)) {}

 private:
  std::shared_ptr<detail::GroupState> state_;
};

/// A handle to an asynchronous collective. Copyable; every copy refers to the same operation.
/// Thread-safety: wait() and is_completed() may be called from any thread.
class Work {
 public:
  Work() = default;
  /// Blocks until the operation finished; rethrows its failure as a DistributedError. Calling it
  /// again after success returns at once.
  void wait();
  /// True when the operation has finished (successfully or not).
  bool is_completed() const;
  /// True when it has finished successfully.
  bool is_success() const;
  /// A Work that completes when this one has and `continuation` has run (once, on the thread that
  /// first waits). A failure of this Work skips the continuation and is rethrown by wait().
  Work then(std::function<void()> continuation) const;

  explicit Work(std::shared_ptr<detail::WorkState> state) : state_(std::move(state)) {}
  const std::shared_ptr<detail::WorkState>& state() const { return state_; }

 private:
  std::shared_ptr<detail::WorkState> state_;
};

}  // namespace ddp
