// init_process_group, destroy_process_group, new_group and the queries of the default group.
#include <algorithm>
#include <cctype>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "common/error_context.h"
#include "ddp/init.h"
#include "process_group/default_group.h"
#include "process_group/gloo/gloo_backend.h"
#include "rendezvous/rendezvous_spec.h"
#include "rendezvous/store_barrier.h"
#include "rendezvous/store_factory.h"

namespace ddp {
namespace {

// The backend of every group of this job, chosen at init.
struct BackendConfig {
  std::string name;
  detail::GlooDeviceChoice device;
};
BackendConfig& backend_config() {
  static BackendConfig config;
  return config;
}

std::string normalize_backend(const std::string& requested) {
  std::string name = requested;
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  // "auto" picks the fastest backend available for the job; on CPU builds that is gloo until the
  // shared-memory transport lands.
  if (name == "gloo" || name == "auto") return "gloo";
  if (name == "nccl") {
    detail::fail("init_process_group",
                 "backend 'nccl' is not available: this libtorch was built without CUDA, so "
                 "ddp-cpp compiles NCCL out. Use backend \"gloo\" (or \"auto\").");
  }
  detail::fail("init_process_group", "unknown backend '" + requested +
                                         "'; known backends: \"gloo\", \"auto\" (and \"nccl\" on "
                                         "CUDA builds of libtorch)");
}

bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
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
  world->backend_name = config.name;
  world->timeout = options.timeout();
  world->verify_collectives = options.verify_collectives();
  for (int rank = 0; rank < spec.world_size; ++rank) world->global_ranks.push_back(rank);
  world->name = std::to_string(detail::take_group_number());
  world->store = c10::make_intrusive<c10d::PrefixStore>(world->name, store);
  try {
    world->backend =
        detail::make_gloo_backend(world->store, spec.rank, spec.world_size, options.timeout(),
                                  config.device, "init_process_group at " + spec.describe());
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
  auto world = ProcessGroup().state();
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
  group->backend_name = world->backend_name;
  group->timeout = world->timeout;
  group->verify_collectives = world->verify_collectives;
  int number = detail::take_group_number();
  group->name = std::to_string(number);
  auto store = detail::default_store();
  group->store = c10::make_intrusive<c10d::PrefixStore>(group->name, store);
  if (group->is_member()) {
    group->backend = detail::make_gloo_backend(group->store, group->group_rank, group->size(),
                                               group->timeout, backend_config().device,
                                               "new_group(" + detail::join_ints(sorted) + ")");
  }
  rendezvous::store_based_barrier(*store, number + 1, world->size(), world->timeout, "new_group");
  if (group->is_member()) group->backend->setSequenceNumberForGroup();
  detail::register_group(group);
  return ProcessGroup(group);
}

}  // namespace ddp
