// DistributedError: the one exception type of ddp-cpp.
//
// Every failure a user can cause or meet (bad options, a missing environment variable, a peer that
// died, a timeout) is reported as a DistributedError whose message names the rank, the operation,
// the cause and, where it is known, the fix. Broken internal invariants are assertions instead
// (TORCH_INTERNAL_ASSERT): they mean a bug in ddp-cpp, not a mistake of the caller.
#pragma once

#include <stdexcept>
#include <string>

namespace ddp {

class DistributedError : public std::runtime_error {
 public:
  explicit DistributedError(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace ddp
