// Removes what dead workers left in /dev/shm.
//
// ddp-cpp's shm backend unlinks its segments as soon as every rank has mapped them, so they
// outlive no process; but a rank killed in the short window between creating a segment and
// unlinking it leaves it behind. Segment names carry the job, the attempt and the creator's pid
// (src/process_group/shm/segment_ownership.h), so ddprun removes
//   - after reaping a worker, the segments that worker created;
//   - after each attempt of the group, the segments of that attempt of its job whose creator is
//     gone: those of a rank that was not itself a worker but ran under one (`ddprun sh -c
//     './train'`, a wrapper script, a Python launcher) and died before its wrapper did.
// A segment whose creator still runs is never touched. Thread-compatible (no state).
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace ddprun {

// Unlinks /dev/shm/ddp-cpp.*.p<pid> (under `directory`, for tests); returns the names removed.
std::vector<std::string> RemoveSegmentsOfWorker(pid_t pid,
                                                const std::string& directory = "/dev/shm");

// Unlinks the segments of attempt `attempt` of job `run_id` (TORCHELASTIC_RUN_ID and
// TORCHELASTIC_RESTART_COUNT as the workers saw them) whose creator process is gone (or a
// zombie); returns the names removed.
std::vector<std::string> RemoveSegmentsOfDeadCreators(const std::string& run_id, int attempt,
                                                      const std::string& directory = "/dev/shm");

}  // namespace ddprun
