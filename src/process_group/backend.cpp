#include "process_group/backend.h"

#include <stdexcept>

namespace ddp::detail {

void Backend::not_taken(const char* call) const {
  // A broken invariant, not a user's mistake: the group gives each call to a backend that takes it.
  throw std::logic_error("ddp-cpp bug: backend '" + name() + "' was given " + call +
                         ", which it does not take");
}

BackendWork Backend::reduce_scatter(at::Tensor&, std::vector<at::Tensor>&, RedOp, Launch) {
  not_taken("reduce_scatter");
}

BackendWork Backend::all_reduce_lists(std::vector<at::Tensor>, std::vector<at::Tensor>, RedOp,
                                      double, Launch) {
  not_taken("all_reduce_lists");
}

}  // namespace ddp::detail
