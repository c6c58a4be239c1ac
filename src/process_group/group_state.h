// GroupState: what a ProcessGroup handle points to.
//
// One GroupState per group this process knows, members and non-members alike. It owns the
// group's backends (none for non-members), in the order they are asked (backend.h), and the
// group's prefixed store. Fields are written once, when the group is created, except `destroyed`
// (set by destroy_process_group), the counter, which collectives touch from the thread that
// issues them, and the traffic counters (thread-safe, traffic_counters.h).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "process_group/backend.h"
#include "process_group/traffic_counters.h"

namespace ddp::detail {

class FlightRecorder;

struct GroupState {
  std::string name;               // store prefix, as torch.distributed names groups: "0", "1", ...
  std::vector<int> global_ranks;  // members, in group-rank order
  int group_rank = -1;            // -1: this process is not a member
  int global_rank = -1;
  std::string backend_name;  // what get_backend() says: the backend of CPU tensors, or "nccl"
  std::chrono::milliseconds timeout{0};
  bool verify_collectives = true;
  std::vector<std::shared_ptr<Backend>> backends;  // preferred first; empty for non-members
  c10::intrusive_ptr<c10d::Store> store;           // this group's own keys
  std::atomic<bool> destroyed{false};
  std::atomic<uint64_t> monitored_barrier_count{0};
  TrafficCounters traffic;  // what this rank handed to the backends, by collective kind
  std::shared_ptr<FlightRecorder> recorder;  // its last collectives (trace/); null when off

  int size() const { return static_cast<int>(global_ranks.size()); }
  bool is_member() const { return group_rank >= 0; }
  /// The group rank of a global rank, -1 when it is not a member.
  int to_group_rank(int global) const;
  /// The first backend that takes `collective` on tensors like `like`; null when none does.
  Backend* backend_for(Collective collective, const at::Tensor& like) const;
  /// Releases the backends (joins their threads, closes their connections).
  void release();
};

}  // namespace ddp::detail
