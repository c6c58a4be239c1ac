// ddp::timeline: the user's own marks and ranges on this rank's timeline.
//
// The timeline is opt-in: InitOptions().timeline_path(folder) or DDP_CPP_TIMELINE=folder makes each
// rank write <folder>/timeline_rank<R>.json (Chrome trace / Perfetto JSON: its collectives, DDP's
// forward, backward and buckets, checkpoint saves), which ddprun merges into
// <folder>/timeline.json, one process per rank, time-aligned. These calls add the program's own
// events to it, on the calling thread's row; while the timeline is off they cost an atomic load and
// do nothing.
//
//   for (int step = 0; step < steps; ++step) {
//     ddp::timeline::mark("step " + std::to_string(step));
//     ddp::timeline::Range data("load batch");
//     ...
//   }
//
// Thread-safety: any thread may call them.
#pragma once

#include <cstdint>
#include <string>

namespace ddp::timeline {

/// True while this rank writes a timeline.
bool enabled();

/// An instant named `name`, now.
void mark(const std::string& name);

/// A span named `name` from construction to destruction.
class Range {
 public:
  explicit Range(std::string name);
  ~Range();
  Range(const Range&) = delete;
  Range& operator=(const Range&) = delete;

 protected:
  /// The library's own spans (a checkpoint save): `category` instead of "user", a string that
  /// outlives the range.
  Range(std::string name, const char* category);

 private:
  std::string name_;
  const char* category_;
  int64_t start_us_;  // -1: the timeline was off
};

}  // namespace ddp::timeline
