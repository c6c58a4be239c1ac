// Worker environment: the variables ddprun gives each worker (torchrun's names and values) and
// their merge into the launcher's own environment. Pure functions over values: thread-safe.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "launcher_options.h"

namespace ddprun {

using EnvVars = std::vector<std::pair<std::string, std::string>>;

// Which of the settings ddprun would choose for its workers the user has already made in
// ddprun's own environment: those are left to the user.
struct UserSettings {
  bool omp_num_threads = false;  // OMP_NUM_THREADS is set
  bool malloc_tuning = false;    // GLIBC_TUNABLES or one of glibc's MALLOC_*_ variables is set
};

// Reads UserSettings from `environment` (a NULL-terminated "NAME=VALUE" array).
UserSettings UserSettingsFrom(const char* const* environment);

// What ddprun gives GLIBC_TUNABLES: glibc's allocator keeps up to 256 MiB of freed heap (trim
// threshold) and serves blocks below 32 MiB from the heap (mmap threshold), rather than handing
// a training step's freed activations back to the kernel and faulting them in again next step.
inline constexpr const char* kWorkerGlibcTunables =
    "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=268435456";

// Global rank of local worker `local_rank` on this node.
int GlobalRank(const LauncherOptions& options, int local_rank);

// The variables added for one worker. OMP_NUM_THREADS (`online_cores` divided among the workers)
// and GLIBC_TUNABLES (kWorkerGlibcTunables) are included only where `user` has not set them.
EnvVars WorkerVariables(const LauncherOptions& options, int local_rank, int restart_count,
                        int online_cores, const UserSettings& user);

// `base` (a NULL-terminated "NAME=VALUE" array such as environ) with `overrides` replacing or
// adding variables, as "NAME=VALUE" strings ready for execve.
std::vector<std::string> MergeEnvironment(const char* const* base, const EnvVars& overrides);

}  // namespace ddprun
