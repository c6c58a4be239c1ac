// init_process_group, destroy_process_group, new_group and the queries of the default group.
#include <signal.h>

#include <algorithm>
#include <csignal>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "common/error_context.h"
#include "common/peer_directory.h"
#include "compat/libtorch_compat.h"
#include "ddp/init.h"
#include "init/allocator_tuning.h"
#include "process_group/backend_factory.h"
#include "process_group/gloo/gloo_address.h"
#include "process_group/nccl/nccl_backend.h"
#include "process_group/process_state.h"
#include "rendezvous/rank_claim.h"
#include "rendezvous/rendezvous_spec.h"
#include "rendezvous/store_barrier.h"
#include "rendezvous/store_factory.h"
#include "trace/timeline.h"
#include "trace/trace_dump.h"

namespace ddp {
namespace {

// gloo writes to its sockets with writev, which cannot suppress SIGPIPE: a peer that dies can
// kill a survivor by signal, without a word, where the write should have failed with an error that
// names the peer. Python ignores SIGPIPE, which is why PyTorch users never meet this; a C++ program
// keeps the default. Ignore it unless the program chose a handler of its own.
void ignore_sigpipe_unless_handled() {
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL &&
      !(current.sa_flags & SA_SIGINFO)) {
    std::signal(SIGPIPE, SIG_IGN);
  }
}

bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

// How this job's groups get their backends, from the options and what the rendezvous read.
detail::BackendChoice backend_choice_of(const std::string& backend,
                                        const rendezvous::RendezvousSpec& spec) {
  detail::BackendChoice choice;
  choice.name = backend;
  choice.gloo_device.interface = spec.gloo_socket_ifname;
  // Ranks that meet on a loopback address are all on this host: keep gloo on loopback too, rather
  // than on whatever address the hostname resolves to. Otherwise gloo listens where the other
  // hosts can reach it, on the address that faces the rendezvous host (gloo_address.h), unless
  // GLOO_SOCKET_IFNAME names an interface; file:// names no host, and keeps c10d's default.
  if (spec.method != rendezvous::Method::kFile && is_loopback(spec.host)) {
    choice.gloo_device.hostname = "127.0.0.1";
  } else if (spec.method != rendezvous::Method::kFile && spec.gloo_socket_ifname.empty()) {
    choice.gloo_device.hostname = detail::address_facing(spec.host);
  }
  choice.host_id = spec.host_id;
  choice.job = spec.run_id;
  choice.attempt = spec.restart_count;
  return choice;
}

}  // namespace

void init_process_group(const InitOptions& options) {
  if (detail::world_group()) {
    detail::fail<InvalidArgumentError>("init_process_group",
                                       "trying to initialize the default process group twice; call "
                                       "ddp::destroy_process_group() first");
  }
  if (options.timeout().count() <= 0) {
    detail::fail<InvalidArgumentError>(
        "init_process_group",
        "timeout must be positive, got " + std::to_string(options.timeout().count()) + " ms");
  }
  const std::string backend =
      detail::normalize_backend_name(options.backend(), "init_process_group");
  auto spec = rendezvous::parse_rendezvous(options.init_method(), options.rank(),
                                           options.world_size(), rendezvous::process_environment());
  // The flight recorder's settings: an option given wins over the environment, as for the rank.
  const auto env = rendezvous::process_environment();
  const auto buffer_env = env("DDP_CPP_TRACE_BUFFER");
  const auto dir_env = env("DDP_CPP_TRACE_DIR");
  detail::TraceSettings trace;
  trace.buffer = detail::resolve_trace_buffer(options.trace_buffer(),
                                              buffer_env ? buffer_env->c_str() : nullptr);
  trace.dir = detail::resolve_trace_dir(options.trace_dir(), dir_env ? dir_env->c_str() : nullptr);
  trace.rank = spec.rank;
  trace.world_size = spec.world_size;
  const auto timeline_env = env("DDP_CPP_TIMELINE");
  const std::string timeline_dir = detail::resolve_trace_dir(
      options.timeline_path(), timeline_env ? timeline_env->c_str() : nullptr);
  auto state = std::make_unique<detail::ProcessState>();
  state->backends = backend_choice_of(backend, spec);
  ignore_sigpipe_unless_handled();
  detail::prepare_nccl_error_handling();  // before the store and gloo start their threads
  if (options.tune_allocator() &&
      detail::user_malloc_tuning(detail::environment_names(), rendezvous::process_environment())
          .empty()) {
    detail::tune_allocator_for_training();
  }

  if (!timeline_dir.empty()) detail::open_timeline(timeline_dir, spec.rank);
  detail::set_rank_for_messages(spec.rank);
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = c10::make_intrusive<c10d::PrefixStore>(
        rendezvous::kDefaultGroupPrefix, rendezvous::connect_store(spec, options.timeout()));
  } catch (...) {
    detail::stop_timeline();
    detail::set_rank_for_messages(-1);
    throw;
  }

  detail::start_flight_recording(trace);
  auto world = std::make_shared<detail::GroupState>();
  world->global_rank = spec.rank;
  world->group_rank = spec.rank;
  world->timeout = options.timeout();
  world->verify_collectives = options.verify_collectives();
  for (int rank = 0; rank < spec.world_size; ++rank) world->global_ranks.push_back(rank);
  world->name = "0";
  world->store = compat::group_store(store, world->name);
  world->recorder = detail::make_flight_recorder(world->name, world->global_ranks, spec.rank);
  try {
    const std::string operation = "init_process_group at " + spec.describe();
    rendezvous::claim_rank(*store, spec.rank, spec.world_size);
    detail::BackendChoice& choice = state->backends;
    auto gloo = detail::make_flat_gloo(choice, *world, operation);
    if (detail::needs_host_ids(choice.name)) {
      detail::learn_hosts(choice, *store, spec.rank, spec.world_size, options.timeout(), operation);
    }
    detail::make_group_backends(choice, gloo, *world, operation);
    if (auto barrier =
            compat::creation_barrier(world->name, /*group_count=*/1, spec.init_barrier)) {
      rendezvous::store_based_barrier(*store, *barrier, spec.world_size, options.timeout(),
                                      "init_process_group");
    }
    // As torch.distributed does after the barrier: rank 0 publishes the collective sequence
    // number through the store (PyTorch ranks of the job wait for it). Before that, every rank
    // looks for a rank claimed twice (rank_claim.h): such a job must not start.
    rendezvous::check_no_rank_dispute(*store, spec.rank, spec.world_size, options.timeout());
    gloo->set_sequence_number_for_group();
    if (!timeline_dir.empty()) {
      detail::start_timeline(detail::measure_clock_offset(*store, spec.rank, spec.world_size));
    }
    if (spec.rank == 0) store->set(rendezvous::kJobStartedKey, std::vector<uint8_t>{'1'});
  } catch (...) {
    world->release();
    detail::stop_flight_recording();
    detail::stop_timeline();
    detail::forget_peer_addresses();
    detail::set_rank_for_messages(-1);
    throw;
  }
  state->world = std::move(world);
  state->store = store;
  state->creation_barrier_requested = spec.init_barrier;
  detail::install_process_state(std::move(state));
}

bool is_initialized() { return detail::world_group() != nullptr; }

int get_rank(const ProcessGroup& group) { return group.state()->group_rank; }

int get_world_size(const ProcessGroup& group) {
  auto state = group.state();
  return state->is_member() ? state->size() : -1;
}

std::string get_backend() { return ProcessGroup().state()->backend_name; }

void destroy_process_group() {
  detail::destroy_process_state();
  detail::stop_flight_recording();
  detail::stop_timeline();
}

ProcessGroup new_group(const std::vector<int>& ranks) {
  ProcessGroup().state();  // fails clearly before init_process_group
  return new_group(ranks, detail::backend_choice().name);
}

ProcessGroup new_group(const std::vector<int>& ranks, const std::string& backend) {
  auto world = ProcessGroup().state();
  detail::BackendChoice choice = detail::backend_choice();
  choice.name = detail::normalize_backend_name(backend, "new_group");
  if (detail::needs_host_ids(choice.name) && choice.host_ids.empty()) {
    // The world was made without them: learn where the ranks are now (collective over the world,
    // like new_group itself), once for the job.
    detail::learn_hosts(choice, *detail::default_store(), world->global_rank, world->size(),
                        world->timeout, "new_group");
    detail::BackendChoice job_choice = detail::backend_choice();
    job_choice.host_ids = choice.host_ids;
    job_choice.gpu_ids = choice.gpu_ids;
    detail::set_backend_choice(job_choice);
  }
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (sorted[i] < 0 || sorted[i] >= world->size()) {
      detail::fail<InvalidArgumentError>("new_group",
                                         "rank " + std::to_string(sorted[i]) + " is outside [0, " +
                                             std::to_string(world->size()) +
                                             ") (ranks given: " + detail::join_ints(ranks) + ")");
    }
    if (i > 0 && sorted[i] == sorted[i - 1]) {
      detail::fail<InvalidArgumentError>(
          "new_group", "rank " + std::to_string(sorted[i]) +
                           " is given twice (ranks given: " + detail::join_ints(ranks) + ")");
    }
  }
  if (sorted.empty()) sorted = world->global_ranks;  // torch.distributed: no ranks = every rank

  auto group = std::make_shared<detail::GroupState>();
  group->global_ranks = sorted;
  group->global_rank = world->global_rank;
  group->group_rank = group->to_group_rank(world->global_rank);
  group->timeout = world->timeout;
  group->verify_collectives = world->verify_collectives;
  int number = detail::take_group_number();
  group->name = std::to_string(number);
  auto store = detail::default_store();
  const auto& parent = compat::new_group_parent_store(store, world->store);
  group->store = compat::group_store(parent, group->name);
  std::shared_ptr<detail::Backend> gloo;
  if (group->is_member()) {
    group->recorder =
        detail::make_flight_recorder(group->name, group->global_ranks, group->global_rank);
    const std::string operation = "new_group(" + detail::join_ints(sorted) + ")";
    gloo = detail::make_flat_gloo(choice, *group, operation);
    detail::make_group_backends(choice, gloo, *group, operation);
  }
  if (auto barrier =
          compat::creation_barrier(group->name, number + 1, detail::creation_barrier_requested())) {
    rendezvous::store_based_barrier(*parent, *barrier, world->size(), world->timeout, "new_group");
  }
  if (gloo) gloo->set_sequence_number_for_group();
  detail::register_group(group);
  return ProcessGroup(group);
}

}  // namespace ddp
