// The gloo backend: c10d's ProcessGroupGloo behind our Backend interface (c10d_backend.h), the
// transport of every collective on CPU tensors that shared memory does not carry. Construction
// is collective over the group's members (gloo connects a full mesh through the store); when a
// member never arrives, the error names the group ranks that did.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "process_group/backend.h"

namespace ddp::detail {

struct GlooDeviceChoice {
  std::string interface;  // GLOO_SOCKET_IFNAME, when set
  std::string hostname;   // bind to this address; empty: the host's default address
};

std::shared_ptr<Backend> make_gloo_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                           int group_rank, int group_size,
                                           std::chrono::milliseconds timeout,
                                           const GlooDeviceChoice& device,
                                           const std::string& operation);

}  // namespace ddp::detail
