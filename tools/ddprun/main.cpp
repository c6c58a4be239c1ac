// ddprun: a torchrun-compatible launcher for ddp-cpp programs. See `ddprun --help`.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "fd_io.h"
#include "free_port.h"
#include "gpu_count.h"
#include "launcher.h"
#include "launcher_options.h"
#include "timeline_merge.h"
#include "trace_analysis.h"

namespace {

// `--NAME DIR` (or =DIR, or with underscores) as the only option: the folder, else nullopt.
std::optional<std::string> FolderOfOnlyOption(const std::vector<std::string>& args,
                                              std::string name) {
  if (args.empty()) return std::nullopt;
  std::string underscored = name;
  std::replace(underscored.begin() + 2, underscored.end(), '-', '_');
  for (const std::string& flag : {name, underscored}) {
    if (args[0] == flag && args.size() == 2) return args[1];
    if (args.size() == 1 && args[0].rfind(flag + "=", 0) == 0)
      return args[0].substr(flag.size() + 1);
  }
  return std::nullopt;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace ddprun;
  EnsureStandardDescriptors();
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (auto folder = FolderOfOnlyOption(args, "--analyze-trace")) {
    std::string printed;
    const bool written = WriteDiagnosis(*folder, &printed);
    WriteAll(STDOUT_FILENO, printed);
    return written ? 0 : 1;
  }
  if (auto folder = FolderOfOnlyOption(args, "--merge-timeline")) {
    const MergedTimeline merged = MergeTimeline(*folder);
    WriteAll(STDOUT_FILENO, merged.Summary());
    return merged.path.empty() ? 1 : 0;
  }
  HostResources host;
  host.online_cores = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  // Still single-threaded here, as CountVisibleGpus (which forks) requires.
  host.count_gpus = [] { return CountVisibleGpus(); };
  ParseResult parsed = ParseLauncherOptions(args, LookupProcessEnv, host);
  if (parsed.action == ParseResult::Action::kHelp) {
    WriteAll(STDOUT_FILENO, UsageText());
    return 0;
  }
  if (parsed.action == ParseResult::Action::kError) {
    WriteAll(STDERR_FILENO, "ddprun: error: " + parsed.error + "\nTry 'ddprun --help'.\n");
    return kUsageErrorExitCode;
  }
  LauncherOptions& options = parsed.options;
  if (options.standalone) {
    std::string error;
    std::optional<int> port = PickFreePort(&error);
    if (!port) {
      WriteAll(STDERR_FILENO,
               "ddprun: error: --standalone: cannot pick a free port: " + error + "\n");
      return kLauncherErrorExitCode;
    }
    options.master_port = *port;
  }
  // A closed stdout (e.g. `ddprun ... | head`) must not kill the supervisor; workers get the
  // default disposition back before exec.
  signal(SIGPIPE, SIG_IGN);
  return RunLauncher(options, host.online_cores);
}
