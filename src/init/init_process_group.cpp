// init_process_group, destroy_process_group, new_group and the queries of the default group.
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "common/error_context.h"
#include "ddp/init.h"
#include "process_group/default_group.h"
#include "process_group/gloo/gloo_backend.h"
#include "process_group/shm/shm_process_group.h"
#include "rendezvous/rendezvous_spec.h"
#include "rendezvous/store_barrier.h"
#include "rendezvous/store_factory.h"

namespace ddp {
namespace {

// The backend of every group of this job, chosen at init, with what the shm backend needs to
// know: which host each global rank is on, and the job and attempt that name its segments.
struct BackendConfig {
  std::string name;  // "gloo", "shm" or "auto"
  detail::GlooDeviceChoice device;
  std::vector<std::string> host_ids;  // by global rank; empty for "gloo"
  std::string job;
  int attempt = 0;
};
BackendConfig& backend_config() {
  static BackendConfig config;
  return config;
}

std::string normalize_backend(const std::string& requested) {
  std::string name = requested;
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (name == "gloo" || name == "shm" || name == "auto") return name;
  if (name == "nccl") {
    detail::fail("init_process_group",
                 "backend 'nccl' is not available: this libtorch was built without CUDA, so "
                 "ddp-cpp compiles NCCL out. Use backend \"gloo\" (or \"auto\").");
  }
  detail::fail("init_process_group",
               "unknown backend '" + requested +
                   "'; known backends: \"gloo\", \"shm\", \"auto\" (and \"nccl\" on "
                   "CUDA builds of libtorch)");
}

bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

std::string environment_or(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return value && *value ? std::string(value) : fallback;
}

// Creates the backend of `group` (a member) as group.backend_name says, on top of the group's
// flat gloo backend (made first by the caller: its rendezvous names any rank that never arrives),
// which the shm backend keeps for what shared memory does not carry.
c10::intrusive_ptr<c10d::ProcessGroup> make_backend(const BackendConfig& config,
                                                    detail::GroupState& group,
                                                    c10::intrusive_ptr<c10d::ProcessGroup> gloo,
                                                    const std::string& operation) {
  if (group.backend_name == "gloo") return gloo;
  std::vector<std::string> ids;
  for (int rank : group.global_ranks) ids.push_back(config.host_ids[rank]);
  detail::ShmGroupOptions options;
  options.job = config.job;
  options.attempt = config.attempt;
  options.group = group.name;
  options.timeout = group.timeout;
  options.topology = detail::HostTopology::from_ids(ids);
  options.global_ranks = group.global_ranks;
  options.gloo = std::move(gloo);
  const auto timeout = group.timeout;
  const auto device = config.device;
  options.make_gloo = [timeout, device, operation](const c10::intrusive_ptr<c10d::Store>& store,
                                                   int rank, int size) {
    return detail::make_gloo_backend(store, rank, size, timeout, device, operation);
  };
  return c10::make_intrusive<detail::ShmProcessGroup>(group.store, group.group_rank, group.size(),
                                                      std::move(options), operation);
}

// Learns which host every rank is on, and the job's names for the shm segments. Collective over
// the world.
void learn_hosts(BackendConfig& config, c10d::Store& store, int rank, int world_size,
                 std::chrono::milliseconds timeout, const std::string& operation) {
  config.host_ids = detail::exchange_host_ids(store, rank, world_size,
                                              detail::local_host_identity(), timeout, operation);
  config.job = environment_or("TORCHELASTIC_RUN_ID", "job");
  config.attempt = std::atoi(environment_or("TORCHELASTIC_RESTART_COUNT", "0").c_str());
}

// The backend a group gets: "gloo" or "shm", resolving "auto" from where its ranks are.
std::string resolve_backend(const BackendConfig& config, const std::vector<int>& global_ranks) {
  if (config.name == "gloo") return "gloo";
  if (config.name == "shm") return "shm";
  std::vector<std::string> ids;
  for (int rank : global_ranks) ids.push_back(config.host_ids[rank]);
  return detail::HostTopology::from_ids(ids).any_host_shared() ? "shm" : "gloo";
}

}  // namespace

void init_process_group(const InitOptions& options) {
  if (detail::world_group()) {
    detail::fail("init_process_group",
                 "trying to initialize the default process group twice; call "
                 "ddp::destroy_process_group() first");
  }
  if (options.timeout().count() <= 0) {
    detail::fail("init_process_group", "timeout must be positive, got " +
                                           std::to_string(options.timeout().count()) + " ms");
  }
  BackendConfig config;
  config.name = normalize_backend(options.backend());
  auto spec = rendezvous::parse_rendezvous(options.init_method(), options.rank(),
                                           options.world_size(), rendezvous::process_environment());
  config.device.interface = spec.gloo_socket_ifname;
  // Ranks that meet on a loopback address are all on this host: keep gloo on loopback too, rather
  // than on whatever address the hostname resolves to.
  if (spec.method != rendezvous::Method::kFile && is_loopback(spec.host)) {
    config.device.hostname = "127.0.0.1";
  }

  detail::set_rank_for_messages(spec.rank);
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = c10::make_intrusive<c10d::PrefixStore>(
        "default_pg", rendezvous::connect_store(spec, options.timeout()));
  } catch (...) {
    detail::set_rank_for_messages(-1);
    throw;
  }

  auto world = std::make_shared<detail::GroupState>();
  world->global_rank = spec.rank;
  world->group_rank = spec.rank;
  world->timeout = options.timeout();
  world->verify_collectives = options.verify_collectives();
  for (int rank = 0; rank < spec.world_size; ++rank) world->global_ranks.push_back(rank);
  world->name = std::to_string(detail::take_group_number());
  world->store = c10::make_intrusive<c10d::PrefixStore>(world->name, store);
  try {
    const std::string operation = "init_process_group at " + spec.describe();
    auto gloo = detail::make_gloo_backend(world->store, spec.rank, spec.world_size,
                                          options.timeout(), config.device, operation);
    if (config.name != "gloo") {
      learn_hosts(config, *store, spec.rank, spec.world_size, options.timeout(), operation);
    }
    world->backend_name = resolve_backend(config, world->global_ranks);
    world->backend = make_backend(config, *world, std::move(gloo), operation);
    rendezvous::store_based_barrier(*store, /*group_count=*/1, spec.world_size, options.timeout(),
                                    "init_process_group");
    // As torch.distributed does after the barrier: rank 0 publishes the collective sequence
    // number through the store (PyTorch ranks of the job wait for it).
    world->backend->setSequenceNumberForGroup();
  } catch (...) {
    detail::destroy_all_groups();
    throw;
  }
  backend_config() = config;
  detail::install_world(std::move(world), store);
}

bool is_initialized() { return detail::world_group() != nullptr; }

int get_rank(const ProcessGroup& group) { return group.state()->group_rank; }

int get_world_size(const ProcessGroup& group) {
  auto state = group.state();
  return state->is_member() ? state->size() : -1;
}

std::string get_backend() { return ProcessGroup().state()->backend_name; }

void destroy_process_group() { detail::destroy_all_groups(); }

ProcessGroup new_group(const std::vector<int>& ranks) {
  return new_group(ranks, backend_config().name);
}

ProcessGroup new_group(const std::vector<int>& ranks, const std::string& backend) {
  auto world = ProcessGroup().state();
  BackendConfig& config = backend_config();
  BackendConfig group_config = config;
  group_config.name = normalize_backend(backend);
  if (group_config.name != "gloo" && config.host_ids.empty()) {
    // The world was made with gloo: learn where the ranks are now (collective over the world,
    // like new_group itself).
    learn_hosts(config, *detail::default_store(), world->global_rank, world->size(), world->timeout,
                "new_group");
    group_config.host_ids = config.host_ids;
    group_config.job = config.job;
    group_config.attempt = config.attempt;
  }
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (sorted[i] < 0 || sorted[i] >= world->size()) {
      detail::fail("new_group", "rank " + std::to_string(sorted[i]) + " is outside [0, " +
                                    std::to_string(world->size()) +
                                    ") (ranks given: " + detail::join_ints(ranks) + ")");
    }
    if (i > 0 && sorted[i] == sorted[i - 1]) {
      detail::fail("new_group", "rank " + std::to_string(sorted[i]) +
                                    " is given twice (ranks given: " + detail::join_ints(ranks) +
                                    ")");
    }
  }
  if (sorted.empty()) sorted = world->global_ranks;  // torch.distributed: no ranks = every rank

  auto group = std::make_shared<detail::GroupState>();
  group->global_ranks = sorted;
  group->global_rank = world->global_rank;
  group->group_rank = group->to_group_rank(world->global_rank);
  group->backend_name = resolve_backend(group_config, sorted);
  group->timeout = world->timeout;
  group->verify_collectives = world->verify_collectives;
  int number = detail::take_group_number();
  group->name = std::to_string(number);
  auto store = detail::default_store();
  group->store = c10::make_intrusive<c10d::PrefixStore>(group->name, store);
  if (group->is_member()) {
    const std::string operation = "new_group(" + detail::join_ints(sorted) + ")";
    auto gloo = detail::make_gloo_backend(group->store, group->group_rank, group->size(),
                                          group->timeout, config.device, operation);
    group->backend = make_backend(group_config, *group, std::move(gloo), operation);
  }
  rendezvous::store_based_barrier(*store, number + 1, world->size(), world->timeout, "new_group");
  if (group->is_member()) group->backend->setSequenceNumberForGroup();
  detail::register_group(group);
  return ProcessGroup(group);
}

}  // namespace ddp
