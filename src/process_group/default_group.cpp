#include "process_group/default_group.h"

#include <mutex>
#include <vector>

namespace ddp::detail {
namespace {

struct Registry {
  std::mutex mutex;
  std::shared_ptr<GroupState> world;
  c10::intrusive_ptr<c10d::Store> store;
  std::vector<std::weak_ptr<GroupState>> groups;
  int group_count = 0;
  int rank_for_messages = -1;
};

Registry& registry() {
  static Registry* instance = new Registry();  // never destroyed: usable from atexit paths
  return *instance;
}

}  // namespace

int GroupState::to_group_rank(int global) const {
  for (size_t i = 0; i < global_ranks.size(); ++i) {
    if (global_ranks[i] == global) return static_cast<int>(i);
  }
  return -1;
}

std::shared_ptr<GroupState> world_group() {
  std::lock_guard<std::mutex> lock(registry().mutex);
  return registry().world;
}

int current_global_rank() {
  std::lock_guard<std::mutex> lock(registry().mutex);
  return registry().world ? registry().world->global_rank : registry().rank_for_messages;
}

void set_rank_for_messages(int rank) {
  std::lock_guard<std::mutex> lock(registry().mutex);
  registry().rank_for_messages = rank;
}

c10::intrusive_ptr<c10d::Store> default_store() {
  std::lock_guard<std::mutex> lock(registry().mutex);
  return registry().store;
}

void install_world(std::shared_ptr<GroupState> world, c10::intrusive_ptr<c10d::Store> store) {
  std::lock_guard<std::mutex> lock(registry().mutex);
  registry().groups.push_back(world);
  registry().world = std::move(world);
  registry().store = std::move(store);
}

void register_group(const std::shared_ptr<GroupState>& group) {
  std::lock_guard<std::mutex> lock(registry().mutex);
  registry().groups.push_back(group);
}

int take_group_number() {
  std::lock_guard<std::mutex> lock(registry().mutex);
  return registry().group_count++;
}

void destroy_all_groups() {
  std::vector<std::shared_ptr<GroupState>> alive;
  {
    std::lock_guard<std::mutex> lock(registry().mutex);
    for (auto& weak : registry().groups) {
      if (auto group = weak.lock()) alive.push_back(group);
    }
    registry().groups.clear();
    registry().world.reset();
    registry().store.reset();
    registry().group_count = 0;
    registry().rank_for_messages = -1;
  }
  // Release the backends outside the lock: their destructors join gloo threads and close sockets.
  for (auto& group : alive) {
    group->destroyed = true;
    group->backend.reset();
    group->store.reset();
  }
}

}  // namespace ddp::detail
