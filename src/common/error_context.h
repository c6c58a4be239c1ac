// Helpers that build DistributedError messages in one format:
//   "[rank R] ddp::OPERATION: CAUSE" (+ " FIX" where one is known).
// The rank is the global rank when a default group exists, "?" before it does.
#pragma once

#include <exception>
#include <string>
#include <vector>

namespace ddp::detail {

/// "[rank 3] ddp::all_reduce"
std::string context(const std::string& operation);

[[noreturn]] void fail(const std::string& operation, const std::string& cause);

/// Turns a failure of the backend (c10d, gloo) into a DistributedError with the operation, the
/// rank and, for the failures we recognise (a peer that closed its connection, a timeout), what it
/// most likely means and what to do. Call from inside a catch block.
[[noreturn]] void rethrow_backend_failure(const std::string& operation,
                                          const std::exception& error);

/// Joins integers: {1, 3} -> "1, 3".
std::string join_ints(const std::vector<int>& values);

}  // namespace ddp::detail
