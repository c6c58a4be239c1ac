// The process-wide registry of groups: the default (world) group and those made by new_group.
//
// Thread-safety: all functions lock one mutex; the returned shared_ptrs keep a group's state alive
// for an operation in flight even when destroy_process_group runs meanwhile (it then fails
// cleanly).
#pragma once

#include <memory>
#include <string>

#include "process_group/group_state.h"

namespace ddp::detail {

/// The world group, or null before init_process_group.
std::shared_ptr<GroupState> world_group();
/// The global rank, or -1 before init_process_group (used for messages, so never throws).
int current_global_rank();
/// Lets messages name this process's rank while init_process_group is still running.
void set_rank_for_messages(int rank);
/// The store that holds every group's keys (torch.distributed's "default_pg" prefix).
c10::intrusive_ptr<c10d::Store> default_store();

void install_world(std::shared_ptr<GroupState> world, c10::intrusive_ptr<c10d::Store> store);
void register_group(const std::shared_ptr<GroupState>& group);
/// Takes the next group number, as torch.distributed's _group_count does: "0" for the world,
/// then "1", "2", ... The store-based barrier after a group's creation uses the new count.
int take_group_number();
void destroy_all_groups();

}  // namespace ddp::detail
