#include "ddp/process_group.h"

#include "common/error_context.h"
#include "process_group/process_state.h"

namespace ddp {

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM:
      return "SUM";
    case ReduceOp::AVG:
      return "AVG";
    case ReduceOp::PRODUCT:
      return "PRODUCT";
    case ReduceOp::MIN:
      return "MIN";
    case ReduceOp::MAX:
      return "MAX";
    case ReduceOp::BAND:
      return "BAND";
    case ReduceOp::BOR:
      return "BOR";
    case ReduceOp::BXOR:
      return "BXOR";
  }
  return "?";
}

std::shared_ptr<detail::GroupState> ProcessGroup::state() const {
  if (state_ == nullptr) {
    auto world = detail::world_group();
    if (!world) {
      detail::fail("process group",
                   "the default process group has not been initialized; call "
                   "ddp::init_process_group first");
    }
    return world;
  }
  if (state_->destroyed) {
    detail::fail("process group", "group '" + state_->name +
                                      "' was destroyed by destroy_process_group; create it again "
                                      "with new_group after the next init_process_group");
  }
  return state_;
}

bool ProcessGroup::is_member() const { return state()->is_member(); }
int ProcessGroup::rank() const { return state()->group_rank; }
int ProcessGroup::size() const { return state()->size(); }
std::vector<int> ProcessGroup::ranks() const { return state()->global_ranks; }
int ProcessGroup::group_rank(int global_rank) const { return state()->to_group_rank(global_rank); }
std::string ProcessGroup::name() const { return state()->name; }

}  // namespace ddp
