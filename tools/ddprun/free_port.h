// PickFreePort asks the kernel for an unused TCP port on 127.0.0.1 (bind to port 0, read the
// port back, close) for --standalone. The port is free when returned, not reserved: rank 0
// binds it moments later, as torchrun's standalone mode also does. Thread-safe.
#pragma once

#include <optional>
#include <string>

namespace ddprun {

// The port, or nullopt with `*error` describing the failing call.
std::optional<int> PickFreePort(std::string* error);

}  // namespace ddprun
