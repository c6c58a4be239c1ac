// Keeps one stalled client from freezing the store that rank 0 hosts.
//
// c10d's TCPStore server (the classic one, which ddp-cpp uses on every libtorch) serves one
// request at a time and reads each to its end with blocking reads before it serves the next. A
// client that sends half a request and then holds its connection (a stray or hostile process: the
// store authenticates nobody) would freeze every rank of the job for as long as it holds on. The
// server already drops a client whose socket fails; this gives its sockets a receive and send
// timeout, so that a client whose request (or whose reading of an answer) stops moving for
// `limit` fails, is dropped, and the server goes on serving the others. The server's sockets are
// made by c10d: where libtorch lets its server take a socket that is already bound (2.x), the
// server gets one whose timeouts are set before any client can connect, and Linux copies them to
// every socket it accepts. Where it does not (1.13), the server's sockets are found among this
// process's descriptors by their local port once it runs, and given the timeouts then; a client
// that connected in that instant keeps no limit.
//
// Only a stall is bounded: a client that keeps sending a byte now and then still holds the server
// (the store's port must not be reachable by untrusted processes). Thread-safe: reads the
// descriptor table and sets socket options only.
#pragma once

#include <chrono>

namespace ddp::rendezvous {

/// How long a request may stop moving before the server drops its client: long enough for a
/// descheduled process or a TCP retransmission, short enough to stay well inside `timeout`.
std::chrono::milliseconds stalled_client_limit(std::chrono::milliseconds timeout);

/// A TCP socket bound to `port` on every address (not listening yet), with the stall limit set,
/// for the server to take; -1 with errno set (EADDRINUSE: the port is taken) when it cannot be.
int bound_store_socket(int port, std::chrono::milliseconds limit);

/// Gives this process's listening socket on `port` and the connections it accepted so far a
/// receive and send timeout of `limit`. Returns how many sockets it changed (0: none found).
int limit_stalled_store_clients(int port, std::chrono::milliseconds limit);

}  // namespace ddp::rendezvous
