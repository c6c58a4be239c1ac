// Creates c10d's ProcessGroupGloo for one group: the transport under every collective of a CPU
// job. Construction is collective over the group's members (gloo connects a full mesh through the
// store); when a member never arrives, the error names the group ranks that did.
#pragma once

#include <chrono>
#include <string>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace ddp::detail {

struct GlooDeviceChoice {
  std::string interface;  // GLOO_SOCKET_IFNAME, when set
  std::string hostname;   // bind to this address; empty: the host's default address
};

c10::intrusive_ptr<c10d::ProcessGroup> make_gloo_backend(
    const c10::intrusive_ptr<c10d::Store>& store, int group_rank, int group_size,
    std::chrono::milliseconds timeout, const GlooDeviceChoice& device,
    const std::string& operation);

}  // namespace ddp::detail
