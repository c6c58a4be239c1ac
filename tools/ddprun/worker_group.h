// RunWorkerGroup runs one attempt of the workers of this node: it forks them (each in its own
// process group, killed by the kernel if ddprun dies), relays their stdout and stderr line by
// line with a "[rank]: " prefix, and supervises them until every one has been reaped. When a
// worker fails, or ddprun receives SIGINT/SIGTERM/SIGHUP, the others are stopped: the signal
// (SIGTERM for a failure) goes to their process groups, then SIGKILL after the grace period.
// Restarting is the caller's business. Single-threaded: call from the thread that owns the
// SignalRelay, one group at a time (it reaps its children by pid with waitpid).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <string>
#include <vector>

#include "signal_relay.h"

namespace ddprun {

struct WorkerLaunch {
  int rank = 0;
  int local_rank = 0;
  std::vector<std::string> env;  // Complete environment, "NAME=VALUE".
};

struct GroupSettings {
  std::vector<std::string> command;  // PROGRAM and ARGS; PROGRAM is looked up in PATH.
  double monitor_interval_s = 0.1;
  double stop_grace_s = 5.0;
  size_t stderr_tail_lines = 20;
  int stdout_fd = 1;
  int stderr_fd = 2;
  // stdout_fd is a terminal: the workers' live lines (bars redrawn with "\r") are kept at its
  // bottom, below their other lines (TerminalStatus).
  bool terminal = false;
  // The workers' DDP_CPP_TRACE_DIR ("" : none). When a worker fails, the others that have not
  // written their flight record there (rank<R>.json) and catch SIGUSR1 (as the library does where
  // it has a trace folder) are asked for it with SIGUSR1, and stopped once each has written it or
  // exited, or after record_wait_s: so that the diagnosis also knows what the ranks still running
  // were doing. Workers that do not catch SIGUSR1 are stopped as before.
  std::string trace_dir;
  double record_wait_s = 2.0;
};

struct GroupResult {
  enum class Kind {
    kSucceeded,      // Every worker exited 0.
    kWorkerFailed,   // A worker exited non-zero or died by a signal; the rest were stopped.
    kInterrupted,    // ddprun got a stop signal and forwarded it; workers were waited for.
    kLauncherError,  // ddprun itself failed (e.g. fork); the workers started were stopped.
  };
  Kind kind = Kind::kSucceeded;

  // The first worker that failed, when one did (any kind but kSucceeded may have one).
  bool has_failure = false;
  int failed_rank = -1;
  int failed_local_rank = -1;
  pid_t failed_pid = -1;
  int failed_status = 0;  // As from waitpid().
  std::vector<std::string> failed_stderr_tail;

  int interrupt_signal = 0;    // kInterrupted: the first stop signal received.
  std::string launcher_error;  // kLauncherError.
};

GroupResult RunWorkerGroup(const GroupSettings& settings, const std::vector<WorkerLaunch>& workers,
                           SignalRelay& relay);

}  // namespace ddprun
