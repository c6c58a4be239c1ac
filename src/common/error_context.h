// Helpers that build DistributedError messages in one format:
//   "[rank R] ddp::OPERATION: CAUSE" (+ " FIX" where one is known).
// The rank is the global rank when a default group exists, "?" before it does.
//
// Each throw site says what kind of failure it raises (fail<TimeoutError>, fail_peer_lost), so
// that the type is decided where the cause is known, never guessed later from the text.
#pragma once

#include <exception>
#include <string>
#include <vector>

#include "ddp/errors.h"

namespace ddp::detail {

/// "[rank 3] ddp::all_reduce"
std::string context(const std::string& operation);

/// The rank a new error reports: the global rank, or -1 before init_process_group knows it.
int reporting_rank();

/// The user's call within an operation text: "new_group(0, 1)" -> "new_group",
/// "all_reduce between hosts" -> "all_reduce".
std::string user_call(const std::string& operation);

/// Tells the flight recorder (trace/trace_dump.h) about an error about to be thrown: a
/// TimeoutError, PeerLostError or MismatchError makes this rank write its record. Every throw of
/// these helpers goes through raise_error().
void note_failure(const DistributedError& error);

template <typename Error>
[[noreturn]] void raise_error(const Error& error) {
  note_failure(error);
  throw error;
}

/// Throws Error (DistributedError or a subclass) with the message, rank and operation filled in.
template <typename Error = DistributedError>
[[noreturn]] void fail(const std::string& operation, const std::string& cause) {
  raise_error(Error(context(operation) + ": " + cause, reporting_rank(), user_call(operation)));
}

/// A PeerLostError naming the lost peer: its global rank (-1 if unknown) and host ("" if unknown).
[[noreturn]] void fail_peer_lost(const std::string& operation, const std::string& cause,
                                 int lost_rank, const std::string& lost_host = "");

/// Turns a failure of the backend (c10d, gloo) into a DistributedError with the operation, the
/// rank and, for the failures we recognise (a peer that closed its connection, a timeout), the
/// matching subclass, what it most likely means and what to do. A DistributedError passes
/// through unchanged. Call from inside a catch block.
[[noreturn]] void rethrow_backend_failure(const std::string& operation,
                                          const std::exception& error);

/// Throws an error of `error`'s type (and its lost peer, for a PeerLostError) with another
/// message and user call: for a caller that adds what the failure means where it happened.
[[noreturn]] void throw_like(const DistributedError& error, const std::string& message,
                             const std::string& call);

/// True when a backend's message (c10d's, gloo's) says it gave up waiting.
bool reports_a_timeout(const std::string& what);

/// True when a backend's message says a connection was reset or closed by its peer.
bool reports_a_lost_connection(const std::string& what);

/// Joins integers: {1, 3} -> "1, 3".
std::string join_ints(const std::vector<int>& values);

}  // namespace ddp::detail
