// The timeline: an opt-in Chrome-trace / Perfetto record of where this rank's time goes.
//
// When InitOptions().timeline_path or DDP_CPP_TIMELINE names a folder, init_process_group opens
// and starts it (open_timeline, start_timeline) and this rank writes
// <folder>/timeline_rank<R>.json, in the Chrome trace "JSON array" format, one event per line:
// ui.perfetto.dev and chrome://tracing open it, and ddprun merges the ranks' files into
// <folder>/timeline.json (tools/ddprun/timeline_merge.h). It holds:
//   - every collective that the flight recorder sees (a nestable async event per collective, from
//     queued to finished, with a nested "running" from started to finished), per group;
//   - DDP's forward (on the calling thread), backward (on the autograd thread, from its first
//     gradient hook to the end of the reducer's work), the wait for the buckets at the end of
//     backward, and per bucket, on a row of its own ("DDP bucket K"), "ready" when its last
//     gradient arrived and its all-reduce from launch to done;
//   - checkpoint saves, and the user's marks (ddp::timeline::mark, include/ddp/timeline.h).
// Time stamps are microseconds of the system clock plus the offset that init_process_group
// measured from this rank's clock to rank 0's through the store (measure_clock_offset), so the
// ranks' files line up, across hosts too. Events wait in memory and are appended to the file in
// batches, and when the timeline stops (destroy_process_group, or the process's exit); a process
// killed before that leaves its file without the last batch and without the closing bracket,
// which both viewers and ddprun accept.
//
// Cost: nothing but an atomic load per hook while it is off; while on, a clock read per point and
// a short lock per event. Thread-safety: every function may be called from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "ddp/timeline.h"
#include "trace/system_clock.h"

namespace c10d {
class Store;
}

namespace ddp::detail {

struct TraceEntry;

extern std::atomic<bool> timeline_enabled;

inline bool timeline_on() { return timeline_enabled.load(std::memory_order_relaxed); }

/// Microseconds since the epoch on this rank's system clock (what the timeline's events take).
inline int64_t timeline_now_us() { return system_clock_us(); }

/// Makes <dir>/timeline_rank<rank>.json (replacing one left there), before the rendezvous, so
/// that a folder that cannot be written fails init_process_group at once, on the rank that has
/// it. Throws InvalidArgumentError then. Records nothing until start_timeline.
void open_timeline(const std::string& dir, int rank);
/// Records from now on, every time stamp moved by `clock_offset_us` (measure_clock_offset).
void start_timeline(int64_t clock_offset_us);
/// Writes what waits and closes the file; the timeline is off afterwards (also when it never
/// started).
void stop_timeline();

/// How far rank 0's system clock is ahead of this rank's, in microseconds, measured through the
/// store: rank 0 answers each other rank in turn, a few round trips each, and the one with the
/// shortest round trip gives the offset (NTP's estimate: the answer minus the round trip's
/// midpoint). Collective over the world's ranks, each get bounded by the store's timeout; 0 on
/// rank 0.
int64_t measure_clock_offset(c10d::Store& store, int rank, int world_size);

/// A complete event on this thread's row: `name` from `start_us` to `end_us` (timeline_now_us
/// readings). `args_json`: the members of its "args" object ("\"bucket\":3"), or "".
void timeline_span(const std::string& name, const char* category, int64_t start_us, int64_t end_us,
                   const std::string& args_json = "");
/// The same on DDP bucket `bucket`'s row.
void timeline_bucket_span(int bucket, const char* name, int64_t start_us, int64_t end_us,
                          const std::string& args_json = "");
/// An instant on this thread's row (`bucket` >= 0: on that bucket's row instead).
void timeline_instant(const std::string& name, const char* category, int64_t at_us,
                      int bucket = -1);
/// A finished (completed or failed) collective of group `group`, its times in microseconds.
void timeline_collective(const TraceEntry& entry, const std::string& group);
/// Names this thread's row ("autograd"); the first name given wins.
void name_timeline_thread(const char* name);

/// A complete event on this thread from construction to destruction (nothing while off): the
/// user's ddp::timeline::Range, in the library's own `category`.
class TimelineSpan : public ddp::timeline::Range {
 public:
  TimelineSpan(const char* name, const char* category) : Range(name, category) {}
};

}  // namespace ddp::detail
