#include "process_group/group_state.h"

namespace ddp::detail {

int GroupState::to_group_rank(int global) const {
  for (size_t i = 0; i < global_ranks.size(); ++i) {
    if (global_ranks[i] == global) return static_cast<int>(i);
  }
  return -1;
}

Backend* GroupState::backend_for(Collective collective, const at::Tensor& like) const {
  for (const auto& backend : backends) {
    if (backend->takes(collective, like)) return backend.get();
  }
  return nullptr;
}

void GroupState::release() {
  destroyed = true;
  backends.clear();
  store.reset();
}

}  // namespace ddp::detail
