#include "worker_env.h"

#include <algorithm>
#include <cstring>
#include <string_view>

namespace ddprun {

int GlobalRank(const LauncherOptions& options, int local_rank) {
  return options.node_rank * options.nproc_per_node + local_rank;
}

UserSettings UserSettingsFrom(const char* const* environment) {
  UserSettings user;
  for (const char* const* entry = environment; entry != nullptr && *entry != nullptr; ++entry) {
    std::string_view var(*entry);
    std::string_view name = var.substr(0, var.find('='));
    if (name == "OMP_NUM_THREADS") user.omp_num_threads = true;
    // MALLOC_ARENA_MAX, MALLOC_TRIM_THRESHOLD_, ...: glibc's older names for its tunables.
    if (name == "GLIBC_TUNABLES" || name.rfind("MALLOC_", 0) == 0) user.malloc_tuning = true;
  }
  return user;
}

EnvVars WorkerVariables(const LauncherOptions& options, int local_rank, int restart_count,
                        int online_cores, const UserSettings& user) {
  const int world_size = options.nnodes * options.nproc_per_node;
  const std::string rank = std::to_string(GlobalRank(options, local_rank));
  EnvVars vars = {
      {"RANK", rank},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"WORLD_SIZE", std::to_string(world_size)},
      {"LOCAL_WORLD_SIZE", std::to_string(options.nproc_per_node)},
      {"GROUP_RANK", std::to_string(options.node_rank)},
      {"GROUP_WORLD_SIZE", std::to_string(options.nnodes)},
      // One role only, so role ranks are the global ones.
      {"ROLE_RANK", rank},
      {"ROLE_WORLD_SIZE", std::to_string(world_size)},
      {"ROLE_NAME", options.role},
      {"MASTER_ADDR", options.master_addr},
      {"MASTER_PORT", std::to_string(options.master_port)},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(restart_count)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(options.max_restarts)},
      {"TORCHELASTIC_RUN_ID", options.run_id},
  };
  // Without a limit every worker's OpenMP pool would use all cores, oversubscribing the node
  // p times; a user's explicit choice is respected.
  if (!user.omp_num_threads) {
    int threads = std::max(1, online_cores / std::max(1, options.nproc_per_node));
    vars.emplace_back("OMP_NUM_THREADS", std::to_string(threads));
  }
  // A C++ trainer frees its activations at the end of every step. With glibc's defaults the
  // heap above the trim threshold goes back to the kernel and comes back as page faults in the
  // next step: measured here, 7,000 faults and about half of the step on a small ResNet (see
  // bench/README.md). Python processes rarely see it (their imports raise glibc's dynamic
  // thresholds early), so this also keeps C++ and Python workers comparable.
  if (!user.malloc_tuning) vars.emplace_back("GLIBC_TUNABLES", kWorkerGlibcTunables);
  return vars;
}

std::vector<std::string> MergeEnvironment(const char* const* base, const EnvVars& overrides) {
  std::vector<std::string> merged;
  for (const char* const* entry = base; entry != nullptr && *entry != nullptr; ++entry) {
    const char* equals = std::strchr(*entry, '=');
    size_t name_length = equals ? static_cast<size_t>(equals - *entry) : std::strlen(*entry);
    bool overridden = std::any_of(overrides.begin(), overrides.end(), [&](const auto& var) {
      return var.first.size() == name_length &&
             var.first.compare(0, name_length, *entry, name_length) == 0;
    });
    if (!overridden) merged.emplace_back(*entry);
  }
  for (const auto& [name, value] : overrides) merged.push_back(name + "=" + value);
  return merged;
}

}  // namespace ddprun
