#include "rendezvous/rendezvous_spec.h"

#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <sstream>

#include "ddp/errors.h"

namespace ddp::rendezvous {
namespace {

constexpr const char* kAcceptedForms =
    "accepted forms: env:// (with MASTER_ADDR and MASTER_PORT), tcp://HOST:PORT "
    "(optionally ?rank=R&world_size=N), file:///ABSOLUTE/PATH";

[[noreturn]] void fail(const std::string& message) {
  // Before init_process_group knows the rank: every failure here is of what the caller gave.
  throw InvalidArgumentError("ddp::init_process_group: " + message, -1, "init_process_group");
}

std::optional<int> parse_int(const std::string& text) {
  if (text.empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  long value = std::strtol(text.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || value < INT32_MIN || value > INT32_MAX) return std::nullopt;
  return static_cast<int>(value);
}

int require_int(const std::string& what, const std::string& text) {
  auto value = parse_int(text);
  if (!value) fail(what + " must be an integer, got '" + text + "'");
  return *value;
}

// A rank or world size given explicitly (environment, query) must be usable: a negative one is
// invalid, not "not set" (-1 means "not set" only in InitOptions).
int require_rank(const std::string& what, const std::string& text) {
  int value = require_int(what, text);
  if (value < 0) fail(what + " must be a rank, 0 or more, got " + text);
  return value;
}

int require_world_size(const std::string& what, const std::string& text) {
  int value = require_int(what, text);
  if (value < 1) fail(what + " must be a world size, 1 or more, got " + text);
  return value;
}

int parse_port(const std::string& what, const std::string& text) {
  int port = require_int(what, text);
  if (port < 1 || port > 65535) {
    fail(what + " must be a port in 1..65535, got " + text);
  }
  return port;
}

// Splits "a?x=1&y=2" into "a" and {x: 1, y: 2}.
std::string split_query(const std::string& text, std::map<std::string, std::string>& query,
                        const std::string& init_method) {
  auto question = text.find('?');
  if (question == std::string::npos) return text;
  std::stringstream rest(text.substr(question + 1));
  std::string item;
  while (std::getline(rest, item, '&')) {
    auto equals = item.find('=');
    if (equals == std::string::npos) {
      fail("malformed query '" + item + "' in init_method '" + init_method +
           "': expected key=value; " + kAcceptedForms);
    }
    query[item.substr(0, equals)] = item.substr(equals + 1);
  }
  return text.substr(0, question);
}

void split_host_port(const std::string& address, const std::string& init_method,
                     RendezvousSpec& spec) {
  std::string host;
  std::string port;
  if (!address.empty() && address[0] == '[') {  // [::1]:29500
    auto close = address.find(']');
    if (close == std::string::npos || close + 1 >= address.size() || address[close + 1] != ':') {
      fail("malformed init_method '" + init_method + "'; " + kAcceptedForms);
    }
    host = address.substr(1, close - 1);
    port = address.substr(close + 2);
  } else {
    auto colon = address.rfind(':');
    if (colon == std::string::npos) {
      fail("init_method '" + init_method + "' has no port; " + kAcceptedForms);
    }
    host = address.substr(0, colon);
    port = address.substr(colon + 1);
  }
  if (host.empty()) fail("init_method '" + init_method + "' has no host; " + kAcceptedForms);
  spec.host = host;
  spec.port = parse_port("the port of init_method '" + init_method + "'", port);
}

// Fills rank and world size from the first source that has them.
void resolve_rank(int rank, int world_size, const std::map<std::string, std::string>& query,
                  const EnvLookup& env, RendezvousSpec& spec) {
  struct Source {
    const char* name;
    const char* rank;
    const char* size;
    const char* local_rank;
  };
  static const Source kLaunchers[] = {
      {"torchrun/ddprun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
      {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
      {"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
  };
  spec.rank = rank;
  spec.world_size = world_size;
  spec.rank_source = "options";
  if (spec.rank < 0 && query.count("rank")) {
    spec.rank = require_rank("rank in the init_method query", query.at("rank"));
    spec.rank_source = "init_method query";
  }
  if (spec.world_size < 0 && query.count("world_size")) {
    spec.world_size =
        require_world_size("world_size in the init_method query", query.at("world_size"));
  }
  for (const Source& source : kLaunchers) {
    auto env_rank = env(source.rank);
    auto env_size = env(source.size);
    if (!env_rank && !env_size) continue;
    if (spec.rank < 0) {
      if (!env_rank) {
        fail(std::string("environment variable ") + source.rank + " expected, but not set (" +
             source.size + " is set); pass InitOptions().rank(r) or set it");
      }
      spec.rank = require_rank(std::string("environment variable ") + source.rank, *env_rank);
      spec.rank_source = std::string(source.rank) + " (" + source.name + ")";
    }
    if (spec.world_size < 0) {
      if (!env_size) {
        fail(std::string("environment variable ") + source.size + " expected, but not set (" +
             source.rank + " is set); pass InitOptions().world_size(n) or set it");
      }
      spec.world_size =
          require_world_size(std::string("environment variable ") + source.size, *env_size);
    }
    if (auto local = env(source.local_rank)) {
      spec.local_rank = parse_int(*local).value_or(-1);
    }
    break;
  }
  if (spec.rank < 0) {
    fail(
        "no rank given: pass InitOptions().rank(r), or launch with ddprun/torchrun (RANK), "
        "mpirun (OMPI_COMM_WORLD_RANK) or Slurm (SLURM_PROCID); environment variable RANK "
        "expected, but not set");
  }
  if (spec.world_size < 0) {
    fail(
        "no world size given: pass InitOptions().world_size(n) or set WORLD_SIZE; environment "
        "variable WORLD_SIZE expected, but not set");
  }
  if (spec.world_size < 1) {
    fail("world_size must be at least 1, got " + std::to_string(spec.world_size));
  }
  if (spec.rank >= spec.world_size) {
    fail("rank " + std::to_string(spec.rank) + " (from " + spec.rank_source +
         ") is outside [0, world_size) = [0, " + std::to_string(spec.world_size) + ")");
  }
}

void resolve_env_address(const EnvLookup& env, RendezvousSpec& spec) {
  auto addr = env("MASTER_ADDR");
  if (!addr) {
    if (auto nodes = env("SLURM_JOB_NODELIST")) addr = first_slurm_host(*nodes);
  }
  if (!addr) {
    fail(
        "error initializing using env:// rendezvous: environment variable MASTER_ADDR expected, "
        "but not set (the address of the host of rank 0; ddprun and torchrun set it)");
  }
  auto port = env("MASTER_PORT");
  if (!port) {
    fail(
        "error initializing using env:// rendezvous: environment variable MASTER_PORT expected, "
        "but not set (a free TCP port on the host of rank 0; ddprun and torchrun set it)");
  }
  spec.host = *addr;
  spec.port = parse_port("environment variable MASTER_PORT", *port);
  spec.use_agent_store = env("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True";
}

}  // namespace

EnvLookup process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr || *value == '\0') return std::nullopt;
    return std::string(value);
  };
}

std::optional<int> local_rank_from(const EnvLookup& env) {
  for (const char* name : {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"}) {
    if (auto value = env(name)) {
      auto local = parse_int(*value);
      if (local && *local >= 0) return local;
    }
  }
  return std::nullopt;
}

std::string RendezvousSpec::describe() const {
  switch (method) {
    case Method::kEnv:
      return "env:// (store at " + host + ":" + std::to_string(port) + ")";
    case Method::kTcp:
      return "tcp://" + host + ":" + std::to_string(port);
    case Method::kFile:
      return "file://" + path;
  }
  return "?";
}

std::string first_slurm_host(const std::string& nodelist) {
  // The first entry ends at the first comma outside brackets.
  std::string first;
  int depth = 0;
  for (char c : nodelist) {
    if (c == '[') depth++;
    if (c == ']') depth--;
    if (c == ',' && depth == 0) break;
    first += c;
  }
  auto open = first.find('[');
  if (open == std::string::npos) return first;
  std::string range = first.substr(open + 1);
  auto end = range.find_first_of(",-]");
  return first.substr(0, open) + range.substr(0, end);
}

RendezvousSpec parse_rendezvous(const std::string& init_method, int rank, int world_size,
                                const EnvLookup& env) {
  RendezvousSpec spec;
  std::map<std::string, std::string> query;
  const std::string method = init_method.empty() ? "env://" : init_method;
  auto scheme_end = method.find("://");
  if (scheme_end == std::string::npos) {
    fail("malformed init_method '" + method + "'; " + kAcceptedForms);
  }
  const std::string scheme = method.substr(0, scheme_end);
  const std::string rest = split_query(method.substr(scheme_end + 3), query, method);
  if (scheme == "env") {
    if (!rest.empty()) fail("env:// takes no address, got '" + method + "'; " + kAcceptedForms);
    spec.method = Method::kEnv;
    resolve_env_address(env, spec);
  } else if (scheme == "tcp") {
    spec.method = Method::kTcp;
    split_host_port(rest, method, spec);
  } else if (scheme == "file") {
    spec.method = Method::kFile;
    if (rest.empty() || rest[0] != '/') {
      fail("init_method '" + method + "' needs an absolute path (file:///tmp/rendezvous); " +
           kAcceptedForms);
    }
    spec.path = rest;
  } else {
    fail("unknown scheme '" + scheme + "' in init_method '" + method + "'; " + kAcceptedForms);
  }
  resolve_rank(rank, world_size, query, env, spec);
  if (auto ifname = env("GLOO_SOCKET_IFNAME")) spec.gloo_socket_ifname = *ifname;
  if (auto restarts = env("TORCHELASTIC_RESTART_COUNT")) {
    spec.restart_count = parse_int(*restarts).value_or(0);
  }
  if (auto run_id = env("TORCHELASTIC_RUN_ID")) spec.run_id = *run_id;
  if (auto host_id = env("DDP_CPP_HOST_ID")) spec.host_id = *host_id;
  spec.init_barrier = env("TORCH_DIST_INIT_BARRIER").value_or("0") == "1";
  return spec;
}

}  // namespace ddp::rendezvous
