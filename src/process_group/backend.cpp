#include "process_group/backend.h"

#include <stdexcept>

namespace ddp::detail {

void Backend::not_taken(const char* call) const {
  // A broken invariant, not a user's mistake: the group gives each call to a backend that takes it.
  throw std::logic_error("ddp-cpp bug: backend '" + name() + "' was given " + call +
                         ", which it does not take");
}

BackendWork Backend::all_reduce(at::Tensor&, RedOp, Launch) { not_taken("all_reduce"); }

BackendWork Backend::broadcast(at::Tensor&, int, Launch) { not_taken("broadcast"); }

BackendWork Backend::all_gather(std::vector<at::Tensor>&, at::Tensor&, Launch) {
  not_taken("all_gather");
}

BackendWork Backend::barrier(Launch) { not_taken("barrier"); }

BackendWork Backend::reduce_scatter(at::Tensor&, std::vector<at::Tensor>&, RedOp, Launch) {
  not_taken("reduce_scatter");
}

BackendWork Backend::reduce(at::Tensor&, int, RedOp) { not_taken("reduce"); }

BackendWork Backend::gather(std::vector<at::Tensor>&, at::Tensor&, int) { not_taken("gather"); }

BackendWork Backend::scatter(at::Tensor&, std::vector<at::Tensor>&, int) { not_taken("scatter"); }

BackendWork Backend::send(at::Tensor&, int, int) { not_taken("send"); }

BackendWork Backend::recv(at::Tensor&, int, int) { not_taken("recv"); }

BackendWork Backend::all_reduce_lists(std::vector<at::Tensor>, std::vector<at::Tensor>, RedOp,
                                      double, Launch) {
  not_taken("all_reduce_lists");
}

BackendWork Backend::all_reduce_narrow_between_hosts(at::Tensor&, c10::ScalarType, int64_t,
                                                     Launch) {
  not_taken("all_reduce_narrow_between_hosts");
}

}  // namespace ddp::detail
