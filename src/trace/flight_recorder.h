// FlightRecorder: a group's last N collectives, as this rank saw them.
//
// Every collective passes through one CollectiveCall (collectives/collective_call.h), which opens
// an entry here when it is made (queued), marks it started when it is handed to the backend, and
// completed or failed when it ends: at once for the synchronous calls, at the first wait of its
// Work for the others. An entry holds the group's sequence number of the call (1, 2, ... on every
// rank that makes the same calls), the operation, the dtype and sizes of its tensor, the backend,
// the public call that issued it (a TraceLabel: a DDP bucket, a checkpoint barrier...; none for
// the user's own calls), its three times and its state. The ring keeps the last `capacity`
// entries; dump_flight_records (trace_dump.h) writes them as JSON.
//
// Cost, which is why the recorder can stay on: entries are fixed-size and preallocated (no
// allocation per call), and a collective takes the group's ring lock (RingLock) three times
// (open, start, end), uncontended but for a dump or a Work waited on by another thread; what it
// learns in between waits in its TraceSlot. Thread-safety: every member function may be called
// from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace ddp::detail {

/// The ring's lock. Held for a few stores at a time, almost never contended (a dump, or a Work
/// waited on by another thread): taking it is one atomic exchange and releasing it a plain store,
/// where a std::mutex costs an atomic operation and a library call each way, which a collective
/// pays three times. A holder that takes long (a dump copying the ring) makes the others yield.
class RingLock {
 public:
  void lock() {
    while (held_.exchange(true, std::memory_order_acquire)) {
      while (held_.load(std::memory_order_relaxed)) std::this_thread::yield();
    }
  }
  void unlock() { held_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> held_{false};
};

/// How an entry stands. kFailed says which kind of error ended it where that is known.
enum class TraceState : uint8_t { kQueued, kStarted, kCompleted, kFailed };

/// What a failed entry raised: the kinds that make a rank dump its record, or another.
enum class TraceFailure : uint8_t { kNone, kTimeout, kPeerLost, kMismatch, kOther };

const char* to_string(TraceState state);
const char* to_string(TraceFailure failure);

/// The dtype and sizes of a collective's tensor, as a call learns them.
struct TraceTensor {
  static constexpr int kMaxDims = 4;  // deeper shapes keep their element count and first dims
  int8_t dtype = -1;                  // c10::ScalarType, -1: no tensor (barrier)
  int8_t dims = 0;
  int64_t numel = 0;
  int64_t sizes[kMaxDims] = {};
};

/// One collective in the ring: two cache lines, so that recording touches as few as it can.
struct alignas(64) TraceEntry {
  static constexpr int kNameLength = 36;
  uint64_t sequence = 0;  // 1-based, in the group; 0: an empty slot
  // Microseconds since the epoch (system clock: comparable across ranks) as entries() returns
  // them; 0: not yet. Inside the ring: the recorder's clock ticks (flight_recorder.cpp).
  int64_t queued_us = 0;
  int64_t started_us = 0;
  int64_t finished_us = 0;
  const char* call = nullptr;  // TraceLabel's text; null: the user called it directly
  const char* backend = "";    // "shm", "gloo", "hierarchical", "nccl"; "" before chosen
  int64_t numel = 0;           // the tensor's (the first the call staged)
  int64_t sizes[TraceTensor::kMaxDims] = {};
  char operation[kNameLength] = {};  // "all_reduce", "broadcast", "DistributedDataParallel forward"
  int8_t dtype = -1;                 // c10::ScalarType, -1: none
  int8_t dims = 0;
  TraceState state = TraceState::kQueued;
  TraceFailure failure = TraceFailure::kNone;
};
static_assert(sizeof(TraceEntry) == 128, "a flight-recorder entry is two cache lines");

/// Which entry a call or a Work is recording into (empty when the recorder is off), with what
/// the call learnt about it since it was opened: its tensor and backend, written into the entry
/// with the next mark, so that the issuing thread takes the recorder's lock only to open, start
/// and end it.
struct TraceSlot {
  // Not owning: the group (a collective's) or the WorkState's own reference keeps it alive.
  class FlightRecorder* recorder = nullptr;
  uint64_t sequence = 0;
  bool handed_to_work = false;  // a WorkState took it: its wait marks the end
  bool started = false;
  bool changed = false;  // tensor or backend learnt since they were last written to the entry
  TraceTensor tensor;
  const char* backend = "";
  explicit operator bool() const { return recorder != nullptr; }
};

/// `backend` as a string that lives as long as the process, found once per name.
const char* lasting_backend_name(const std::string& backend);

/// Makes `slot` the entry that this thread is making or waiting for, for a scope: a WorkState made
/// in it takes the slot over, and a failure raised in it (note_trace_failure) marks it. Scopes
/// nest; the innermost wins. `slot` must outlive the scope.
class ActiveTraceScope {
 public:
  explicit ActiveTraceScope(TraceSlot* slot);
  ~ActiveTraceScope();
  ActiveTraceScope(const ActiveTraceScope&) = delete;
  ActiveTraceScope& operator=(const ActiveTraceScope&) = delete;

  /// The innermost slot of this thread, or null.
  static TraceSlot* current();

 private:
  TraceSlot* previous_;
};

class FlightRecorder : public std::enable_shared_from_this<FlightRecorder> {
 public:
  /// REQUIRES: capacity > 0 (a group whose recorder is off has none).
  FlightRecorder(size_t capacity, std::string group_name, std::vector<int> global_ranks,
                 int global_rank);
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

  /// Opens the next entry (queued now) and returns its sequence number. `call`: a string that
  /// lives as long as the process (TraceLabel's), or null.
  uint64_t open(const std::string& operation, const char* call);
  /// Writes the slot's tensor and backend into its entry (where they changed).
  void describe(TraceSlot& slot);
  /// The same, and marks it started (once: a later call does nothing).
  void mark_started(TraceSlot& slot);
  /// The same, and marks it completed (unless it failed).
  void mark_completed(const TraceSlot& slot);
  /// The same, and marks it failed; a known kind replaces kOther, never the other way round.
  void mark_failed(const TraceSlot& slot, TraceFailure failure);
  /// The kind recorded for a failed entry (kNone when it has not failed or is gone).
  TraceFailure failure_of(uint64_t sequence) const;

  /// The entries still held, oldest first.
  std::vector<TraceEntry> entries() const;
  size_t capacity() const { return ring_.size(); }
  const std::string& group_name() const { return group_name_; }
  const std::vector<int>& global_ranks() const { return global_ranks_; }
  int global_rank() const { return global_rank_; }

 private:
  // REQUIRES: mutex_ held. The slot's entry with its description written in; null when the
  // ring has wrapped over it.
  TraceEntry* find_described(const TraceSlot& slot);
  // The timeline is on: hands a copy of the finished entry to it, after unlocking `lock`.
  void show_on_timeline(const TraceEntry& entry, std::unique_lock<RingLock>& lock);

  mutable RingLock mutex_;
  std::vector<TraceEntry> ring_;  // GUARDED_BY(mutex_)
  uint64_t next_sequence_ = 1;    // GUARDED_BY(mutex_)
  const std::string group_name_;
  const std::vector<int> global_ranks_;
  const int global_rank_;
};

/// Names the public call on whose behalf the collectives issued in its scope, on this thread, are
/// made ("DistributedDataParallel gradient bucket", "save_checkpoint"...). The text must live as
/// long as the process (a string literal). Scopes nest; the innermost names the call. Costs a
/// thread-local store.
class TraceLabel {
 public:
  explicit TraceLabel(const char* call);
  ~TraceLabel();
  TraceLabel(const TraceLabel&) = delete;
  TraceLabel& operator=(const TraceLabel&) = delete;

  /// The innermost label of this thread, or null.
  static const char* current();

 private:
  const char* previous_;
};

/// The number of entries each group keeps: `option` when it is 0 or more, else DDP_CPP_TRACE_BUFFER
/// (`env_value`, null when unset) when set, else 2000. Throws InvalidArgumentError for a negative
/// or malformed environment value, or an option below -1.
size_t resolve_trace_buffer(int64_t option, const char* env_value);
/// The folder a trace goes to: `option` when not empty, else the environment's value (`env_value`,
/// null when unset), else "" (nowhere). For the flight records (InitOptions().trace_dir,
/// DDP_CPP_TRACE_DIR) and the timeline (InitOptions().timeline_path, DDP_CPP_TIMELINE) alike.
std::string resolve_trace_dir(const std::string& option, const char* env_value);

}  // namespace ddp::detail
