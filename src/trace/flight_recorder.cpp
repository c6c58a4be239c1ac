#include "trace/flight_recorder.h"

#include <c10/util/Exception.h>
#if defined(__x86_64__)
#include <x86intrin.h>
#endif

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>

#include "common/error_context.h"
#include "trace/system_clock.h"
#include "trace/timeline.h"

namespace ddp::detail {
namespace {

thread_local const char* tls_label = nullptr;
thread_local TraceSlot* tls_active_slot = nullptr;

constexpr size_t kDefaultTraceBuffer = 2000;

// Time stamps: a collective takes three. A read of the system clock costs about 40 ns on this
// project's VMs and the TSC's about 14: the difference is a good part of what the recorder adds to
// an 8-byte shm all_reduce. Where the kernel keeps time with the TSC itself (clocksource "tsc":
// invariant, and the same on every core), entries hold TSC ticks, turned into microseconds since
// the epoch when read, by the rate seen between the first reading and the conversion; elsewhere
// they hold the system clock's microseconds.
class TraceClock {
 public:
  static const TraceClock& instance() {
    static const TraceClock clock;
    return clock;
  }

  int64_t now() const {
#if defined(__x86_64__)
    if (tsc_) return static_cast<int64_t>(__rdtsc());
#endif
    return system_clock_us();
  }

  // Turns ticks of now() into microseconds since the epoch; 0 (never) stays 0.
  class Converter {
   public:
    int64_t operator()(int64_t ticks) const {
      if (ticks == 0 || ticks_per_us_ <= 0) return ticks;
      return wall0_ + static_cast<int64_t>(static_cast<double>(ticks - tsc0_) / ticks_per_us_);
    }

   private:
    friend class TraceClock;
    double ticks_per_us_ = 0;  // 0: ticks are microseconds already
    int64_t tsc0_ = 0;
    int64_t wall0_ = 0;
  };

  Converter converter() const {
    Converter convert;
    if (!tsc_) return convert;
    int64_t tsc_now = 0, wall_now = 0;
    // A rate measured over at least a millisecond: within a microsecond over the records' span.
    do {
      tsc_now = now();
      wall_now = system_clock_us();
    } while (wall_now - wall0_ < 1000 && wall_now >= wall0_);
    if (wall_now <= wall0_) return convert;  // the system clock went back: raw ticks
    convert.ticks_per_us_ =
        static_cast<double>(tsc_now - tsc0_) / static_cast<double>(wall_now - wall0_);
    convert.tsc0_ = tsc0_;
    convert.wall0_ = wall0_;
    return convert;
  }

 private:
  TraceClock() {
#if defined(__x86_64__)
    std::ifstream source("/sys/devices/system/clocksource/clocksource0/current_clocksource");
    std::string name;
    tsc_ = (source >> name) && name == "tsc";
#endif
    tsc0_ = now();
    wall0_ = system_clock_us();
  }

  bool tsc_ = false;
  int64_t tsc0_ = 0;
  int64_t wall0_ = 0;
};

int64_t now_ticks() { return TraceClock::instance().now(); }

// Copies into a fixed field, cut to fit: a name is for reading, and no call allocates for it.
template <size_t N>
void copy_name(char (&field)[N], const std::string& text) {
  const size_t length = std::min(text.size(), N - 1);
  std::memcpy(field, text.data(), length);
  field[length] = '\0';
}

}  // namespace

const char* to_string(TraceState state) {
  switch (state) {
    case TraceState::kQueued:
      return "queued";
    case TraceState::kStarted:
      return "started";
    case TraceState::kCompleted:
      return "completed";
    case TraceState::kFailed:
      return "failed";
  }
  return "?";
}

const char* to_string(TraceFailure failure) {
  switch (failure) {
    case TraceFailure::kNone:
      return "";
    case TraceFailure::kTimeout:
      return "TimeoutError";
    case TraceFailure::kPeerLost:
      return "PeerLostError";
    case TraceFailure::kMismatch:
      return "MismatchError";
    case TraceFailure::kOther:
      return "other";
  }
  return "?";
}

FlightRecorder::FlightRecorder(size_t capacity, std::string group_name,
                               std::vector<int> global_ranks, int global_rank)
    : ring_(capacity),
      group_name_(std::move(group_name)),
      global_ranks_(std::move(global_ranks)),
      global_rank_(global_rank) {
  TORCH_INTERNAL_ASSERT(capacity > 0, "a flight recorder needs room for one entry");
  TraceClock::instance();  // its first reading starts the span that its rate is measured over
}

uint64_t FlightRecorder::open(const std::string& operation, const char* call) {
  const int64_t queued = now_ticks();
  std::lock_guard<RingLock> lock(mutex_);
  const uint64_t sequence = next_sequence_++;
  TraceEntry& entry = ring_[sequence % ring_.size()];
  entry = TraceEntry();
  entry.sequence = sequence;
  copy_name(entry.operation, operation);
  entry.call = call;
  entry.queued_us = queued;
  return sequence;
}

TraceEntry* FlightRecorder::find_described(const TraceSlot& slot) {
  TraceEntry& entry = ring_[slot.sequence % ring_.size()];
  if (entry.sequence != slot.sequence) return nullptr;
  if (slot.changed) {
    if (slot.tensor.dtype >= 0) {
      entry.dtype = slot.tensor.dtype;
      entry.dims = slot.tensor.dims;
      entry.numel = slot.tensor.numel;
      std::memcpy(entry.sizes, slot.tensor.sizes, sizeof entry.sizes);
    }
    entry.backend = slot.backend;
  }
  return &entry;
}

void FlightRecorder::describe(TraceSlot& slot) {
  std::lock_guard<RingLock> lock(mutex_);
  find_described(slot);
  slot.changed = false;
}

void FlightRecorder::mark_started(TraceSlot& slot) {
  if (slot.started) return;
  slot.started = true;
  const int64_t started = now_ticks();
  std::lock_guard<RingLock> lock(mutex_);
  TraceEntry* entry = find_described(slot);
  slot.changed = false;
  if (entry && entry->state == TraceState::kQueued) {
    entry->state = TraceState::kStarted;
    entry->started_us = started;
  }
}

void FlightRecorder::mark_completed(const TraceSlot& slot) {
  const int64_t finished = now_ticks();
  std::unique_lock<RingLock> lock(mutex_);
  TraceEntry* entry = find_described(slot);
  if (entry && entry->state != TraceState::kFailed) {
    entry->state = TraceState::kCompleted;
    entry->finished_us = finished;
    if (timeline_on()) show_on_timeline(*entry, lock);
  }
}

void FlightRecorder::show_on_timeline(const TraceEntry& entry, std::unique_lock<RingLock>& lock) {
  TraceEntry shown = entry;
  lock.unlock();
  const TraceClock::Converter to_us = TraceClock::instance().converter();
  shown.queued_us = to_us(shown.queued_us);
  shown.started_us = to_us(shown.started_us);
  shown.finished_us = to_us(shown.finished_us);
  timeline_collective(shown, group_name_);
}

void FlightRecorder::mark_failed(const TraceSlot& slot, TraceFailure failure) {
  const int64_t finished = now_ticks();
  std::unique_lock<RingLock> lock(mutex_);
  TraceEntry* entry = find_described(slot);
  if (!entry) return;
  if (entry->state != TraceState::kFailed) {
    entry->state = TraceState::kFailed;
    entry->finished_us = finished;
    entry->failure = failure;
    if (timeline_on()) show_on_timeline(*entry, lock);
  } else if (entry->failure == TraceFailure::kOther || entry->failure == TraceFailure::kNone) {
    entry->failure = failure;
  }
}

TraceFailure FlightRecorder::failure_of(uint64_t sequence) const {
  std::lock_guard<RingLock> lock(mutex_);
  const TraceEntry& entry = ring_[sequence % ring_.size()];
  if (entry.sequence != sequence || entry.state != TraceState::kFailed) return TraceFailure::kNone;
  return entry.failure;
}

std::vector<TraceEntry> FlightRecorder::entries() const {
  std::unique_lock<RingLock> lock(mutex_);
  std::vector<TraceEntry> held;
  held.reserve(ring_.size());
  const uint64_t count = next_sequence_ - 1;
  const uint64_t first = count > ring_.size() ? count - ring_.size() + 1 : 1;
  for (uint64_t sequence = first; sequence <= count; ++sequence) {
    held.push_back(ring_[sequence % ring_.size()]);
  }
  lock.unlock();
  const TraceClock::Converter to_us = TraceClock::instance().converter();
  for (TraceEntry& entry : held) {
    entry.queued_us = to_us(entry.queued_us);
    entry.started_us = to_us(entry.started_us);
    entry.finished_us = to_us(entry.finished_us);
  }
  return held;
}

const char* lasting_backend_name(const std::string& backend) {
  // The backends' names, then any other (a backend added later) kept for the process.
  for (const char* known : {"shm", "gloo", "hierarchical", "nccl"}) {
    if (backend == known) return known;
  }
  static std::mutex mutex;
  static std::deque<std::string> others;  // never shrinks: entries point into it
  std::lock_guard<std::mutex> lock(mutex);
  auto found = std::find(others.begin(), others.end(), backend);
  return (found != others.end() ? *found : others.emplace_back(backend)).c_str();
}

TraceLabel::TraceLabel(const char* call) : previous_(tls_label) { tls_label = call; }

TraceLabel::~TraceLabel() { tls_label = previous_; }

const char* TraceLabel::current() { return tls_label; }

ActiveTraceScope::ActiveTraceScope(TraceSlot* slot) : previous_(tls_active_slot) {
  tls_active_slot = slot;
}

ActiveTraceScope::~ActiveTraceScope() { tls_active_slot = previous_; }

TraceSlot* ActiveTraceScope::current() { return tls_active_slot; }

size_t resolve_trace_buffer(int64_t option, const char* env_value) {
  if (option < -1) {
    fail<InvalidArgumentError>("init_process_group",
                               "trace_buffer must be 0 (off), a number of entries, or -1 (from "
                               "DDP_CPP_TRACE_BUFFER); got " +
                                   std::to_string(option));
  }
  if (option >= 0) return static_cast<size_t>(option);
  if (env_value == nullptr || *env_value == '\0') return kDefaultTraceBuffer;
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(env_value, &end, 10);
  if (errno != 0 || *end != '\0' || value < 0) {
    fail<InvalidArgumentError>("init_process_group",
                               std::string("DDP_CPP_TRACE_BUFFER must be a number of entries (0 "
                                           "turns the flight recorder off); got '") +
                                   env_value + "'");
  }
  return static_cast<size_t>(value);
}

std::string resolve_trace_dir(const std::string& option, const char* env_value) {
  if (!option.empty()) return option;
  return env_value != nullptr ? std::string(env_value) : std::string();
}

}  // namespace ddp::detail
