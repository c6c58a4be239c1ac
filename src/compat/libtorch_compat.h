// The differences between the libtorch versions ddp-cpp builds against, in one place.
//
// Supported: 1.13 (Debian 12) and 2.x (Debian 13's 2.6, pytorch.org and pip 2.x). What differs,
// and what the rest of the code uses instead:
// - c10d's process groups: ProcessGroupGloo and ProcessGroupNCCL derive from c10d::ProcessGroup
//   in 1.13 and from c10d::Backend in 2.x (where a ProcessGroup is a front that dispatches to
//   Backends by device). C10dBackend names whichever it is; our own Backend interface
//   (process_group/backend.h) sits on top, so nothing above the process-group layer sees either.
// - torch::optim::Optimizer::state() is keyed by the parameter's TensorImpl printed as a string in
//   1.13, and by the TensorImpl* itself in 2.x: optimizer_state_of / set_optimizer_state.
// - c10d::TCPStoreOptions gained useLibUV (2.4), true by default, and a libtorch built without
//   libuv (Debian's) refuses to host a store then: use_classic_tcp_store.
// - c10d::TCPStoreOptions gained masterListenFd (2.2): a server can take a socket that is already
//   bound, which ddp-cpp uses to limit stalled clients before the first one connects:
//   hand_over_listening_socket.
// - torch.distributed lays out a group's keys differently (1.13: "<group>/..." under the default
//   store; 2.x: "<group>//<device>//..." per device backend, new groups under the world's store)
//   and ends a group's creation with a store-based barrier always (1.13) or only with
//   TORCH_DIST_INIT_BARRIER=1 (2.x): new_group_parent_store, group_store, device_backend_store,
//   creation_barrier. ddp-cpp follows the libtorch it is built against, so
//   that Python ranks of the same PyTorch can share its jobs.
// - torch.norm(x, dim=d, keepdim=True) is frobenius_norm in 1.13's Python and
//   linalg.vector_norm in 2.x's: norm_along computes it as the Python of the same libtorch does, so
//   that PowerSGD's orthogonalization gives PyTorch's bits.
// - c10d::Store::clone() is pure virtual in 2.15 (a store per thread): clone_store.
// - autograd's nodes are held by std::shared_ptr up to 2.14 and by c10::intrusive_ptr since:
//   make_autograd_node, and decltype(Edge::function) wherever a node pointer is kept.
// - c10d's NCCL error handling is read from TORCH_NCCL_ASYNC_ERROR_HANDLING since 2.2, from
//   NCCL_ASYNC_ERROR_HANDLING before: kNcclErrorHandlingVariable.
// - rank 0 of a new group publishes the collective sequence number through the store, for which
//   torch.distributed's ranks wait, up to 2.14; 2.15 made the call a warning no-op (every rank
//   starts at 0): kGroupsAgreeOnSequenceNumbers.
// - 2.15's headers need C++20 (its CMake config asks for it; ddprun stays C++17).
// Differences that one spelling covers in both need no entry here: c10::NoGradGuard (at::'s
// alias is not reachable in every 2.x), std::to_string, <cstdint>'s INT32_MIN.
#pragma once

#include <c10/util/Exception.h>
#include <torch/csrc/autograd/function.h>  // Node complete: 2.15 holds it by intrusive_ptr
#include <torch/version.h>

#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif

namespace at {
class Tensor;
}
namespace torch::optim {
class Optimizer;
struct OptimizerParamState;
}  // namespace torch::optim

namespace ddp::compat {

#if TORCH_VERSION_MAJOR >= 2
using C10dBackend = c10d::Backend;
#else
using C10dBackend = c10d::ProcessGroup;
#endif
using C10dBackendPtr = c10::intrusive_ptr<C10dBackend>;

/// Has a TCP store (server or client) use c10d's classic sockets rather than libuv, where libtorch
/// offers the choice (2.4 and later): every build has the former (Debian's 2.6 has no libuv and
/// refuses libuv stores), and the two speak the same protocol.
template <typename StoreOptions>
auto use_classic_tcp_store(StoreOptions& options, int)
    -> decltype(options.useLibUV = false, void()) {
  options.useLibUV = false;
}
template <typename StoreOptions>
void use_classic_tcp_store(StoreOptions&, long) {}  // before 2.4: the classic one only
template <typename StoreOptions>
void use_classic_tcp_store(StoreOptions& options) {
  use_classic_tcp_store(options, 0);
}

/// Has a TCP store's server take `fd`, a socket bound to options.port, instead of binding its own,
/// where libtorch offers it (2.2 and later); false where it does not (the caller keeps `fd`).
template <typename StoreOptions>
auto hand_over_listening_socket(StoreOptions& options, int fd, int)
    -> decltype(options.masterListenFd = fd, bool()) {
  options.masterListenFd = fd;
  return true;
}
template <typename StoreOptions>
bool hand_over_listening_socket(StoreOptions&, int, long) {
  return false;
}
template <typename StoreOptions>
bool hand_over_listening_socket(StoreOptions& options, int fd) {
  return hand_over_listening_socket(options, fd, 0);
}

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 2)
inline constexpr const char* kNcclErrorHandlingVariable = "TORCH_NCCL_ASYNC_ERROR_HANDLING";
#else
inline constexpr const char* kNcclErrorHandlingVariable = "NCCL_ASYNC_ERROR_HANDLING";
#endif

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 15)
inline constexpr bool kGroupsAgreeOnSequenceNumbers = false;
#else
inline constexpr bool kGroupsAgreeOnSequenceNumbers = true;
#endif

/// store.clone(), where libtorch has it (2.15 and later); never called before (nothing asks).
template <typename Store>
auto clone_store(Store& store, int) -> decltype(store.clone()) {
  return store.clone();
}
template <typename Store>
c10::intrusive_ptr<c10d::Store> clone_store(Store&, long) {
  TORCH_INTERNAL_ASSERT(false, "ddp-cpp bug: Store::clone() called on a libtorch without it");
}
template <typename Store>
c10::intrusive_ptr<c10d::Store> clone_store(Store& store) {
  return clone_store(store, 0);
}

/// A new autograd node of type Node, held as this libtorch holds nodes.
using AutogradNodePtr = decltype(std::declval<torch::autograd::Edge&>().function);
template <typename Node, typename... Args>
auto make_autograd_node(Args&&... args) {
  if constexpr (std::is_same_v<AutogradNodePtr, std::shared_ptr<torch::autograd::Node>>) {
    return std::make_shared<Node>(std::forward<Args>(args)...);
  } else {
    return c10::make_intrusive<Node>(std::forward<Args>(args)...);
  }
}

/// The store under which groups made by new_group keep theirs, and count their creation barrier:
/// the job's default store in 1.13, the world group's store in 2.x.
const c10::intrusive_ptr<c10d::Store>& new_group_parent_store(
    const c10::intrusive_ptr<c10d::Store>& default_store,
    const c10::intrusive_ptr<c10d::Store>& world_store);
/// The store of the group named `name` ("0" for the world, under the default store).
c10::intrusive_ptr<c10d::Store> group_store(const c10::intrusive_ptr<c10d::Store>& parent,
                                            const std::string& name);
/// The store of a group's backend for tensors of `device` ("cpu", "cuda").
c10::intrusive_ptr<c10d::Store> device_backend_store(
    const c10::intrusive_ptr<c10d::Store>& group_store, const char* device);
/// The key of the store-based barrier that ends a group's creation, or nullopt where
/// torch.distributed makes none (`requested`: TORCH_DIST_INIT_BARRIER=1). `group_count` is the
/// group counter after the group took its number.
std::optional<std::string> creation_barrier(const std::string& group_name, int group_count,
                                            bool requested);

/// The optimizer's state for `param`; null when it has none yet (never stepped).
const torch::optim::OptimizerParamState* optimizer_state_of(
    const torch::optim::Optimizer& optimizer, const at::Tensor& param);
/// Replaces the optimizer's state for `param`.
void set_optimizer_state(torch::optim::Optimizer& optimizer, const at::Tensor& param,
                         std::unique_ptr<torch::optim::OptimizerParamState> state);

/// torch.norm(x, dim=dim, keepdim=True) with the same kernel as PyTorch's Python of this libtorch.
at::Tensor norm_along(const at::Tensor& x, int64_t dim);

}  // namespace ddp::compat
