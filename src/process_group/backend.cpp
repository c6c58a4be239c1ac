#include "process_group/backend.h"

#include <stdexcept>

#include "trace/flight_recorder.h"

namespace ddp::detail {

void Backend::not_taken(const char* call) const {
  // A broken invariant, not a user's mistake: the group gives each call to a backend that takes it.
  throw std::logic_error("ddp-cpp bug: backend '" + name() + "' was given " + call +
                         ", which it does not take");
}

const char* Backend::lasting_name() const {
  const char* known = lasting_name_.load(std::memory_order_acquire);
  if (known == nullptr) {
    known = lasting_backend_name(name());
    lasting_name_.store(known, std::memory_order_release);
  }
  return known;
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

namespace {

// `flat` as `parts` runs of equal length, in order: views, so that what is written into them lands
// in `flat`.
std::vector<at::Tensor> equal_runs(const at::Tensor& flat, int64_t parts) {
  const int64_t length = flat.numel() / parts;
  std::vector<at::Tensor> runs;
  at::Tensor line = flat.view(-1);
  for (int64_t i = 0; i < parts; ++i) runs.push_back(line.narrow(0, i * length, length));
  return runs;
}

}  // namespace

BackendWork Backend::all_gather_into_tensor(at::Tensor& output, at::Tensor& input, Launch launch) {
  std::vector<at::Tensor> outputs = equal_runs(output, output.numel() / input.numel());
  at::Tensor line = input.view(-1);
  return all_gather(outputs, line, launch);
}

BackendWork Backend::reduce_scatter_tensor(at::Tensor& output, at::Tensor& input, RedOp op,
                                           Launch launch) {
  std::vector<at::Tensor> inputs = equal_runs(input, input.numel() / output.numel());
  at::Tensor line = output.view(-1);
  return reduce_scatter(line, inputs, op, launch);
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
