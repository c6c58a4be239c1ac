// Removes what a dead worker left in /dev/shm.
//
// ddp-cpp's shm backend unlinks its segments as soon as every rank has mapped them, so they
// outlive no process; but a worker killed in the short window between creating a segment and
// unlinking it leaves it behind. Segment names end in ".p<creator pid>" (see
// src/process_group/shm/shm_segment.h), so after reaping a worker ddprun removes the ddp-cpp
// segments that worker created. Thread-compatible (no state).
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace ddprun {

// Unlinks /dev/shm/ddp-cpp.*.p<pid> (under `directory`, for tests); returns the names removed.
std::vector<std::string> RemoveSegmentsOfWorker(pid_t pid,
                                                const std::string& directory = "/dev/shm");

}  // namespace ddprun
