// GroupState: what a ProcessGroup handle points to.
//
// One GroupState per group this process knows, members and non-members alike. It owns the c10d
// backend (null for non-members) and the group's prefixed store. Fields are written once, when
// the group is created, except `destroyed` (set by destroy_process_group) and the counters, which
// collectives touch from the thread that issues them.
#pragma once

#include <atomic>
#include <chrono>
#include <string>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

namespace ddp::detail {

struct GroupState {
  std::string name;               // store prefix, as torch.distributed names groups: "0", "1", ...
  std::vector<int> global_ranks;  // members, in group-rank order
  int group_rank = -1;            // -1: this process is not a member
  int global_rank = -1;
  std::string backend_name;
  std::chrono::milliseconds timeout{0};
  bool verify_collectives = true;
  c10::intrusive_ptr<c10d::ProcessGroup> backend;  // null for non-members
  c10::intrusive_ptr<c10d::Store> store;           // this group's own keys
  std::atomic<bool> destroyed{false};
  std::atomic<uint64_t> monitored_barrier_count{0};

  int size() const { return static_cast<int>(global_ranks.size()); }
  bool is_member() const { return group_rank >= 0; }
  /// The group rank of a global rank, -1 when it is not a member.
  int to_group_rank(int global) const;
};

}  // namespace ddp::detail
