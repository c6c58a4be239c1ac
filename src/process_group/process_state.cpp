#include "process_group/process_state.h"

#include <atomic>
#include <mutex>

#include "common/peer_directory.h"

namespace ddp::detail {
namespace {

std::mutex& state_mutex() {
  static auto* mutex = new std::mutex();  // never destroyed: usable from atexit paths
  return *mutex;
}

// Guarded by state_mutex().
std::unique_ptr<ProcessState>& installed() {
  static auto* state = new std::unique_ptr<ProcessState>();
  return *state;
}

std::atomic<int> rank_for_messages{-1};

ProcessState& require_state() {
  TORCH_INTERNAL_ASSERT(installed(), "ddp-cpp bug: no process state (init_process_group first)");
  return *installed();
}

}  // namespace

void install_process_state(std::unique_ptr<ProcessState> state) {
  std::lock_guard<std::mutex> lock(state_mutex());
  TORCH_INTERNAL_ASSERT(!installed(), "ddp-cpp bug: a process state is installed already");
  state->groups.push_back(state->world);
  installed() = std::move(state);
}

void destroy_process_state() {
  std::unique_ptr<ProcessState> state;
  {
    std::lock_guard<std::mutex> lock(state_mutex());
    state = std::move(installed());
    rank_for_messages = -1;
  }
  if (!state) return;
  // Outside the lock: the backends' destructors join threads and close sockets.
  for (auto& weak : state->groups) {
    if (auto group = weak.lock()) group->release();
  }
  forget_peer_addresses();  // their connections are closed; the ports may serve others next
}

std::shared_ptr<GroupState> world_group() {
  std::lock_guard<std::mutex> lock(state_mutex());
  return installed() ? installed()->world : nullptr;
}

int current_global_rank() {
  {
    std::lock_guard<std::mutex> lock(state_mutex());
    if (installed()) return installed()->world->global_rank;
  }
  return rank_for_messages;
}

void set_rank_for_messages(int rank) { rank_for_messages = rank; }

c10::intrusive_ptr<c10d::Store> default_store() {
  std::lock_guard<std::mutex> lock(state_mutex());
  return require_state().store;
}

BackendChoice backend_choice() {
  std::lock_guard<std::mutex> lock(state_mutex());
  return require_state().backends;
}

void set_backend_choice(const BackendChoice& choice) {
  std::lock_guard<std::mutex> lock(state_mutex());
  require_state().backends = choice;
}

int take_group_number() {
  std::lock_guard<std::mutex> lock(state_mutex());
  return require_state().group_count++;
}

bool creation_barrier_requested() {
  std::lock_guard<std::mutex> lock(state_mutex());
  return require_state().creation_barrier_requested;
}

void register_group(const std::shared_ptr<GroupState>& group) {
  std::lock_guard<std::mutex> lock(state_mutex());
  require_state().groups.push_back(group);
}

}  // namespace ddp::detail
