// Waits, quietly, until something listens on a TCP address.
//
// A store client started before rank 0 has to wait for rank 0's server. c10d's TCPStore client
// waits by itself, but logs a warning for every refused attempt (dozens of lines in a few seconds)
// and reports the timeout of its last attempt only. Probing first keeps the log clean and lets
// the caller report the timeout it was given. Thread-safe: no shared state.
#pragma once

#include <chrono>
#include <string>

namespace ddp::rendezvous {

/// Tries to connect to host:port until a connection succeeds (returns "") or the deadline passes
/// (returns why the last attempt failed, e.g. "Connection refused"). The probe connection is
/// closed at once; servers see a client that connects and leaves.
std::string wait_until_listening(const std::string& host, int port,
                                 std::chrono::steady_clock::time_point deadline);

}  // namespace ddp::rendezvous
