#include "launcher_options.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>

namespace ddprun {
namespace {

// Upper bound on workers per node: far above any real machine, low enough that a typo such as
// `--nproc-per-node 1000000` is rejected instead of fork-bombing the host.
constexpr long long kMaxNprocPerNode = 1 << 16;

struct ParseContext {
  LauncherOptions& options;
  const EnvLookup& env;
  const HostResources& host;
  std::optional<GpuCount> gpus;  // Counted when first needed.

  const GpuCount& Gpus() {
    if (!gpus) {
      gpus = host.count_gpus ? host.count_gpus()
                             : GpuCount{0, "GPUs were not counted (no counter given)"};
    }
    return *gpus;
  }
};

// A setter stores `value` and returns "", or returns what would have been accepted.
using Setter = std::function<std::string(const std::string& value, ParseContext& ctx)>;

struct OptionSpec {
  const char* name;  // Canonical spelling without the leading "--".
  bool takes_value;
  const char* env_name;
  Setter set;
};

bool ParseInt(const std::string& text, long long min, long long max, int* out) {
  long long value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end || value < min || value > max) return false;
  *out = static_cast<int>(value);
  return true;
}

bool ParseSeconds(const std::string& text, bool allow_zero, double* out) {
  if (text.empty()) return false;
  char* end = nullptr;
  double value = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size() || !std::isfinite(value)) return false;
  if (value < 0 || (!allow_zero && value == 0)) return false;
  *out = value;
  return true;
}

// Flags take their value from the environment as torchrun's `check_env` does: an integer, and
// non-zero means set. On the command line a bare `--flag` arrives here as "1".
bool ParseFlag(const std::string& text, bool* out) {
  int value = 0;
  if (!ParseInt(text, std::numeric_limits<int>::min(), std::numeric_limits<int>::max(), &value)) {
    return false;
  }
  *out = value != 0;
  return true;
}

std::string SetIntOption(const std::string& value, long long min, long long max, int* target,
                         const char* accepted) {
  return ParseInt(value, min, max, target) ? "" : accepted;
}

std::string SetNonEmpty(const std::string& value, std::string* target, const char* accepted) {
  if (value.empty()) return accepted;
  *target = value;
  return "";
}

std::string SetNnodes(const std::string& value, int* target) {
  constexpr const char* kAccepted = "expected a positive integer N, or N:N";
  auto colon = value.find(':');
  if (colon == std::string::npos) return SetIntOption(value, 1, 1 << 20, target, kAccepted);
  int min = 0;
  int max = 0;
  if (!ParseInt(value.substr(0, colon), 1, 1 << 20, &min) ||
      !ParseInt(value.substr(colon + 1), 1, 1 << 20, &max)) {
    return kAccepted;
  }
  if (min != max) {
    return "elastic ranges are not supported: MIN:MAX is accepted only when MIN == MAX";
  }
  *target = min;
  return "";
}

// torchrun's values: `cpu` is one worker per online core, `gpu` one per visible GPU (an error
// when there is none, as in torchrun: a GPU job started on CPUs would fail later, or crawl), and
// `auto` GPUs when there are some, else cores.
std::string SetNprocPerNode(const std::string& value, ParseContext& ctx) {
  int& target = ctx.options.nproc_per_node;
  const int cores = std::max(1, ctx.host.online_cores);
  if (value == "cpu") {
    target = cores;
    return "";
  }
  if (value != "gpu" && value != "auto") {
    return SetIntOption(value, 1, kMaxNprocPerNode, &target,
                        "expected a positive integer, 'gpu', 'cpu' or 'auto'");
  }
  const GpuCount& gpus = ctx.Gpus();
  if (gpus.count > 0) {
    target = static_cast<int>(std::min<long long>(gpus.count, kMaxNprocPerNode));
    return "";
  }
  if (value == "auto") {
    target = cores;
    return "";
  }
  std::string message = "no GPU visible: " + gpus.why_none;
  // The driver counts only the devices it lists, so an empty or mistyped list looks like none.
  if (std::optional<std::string> visible = ctx.env("CUDA_VISIBLE_DEVICES")) {
    message += "; CUDA_VISIBLE_DEVICES is '" + *visible + "'";
  }
  return message + "; use 'cpu' (one worker per core) or a number of workers instead";
}

const std::vector<OptionSpec>& Options() {
  static const std::vector<OptionSpec> specs = {
      {"nproc-per-node", true, "PET_NPROC_PER_NODE",
       [](const std::string& v, ParseContext& c) { return SetNprocPerNode(v, c); }},
      {"nnodes", true, "PET_NNODES",
       [](const std::string& v, ParseContext& c) { return SetNnodes(v, &c.options.nnodes); }},
      {"node-rank", true, "PET_NODE_RANK",
       [](const std::string& v, ParseContext& c) {
         return SetIntOption(v, 0, std::numeric_limits<int>::max(), &c.options.node_rank,
                             "expected an integer R with 0 <= R < nnodes");
       }},
      {"master-addr", true, "PET_MASTER_ADDR",
       [](const std::string& v, ParseContext& c) {
         return SetNonEmpty(v, &c.options.master_addr, "expected a non-empty host name or address");
       }},
      {"master-port", true, "PET_MASTER_PORT",
       [](const std::string& v, ParseContext& c) {
         return SetIntOption(v, 1, 65535, &c.options.master_port,
                             "expected a port number in 1..65535");
       }},
      {"standalone", false, "PET_STANDALONE",
       [](const std::string& v, ParseContext& c) -> std::string {
         return ParseFlag(v, &c.options.standalone) ? "" : "expected an integer (0 or 1)";
       }},
      {"max-restarts", true, "PET_MAX_RESTARTS",
       [](const std::string& v, ParseContext& c) {
         return SetIntOption(v, 0, std::numeric_limits<int>::max(), &c.options.max_restarts,
                             "expected a non-negative integer");
       }},
      {"monitor-interval", true, "PET_MONITOR_INTERVAL",
       [](const std::string& v, ParseContext& c) -> std::string {
         return ParseSeconds(v, false, &c.options.monitor_interval_s)
                    ? ""
                    : "expected a positive number of seconds";
       }},
      {"run-id", true, "PET_RUN_ID",
       [](const std::string& v, ParseContext& c) {
         return SetNonEmpty(v, &c.options.run_id, "expected a non-empty string");
       }},
      {"role", true, "PET_ROLE",
       [](const std::string& v, ParseContext& c) {
         return SetNonEmpty(v, &c.options.role, "expected a non-empty string");
       }},
      {"stop-grace", true, "PET_STOP_GRACE",
       [](const std::string& v, ParseContext& c) -> std::string {
         return ParseSeconds(v, true, &c.options.stop_grace_s)
                    ? ""
                    : "expected a non-negative number of seconds";
       }},
      {"log-dir", true, "PET_LOG_DIR",
       [](const std::string& v, ParseContext& c) {
         return SetNonEmpty(v, &c.options.log_dir, "expected a non-empty folder name");
       }},
      // ddprun always runs PROGRAM directly, which is what torchrun's --no-python asks for;
      // accepting it keeps torchrun command lines working unchanged.
      {"no-python", false, "PET_NO_PYTHON",
       [](const std::string& v, ParseContext&) -> std::string {
         bool ignored = false;
         return ParseFlag(v, &ignored) ? "" : "expected an integer (0 or 1)";
       }},
  };
  return specs;
}

const OptionSpec* FindOption(std::string name) {
  for (char& ch : name) {
    if (ch == '_') ch = '-';
  }
  for (const OptionSpec& spec : Options()) {
    if (name == spec.name) return &spec;
  }
  return nullptr;
}

ParseResult Error(std::string message) {
  ParseResult result;
  result.action = ParseResult::Action::kError;
  result.error = std::move(message);
  return result;
}

std::string InvalidValue(const std::string& what, const std::string& value,
                         const std::string& accepted) {
  return what + ": invalid value '" + value + "' (" + accepted + ")";
}

struct CommandLineOption {
  const OptionSpec* spec;
  std::string spelling;  // As typed, for error messages.
  std::string value;
};

}  // namespace

std::optional<std::string> LookupProcessEnv(const std::string& name) {
  const char* value = std::getenv(name.c_str());
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

ParseResult ParseLauncherOptions(const std::vector<std::string>& args, const EnvLookup& env,
                                 const HostResources& host) {
  // First collect the command line without applying it, so that an environment fallback is
  // only consulted (and only validated) for options the command line leaves out.
  std::vector<CommandLineOption> given;
  size_t index = 0;
  for (; index < args.size(); ++index) {
    const std::string& arg = args[index];
    if (arg == "--") {
      ++index;
      break;
    }
    if (arg == "-h" || arg == "--help") {
      ParseResult result;
      result.action = ParseResult::Action::kHelp;
      return result;
    }
    if (arg.size() < 2 || arg[0] != '-') break;  // PROGRAM ("-" alone counts as one).
    if (arg[1] != '-') return Error("unrecognized option '" + arg + "' (see ddprun --help)");

    auto equals = arg.find('=');
    std::string spelling = arg.substr(0, equals);
    const OptionSpec* spec = FindOption(spelling.substr(2));
    if (spec == nullptr) {
      return Error("unrecognized option '" + spelling + "' (see ddprun --help)");
    }
    CommandLineOption option{spec, spelling, "1"};
    if (spec->takes_value) {
      if (equals != std::string::npos) {
        option.value = arg.substr(equals + 1);
      } else if (index + 1 < args.size()) {
        option.value = args[++index];
      } else {
        return Error("argument " + spelling + ": expected a value");
      }
    } else if (equals != std::string::npos) {
      return Error("argument " + spelling + ": takes no value, got '" + arg.substr(equals + 1) +
                   "'");
    }
    given.push_back(std::move(option));
  }

  ParseResult result;
  ParseContext ctx{result.options, env, host, std::nullopt};
  for (const OptionSpec& spec : Options()) {
    bool on_command_line = false;
    for (const CommandLineOption& option : given) on_command_line |= option.spec == &spec;
    if (on_command_line) continue;
    std::optional<std::string> value = env(spec.env_name);
    if (!value) continue;
    std::string accepted = spec.set(*value, ctx);
    if (!accepted.empty()) {
      return Error(
          InvalidValue(std::string("environment variable ") + spec.env_name, *value, accepted));
    }
  }
  for (const CommandLineOption& option : given) {
    std::string accepted = option.spec->set(option.value, ctx);
    if (!accepted.empty()) {
      return Error(InvalidValue("argument " + option.spelling, option.value, accepted));
    }
  }

  LauncherOptions& options = result.options;
  if (options.standalone) {
    if (options.nnodes != 1) {
      return Error("argument --standalone: runs a single node, but --nnodes is " +
                   std::to_string(options.nnodes) + " (expected 1)");
    }
    options.master_addr = "127.0.0.1";  // The port is picked on this address at launch.
  }
  if (options.node_rank >= options.nnodes) {
    return Error(
        InvalidValue("argument --node-rank", std::to_string(options.node_rank),
                     "expected 0 <= R < nnodes, and nnodes is " + std::to_string(options.nnodes)));
  }
  options.command.assign(args.begin() + static_cast<std::ptrdiff_t>(index), args.end());
  if (options.command.empty()) {
    return Error("missing PROGRAM to run (usage: ddprun [options] PROGRAM [ARGS...])");
  }
  result.action = ParseResult::Action::kRun;
  return result;
}

}  // namespace ddprun
