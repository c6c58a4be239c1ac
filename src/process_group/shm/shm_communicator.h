// ShmCommunicator: the collectives of the ranks of one host, through one shared segment.
//
// Segment layout: a header, one control line per rank (shm_sync.h), then two buffer sets used by
// alternate rounds. A set holds one staging slot of kChunkBytes per rank and one result area of
// kChunkBytes. A collective is cut into rounds of at most one chunk; while the ranks work in one
// set, a slow rank may still be reading the other, so a rank only starts to write a set once every
// peer has begun the round after the one that last used it (begin_round).
//
// All-reduce of large tensors is a reduce-scatter then an all-gather inside shared memory: per
// round each rank stages the slices the others reduce, reduces its own slice (reading its own
// input in place, the others' from their slots) into the result area, and copies the others'
// reduced slices out. Each byte is copied in once and out once, and the reduction work is split
// evenly. Small tensors (up to kSmallBytes) take one phase instead of two: every rank stages its
// whole input and reduces all of it, in rank order, so all ranks compute identical bits.
//
// Thread-safety: none; the owning process group runs its collectives one at a time on one thread.
#pragma once

#include <c10/core/ScalarType.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <vector>

#include "process_group/shm/scattered_bytes.h"
#include "process_group/shm/shm_segment.h"
#include "process_group/shm/shm_sync.h"

namespace ddp::detail {

struct ShmGroupSetup {
  std::string job;                // names the segment: run id of the job
  int attempt = 0;                // restart count, from the launcher
  std::string group;              // the group's name ("0", "1", ...)
  int host_index = 0;             // which host of the group these ranks are on
  int local_rank = 0;             // index among the group's ranks on this host
  std::vector<int> global_ranks;  // the group's ranks on this host, for messages
  std::chrono::milliseconds timeout{0};
};

class ShmCommunicator {
 public:
  // 1 MiB per rank and round: larger chunks stop fitting in L2 next to the tensor being reduced,
  // smaller ones pay the two synchronizations of a round more often (each is about 1 us).
  static constexpr size_t kChunkBytes = size_t(1) << 20;
  // Up to this size one phase (everybody reduces everything) beats two: latency over work.
  static constexpr size_t kSmallBytes = size_t(32) << 10;

  /// Collective over the host's ranks of the group: creates (local rank 0) or maps the segment.
  ShmCommunicator(c10d::Store& store, const ShmGroupSetup& setup, const std::string& operation);
  ~ShmCommunicator();  // tells the peers this rank left
  ShmCommunicator(const ShmCommunicator&) = delete;
  ShmCommunicator& operator=(const ShmCommunicator&) = delete;

  int local_rank() const { return sync_.local_rank(); }
  int local_size() const { return sync_.local_size(); }

  // `operation`, where a function takes one, is what error messages call the collective: the
  // user's, when this one is a phase of it (a hierarchical all_reduce's broadcast).

  /// In place: data holds `count` elements; every rank ends with op over all ranks.
  void all_reduce(void* data, size_t count, c10::ScalarType dtype, c10d::ReduceOp::RedOpType op,
                  const char* operation = "all_reduce");
  /// The same over several tensors' memory seen as one run of elements, from `input` into
  /// `output` (of the same size; the same object for in place); `factor` is PREMUL_SUM's
  /// (shm_reduce.h). `input` is only read, and only while this call runs.
  void all_reduce(const ScatteredBytes& input, const ScatteredBytes& output, c10::ScalarType dtype,
                  c10d::ReduceOp::RedOpType op, double factor = 1.0,
                  const char* operation = "all_reduce");
  /// inputs[j] (count elements each) goes to local rank j, reduced over ranks, into `output`.
  void reduce_scatter(void* output, const std::vector<const void*>& inputs, size_t count,
                      c10::ScalarType dtype, c10d::ReduceOp::RedOpType op);
  /// `bytes` bytes from local rank `root` to every rank.
  void broadcast(void* data, size_t bytes, int root, const char* operation = "broadcast");
  /// Each rank's `bytes` bytes of input land in outputs[its local rank] on every rank.
  void all_gather(const void* input, size_t bytes, const std::vector<void*>& outputs);
  void barrier();

  /// Marks the group broken (the peers' waits raise) after a failure outside shared memory.
  void abort(const std::string& reason, ShmFailure kind = ShmFailure::kOther, int lost_rank = -1) {
    sync_.abort(reason, kind, lost_rank);
  }

 private:
  enum Kind : uint64_t { kAllReduce = 1, kReduceScatter, kBroadcast, kAllGather, kBarrier };

  // Starts a round: returns the buffer set it may write, once no peer can still be reading it.
  int begin_round(const char* operation);
  void end_round();
  void start_call(const char* operation, Kind kind, uint64_t dtype, uint64_t count);
  void check_calls_after_wait(const char* operation);
  void wait_all(const char* operation) { sync_.wait_for_all(sync_.phase(), deadline_, operation); }
  template <typename Body>
  void run_guarded(const char* operation, Body&& body);

  char* slot(int set, int rank) const;
  char* result(int set) const;

  ShmSegment segment_;
  ShmSync sync_;
  std::chrono::milliseconds timeout_;
  std::chrono::steady_clock::time_point deadline_;
  char* data_ = nullptr;
  uint64_t round_ = 0;
  uint32_t round_end_phase_[2] = {0, 0};  // phase count at the end of the last two rounds
  uint64_t call_ = 0;
  bool call_checked_ = false;
  bool call_published_ = false;
  uint64_t call_fields_[3] = {0, 0,
                              0};  // this call's {kind, dtype, count}, published by begin_round
};

}  // namespace ddp::detail
