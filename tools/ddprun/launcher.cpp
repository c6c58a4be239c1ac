#include "launcher.h"

#include <unistd.h>

#include <cstdlib>
#include <exception>
#include <memory>
#include <string_view>

#include "attempt_traces.h"
#include "exit_status.h"
#include "fd_io.h"
#include "shm_cleanup.h"
#include "timeline_merge.h"
#include "worker_env.h"

extern char** environ;

namespace ddprun {

std::string DescribeFailure(const GroupResult& result) {
  return "rank " + std::to_string(result.failed_rank) + ": " +
         DescribeWaitStatus(result.failed_status);
}

std::string RestartMessage(const GroupResult& result, int attempt, int max_restarts) {
  return "ddprun: worker group failed (" + DescribeFailure(result) + "), restarting (attempt " +
         std::to_string(attempt) + " of " + std::to_string(max_restarts) + ")\n";
}

std::string FailureSummary(const GroupResult& result, int attempts) {
  std::string rank = std::to_string(result.failed_rank);
  std::string text = "ddprun: error: worker group failed (" + std::to_string(attempts) +
                     (attempts == 1 ? " attempt" : " attempts") + ")\n";
  text += "ddprun:   first failure: rank " + rank + " (local rank " +
          std::to_string(result.failed_local_rank) + ", pid " + std::to_string(result.failed_pid) +
          "): " + DescribeWaitStatus(result.failed_status) + "\n";
  if (result.failed_stderr_tail.empty()) {
    text += "ddprun:   rank " + rank + " wrote nothing to stderr\n";
    return text;
  }
  text += "ddprun:   last lines of rank " + rank + "'s stderr:\n";
  for (const std::string& line : result.failed_stderr_tail) text += "ddprun:     " + line + "\n";
  return text;
}

int RunLauncher(const LauncherOptions& options, int online_cores) {
  // The workers get the rest of the environment unchanged; only these are decision inputs.
  const UserSettings user = UserSettingsFrom(environ);
  GroupSettings settings;
  settings.command = options.command;
  settings.monitor_interval_s = options.monitor_interval_s;
  settings.stop_grace_s = options.stop_grace_s;
  // A terminal that understands cursor movement: not a pipe, not TERM=dumb (editors' shells).
  const char* term = std::getenv("TERM");
  settings.terminal = isatty(STDOUT_FILENO) != 0 && term != nullptr && *term != '\0' &&
                      std::string_view(term) != "dumb";

  std::unique_ptr<SignalRelay> relay;
  try {
    relay = std::make_unique<SignalRelay>();
  } catch (const std::exception& error) {
    WriteAll(STDERR_FILENO, std::string("ddprun: error: ") + error.what() + "\n");
    return kLauncherErrorExitCode;
  }

  const char* user_trace_dir = std::getenv("DDP_CPP_TRACE_DIR");
  const char* timeline_dir = std::getenv("DDP_CPP_TIMELINE");
  AttemptTraces traces(options, user_trace_dir ? user_trace_dir : "");
  for (int restart_count = 0;; ++restart_count) {
    std::string trace_error;
    const std::string trace_dir = traces.Begin(restart_count, &trace_error);
    if (!trace_error.empty()) WriteAll(STDERR_FILENO, "ddprun: warning: " + trace_error + "\n");
    std::vector<WorkerLaunch> launches;
    for (int local_rank = 0; local_rank < options.nproc_per_node; ++local_rank) {
      EnvVars vars = WorkerVariables(options, local_rank, restart_count, online_cores, user);
      if (traces.ChosenByDdprun() && !trace_dir.empty()) {
        vars.emplace_back("DDP_CPP_TRACE_DIR", trace_dir);
      }
      // The workers' stdout is a pipe: this tells them that their lines reach a terminal, where
      // a progress bar redrawn with "\r" stays in place (see TerminalStatus).
      vars.emplace_back("DDPRUN_STDOUT_TTY", settings.terminal ? "1" : "0");
      launches.push_back(
          {GlobalRank(options, local_rank), local_rank, MergeEnvironment(environ, vars)});
    }
    settings.trace_dir = trace_dir;
    GroupResult result = RunWorkerGroup(settings, launches, *relay);
    RemoveSegmentsOfDeadCreators(options.run_id, restart_count);
    WriteAll(STDERR_FILENO, traces.End(result.kind == GroupResult::Kind::kSucceeded));
    // The workers' timelines (DDP_CPP_TIMELINE, inherited from ddprun), one trace per attempt.
    if (timeline_dir && *timeline_dir)
      WriteAll(STDERR_FILENO, MergeTimeline(timeline_dir).Summary());
    switch (result.kind) {
      case GroupResult::Kind::kSucceeded:
        return 0;
      case GroupResult::Kind::kInterrupted:
        WriteAll(STDERR_FILENO, "ddprun: received " + SignalName(result.interrupt_signal) +
                                    ", stopped the workers\n");
        return 128 + result.interrupt_signal;
      case GroupResult::Kind::kLauncherError:
        WriteAll(STDERR_FILENO, "ddprun: error: " + result.launcher_error + "\n");
        return kLauncherErrorExitCode;
      case GroupResult::Kind::kWorkerFailed:
        if (restart_count < options.max_restarts) {
          WriteAll(STDERR_FILENO, RestartMessage(result, restart_count + 1, options.max_restarts));
          continue;
        }
        WriteAll(STDERR_FILENO, FailureSummary(result, restart_count + 1));
        return ExitCodeForWaitStatus(result.failed_status);
    }
  }
}

}  // namespace ddprun
