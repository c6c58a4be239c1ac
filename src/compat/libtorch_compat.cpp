#include "compat/libtorch_compat.h"

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include <sstream>
#include <string>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <type_traits>

namespace ddp::compat {
namespace {

using StateMap = std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>;
using StateKey = StateMap::key_type;

// What libtorch itself keys a parameter's state by (Optimizer::step does the same). A template,
// so that only the branch of this libtorch's key type is compiled.
template <typename Key>
Key key_for(void* impl) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream text;  // 1.13: c10::guts::to_string of the pointer
    text << impl;
    return text.str();
  } else {
    return impl;
  }
}

StateKey key_of(const at::Tensor& param) { return key_for<StateKey>(param.unsafeGetTensorImpl()); }

}  // namespace

const c10::intrusive_ptr<c10d::Store>& new_group_parent_store(
    const c10::intrusive_ptr<c10d::Store>& default_store,
    const c10::intrusive_ptr<c10d::Store>& world_store) {
#if TORCH_VERSION_MAJOR >= 2
  (void)default_store;
  return world_store;
#else
  (void)world_store;
  return default_store;
#endif
}

c10::intrusive_ptr<c10d::Store> group_store(const c10::intrusive_ptr<c10d::Store>& parent,
                                            const std::string& name) {
#if TORCH_VERSION_MAJOR >= 2
  return c10::make_intrusive<c10d::PrefixStore>(name + "/", parent);
#else
  return c10::make_intrusive<c10d::PrefixStore>(name, parent);
#endif
}

c10::intrusive_ptr<c10d::Store> device_backend_store(
    const c10::intrusive_ptr<c10d::Store>& group_store, const char* device) {
#if TORCH_VERSION_MAJOR >= 2
  return c10::make_intrusive<c10d::PrefixStore>(std::string(device) + "/", group_store);
#else
  (void)device;
  return group_store;
#endif
}

std::optional<std::string> creation_barrier(const std::string& group_name, int group_count,
                                            bool requested) {
  const std::string prefix = "store_based_barrier_key:";
#if TORCH_VERSION_MAJOR >= 2
  (void)group_count;
  if (!requested) return std::nullopt;
  return prefix + group_name;
#else
  (void)group_name;
  (void)requested;
  return prefix + std::to_string(group_count);
#endif
}

const torch::optim::OptimizerParamState* optimizer_state_of(
    const torch::optim::Optimizer& optimizer, const at::Tensor& param) {
  auto found = optimizer.state().find(key_of(param));
  return found == optimizer.state().end() ? nullptr : found->second.get();
}

void set_optimizer_state(torch::optim::Optimizer& optimizer, const at::Tensor& param,
                         std::unique_ptr<torch::optim::OptimizerParamState> state) {
  optimizer.state()[key_of(param)] = std::move(state);
}

at::Tensor norm_along(const at::Tensor& x, int64_t dim) {
#if TORCH_VERSION_MAJOR >= 2
  return at::linalg_vector_norm(x, 2, {dim}, /*keepdim=*/true);
#else
  return at::frobenius_norm(x, {dim}, /*keepdim=*/true);
#endif
}

}  // namespace ddp::compat
