// LauncherOptions holds the settings of one ddprun invocation; ParseLauncherOptions builds it
// from the command line (torchrun's flag names, dash or underscore spellings, `--flag=value` or
// `--flag value`) and from torchrun's PET_<FLAG> environment fallbacks, the command line winning.
// Parsing is a pure function of its arguments (the environment is read only through the lookup
// passed in, the host only through HostResources), so it is as thread-safe as the GPU counter
// passed in; the structs are plain values.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "gpu_count.h"

namespace ddprun {

struct LauncherOptions {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  bool standalone = false;
  int max_restarts = 0;
  double monitor_interval_s = 0.1;
  std::string run_id = "none";
  std::string role = "default";
  // Time between SIGTERM and SIGKILL when workers are stopped.
  double stop_grace_s = 5.0;
  // Where each attempt's folder of flight records goes (torchrun's --log-dir); "": a fresh folder
  // under TMPDIR (or /tmp) named after the run id.
  std::string log_dir;
  // PROGRAM followed by its arguments, untouched.
  std::vector<std::string> command;
};

struct ParseResult {
  enum class Action { kRun, kHelp, kError };
  Action action = Action::kError;
  LauncherOptions options;
  // For kError: the message, without the "ddprun: error: " prefix.
  std::string error;
};

// Returns the value of an environment variable, or nullopt when it is not set.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

// EnvLookup over the real process environment (getenv).
std::optional<std::string> LookupProcessEnv(const std::string& name);

// What `--nproc-per-node cpu|gpu|auto` resolve to, passed in so that tests can describe any host.
struct HostResources {
  int online_cores = 1;
  // Counts the GPUs that the workers would see (ddprun passes CountVisibleGpus). Called only for
  // `gpu` and `auto`, at most once per parse: counting forks a process that loads the driver.
  std::function<GpuCount()> count_gpus;
};

// `args` excludes argv[0].
ParseResult ParseLauncherOptions(const std::vector<std::string>& args, const EnvLookup& env,
                                 const HostResources& host);

// The --help text.
std::string UsageText();

// Exit code for command line errors (argparse's).
constexpr int kUsageErrorExitCode = 2;

}  // namespace ddprun
