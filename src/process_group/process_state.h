// ProcessState: everything ddp-cpp keeps per process while a default group exists.
//
// init_process_group builds it (the world group, the store every group's keys live in, how this
// job's groups get their backends) and installs it; new_group adds to it; destroy_process_group
// tears all of it down, after which init_process_group may build a new one. Nothing else is
// global, except the rank that messages name while init_process_group is still running.
//
// Thread-safety: every function locks one mutex; the shared_ptrs handed out keep a group alive for
// an operation in flight even when destroy_process_group runs meanwhile (it then fails cleanly).
#pragma once

#include <memory>
#include <vector>

#include "process_group/backend_factory.h"
#include "process_group/group_state.h"

namespace ddp::detail {

struct ProcessState {
  std::shared_ptr<GroupState> world;
  c10::intrusive_ptr<c10d::Store> store;  // torch.distributed's "default_pg" prefix
  BackendChoice backends;
  std::vector<std::weak_ptr<GroupState>> groups;  // the world and every new_group since
  int group_count = 1;  // torch.distributed's _group_count: the world is group "0"
  bool creation_barrier_requested = false;  // TORCH_DIST_INIT_BARRIER=1 (compat.h)
};

/// Installs what init_process_group built. REQUIRES: none is installed.
void install_process_state(std::unique_ptr<ProcessState> state);
/// Destroys every group and the state; does nothing when none is installed.
void destroy_process_state();

/// The world group, or null before init_process_group.
std::shared_ptr<GroupState> world_group();
/// The global rank, or -1 before init_process_group (used for messages, so never throws).
int current_global_rank();
/// Lets messages name this process's rank while init_process_group is still running.
void set_rank_for_messages(int rank);

// For new_group. REQUIRES: a state is installed (checked by the caller through world_group()).
c10::intrusive_ptr<c10d::Store> default_store();
BackendChoice backend_choice();
void set_backend_choice(const BackendChoice& choice);
/// Takes the next group number ("1", "2", ...); the store-based barrier after a group's creation
/// counts with it.
int take_group_number();
bool creation_barrier_requested();
void register_group(const std::shared_ptr<GroupState>& group);

}  // namespace ddp::detail
