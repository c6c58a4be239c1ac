// Merging the ranks' timelines (the library's trace/timeline.h) into one trace: what ddprun does
// after each attempt when DDP_CPP_TIMELINE is set, and `ddprun --merge-timeline DIR`.
//
// Each rank wrote DIR/timeline_rank<R>.json, one Chrome-trace event per line, process id R, its
// time stamps already moved onto rank 0's clock. The merge keeps every event that parses (a rank
// killed mid-write leaves a last line cut short, and no closing bracket: both are accepted, the
// cut line is reported), orders them by rank, row and time (an enclosing event before those it
// encloses), and writes DIR/timeline.json, {"traceEvents": [...]}, through a temporary file.
// A pure function of the folder's files but for the one it writes.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace ddprun {

struct MergedTimeline {
  std::string path;        // DIR/timeline.json, "" when nothing was written
  std::vector<int> ranks;  // whose files were read, in order
  size_t events = 0;
  std::vector<std::string> problems;  // unreadable files, lines that do not parse

  /// One line for ddprun to print: where it is, how many ranks and events, and the problems.
  std::string Summary() const;
};

/// Merges DIR's timeline_rank<R>.json files into DIR/timeline.json (none: nothing is written).
MergedTimeline MergeTimeline(const std::string& dir);

}  // namespace ddprun
