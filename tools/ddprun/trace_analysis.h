// Turning the ranks' flight records into a diagnosis: `ddprun --analyze-trace DIR`, and what
// ddprun prints when an attempt fails.
//
// Each rank that dumped left DIR/rank<R>.json (the library's trace/trace_dump.h): per group it is a
// member of, its last collectives with their group sequence numbers. Ranks that make the same
// calls give them the same numbers, so the records line up by number:
//   - per rank and group: the last sequence number it completed, and its current collective (the
//     first it has not completed: queued, started or failed) with its state;
//   - per group: the first sequence number where the ranks differ, one that some ranks entered
//     and others did not (they "never entered" it), or where they entered different collectives
//     (another operation, dtype or element count);
//   - ranks of a group that left no file ("no record": killed, stopped before they could write,
//     or on another host, whose ddprun sees only its own ranks' files).
// The analysis is a pure function of the files; the structs are plain values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ddprun {

struct TraceCall {
  int64_t seq = 0;
  std::string op;     // "all_reduce", "broadcast", ...
  std::string call;   // the public call that issued it (the op itself for the user's own)
  std::string dtype;  // "Float", "" for none
  int64_t numel = 0;
  std::string state;  // queued, started, completed, failed
  std::string error;  // TimeoutError, PeerLostError, MismatchError, other; "" when none
  std::string backend;

  /// "all_reduce #4 (Float, 4 elements)"
  std::string describe() const;
  /// Same collective: operation, dtype and element count.
  bool same_call_as(const TraceCall& other) const;
};

struct RankInGroup {
  int rank = -1;
  bool has_record = false;     // this rank's file holds the group
  int64_t last_completed = 0;  // 0: none completed (or none recorded)
  bool has_current = false;    // false: every recorded collective completed
  TraceCall current;
  std::string reason;  // why the rank dumped (its file's "reason")
};

struct GroupDiagnosis {
  std::string group;
  std::vector<int> ranks;
  std::vector<RankInGroup> members;  // in the order of `ranks`
  int64_t first_difference = 0;      // 0: the recorded ranks agree on every number they share
  TraceCall expected;                // at first_difference: what most ranks entered
  std::vector<int> entered_expected;
  std::vector<int> never_entered;  // had a record, but no entry at first_difference
  std::vector<std::pair<int, TraceCall>> entered_other;
  std::vector<int> without_record;  // members whose file is missing
};

struct Diagnosis {
  std::string dir;
  std::vector<int> ranks_read;
  std::vector<std::string> problems;  // unreadable or malformed files
  std::vector<GroupDiagnosis> groups;

  /// The diagnosis in words, a few lines per group.
  std::string Summary() const;
  /// diagnosis.json's text.
  std::string Json() const;
};

/// Reads DIR/rank*.json. A folder without records gives an empty diagnosis with a problem.
Diagnosis AnalyzeTraceDir(const std::string& dir);

/// Analyses DIR and writes DIR/diagnosis.json (temporary file, then rename); `printed` gets the
/// summary, and where the diagnosis went or why none was written. False when DIR held no records
/// or the file could not be written.
bool WriteDiagnosis(const std::string& dir, std::string* printed);

}  // namespace ddprun
