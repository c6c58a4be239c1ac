// Worker environment: the variables ddprun gives each worker (torchrun's names and values) and
// their merge into the launcher's own environment. Pure functions over values: thread-safe.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "launcher_options.h"

namespace ddprun {

using EnvVars = std::vector<std::pair<std::string, std::string>>;

// Global rank of local worker `local_rank` on this node.
int GlobalRank(const LauncherOptions& options, int local_rank);

// The variables added for one worker. OMP_NUM_THREADS is included only when ddprun's own
// environment does not set it (`omp_num_threads_set`); `online_cores` is divided among workers.
EnvVars WorkerVariables(const LauncherOptions& options, int local_rank, int restart_count,
                        int online_cores, bool omp_num_threads_set);

// `base` (a NULL-terminated "NAME=VALUE" array such as environ) with `overrides` replacing or
// adding variables, as "NAME=VALUE" strings ready for execve.
std::vector<std::string> MergeEnvironment(const char* const* base, const EnvVars& overrides);

}  // namespace ddprun
