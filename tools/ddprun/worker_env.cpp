#include "worker_env.h"

#include <algorithm>
#include <cstring>

namespace ddprun {

int GlobalRank(const LauncherOptions& options, int local_rank) {
  return options.node_rank * options.nproc_per_node + local_rank;
}

EnvVars WorkerVariables(const LauncherOptions& options, int local_rank, int restart_count,
                        int online_cores, bool omp_num_threads_set) {
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
  if (!omp_num_threads_set) {
    int threads = std::max(1, online_cores / std::max(1, options.nproc_per_node));
    vars.emplace_back("OMP_NUM_THREADS", std::to_string(threads));
  }
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
