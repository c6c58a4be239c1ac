// The launcher proper: runs the worker group of this node, restarts it up to --max-restarts
// times after a failure, and turns the outcome into ddprun's messages and exit code. The
// message builders are pure (thread-safe); RunLauncher owns the process's children and signal
// handling, so it runs once, on the main thread.
#pragma once

#include <string>

#include "launcher_options.h"
#include "worker_group.h"

namespace ddprun {

// Exit code when ddprun itself fails (fork, signal set-up, port selection).
constexpr int kLauncherErrorExitCode = 1;

// Runs `options` (with the port already chosen for --standalone) and returns ddprun's exit code.
int RunLauncher(const LauncherOptions& options, int online_cores);

// "rank 1: exit code 3" for the failure recorded in `result`.
std::string DescribeFailure(const GroupResult& result);

// The line announcing a restart, with its newline.
std::string RestartMessage(const GroupResult& result, int attempt, int max_restarts);

// The multi-line summary printed when the group failed for good (`attempts` were made).
std::string FailureSummary(const GroupResult& result, int attempts);

}  // namespace ddprun
