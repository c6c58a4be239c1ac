// Waits, quietly, until something listens on a TCP address.
//
// A store client started before rank 0 has to wait for rank 0's server. c10d's TCPStore client
// waits by itself, but logs a warning for every refused attempt (dozens of lines in a few seconds)
// and reports the timeout of its last attempt only. Probing first keeps the log clean and lets
// the caller report the timeout it was given.
//
// ServerCloseWatch learns when a server goes away: a connection that sends nothing, so that the
// server never answers on it, and the first thing it can read is the server closing it.
// Thread-safe: no shared state (one ServerCloseWatch is used by one thread at a time).
#pragma once

#include <chrono>
#include <memory>
#include <string>

namespace ddp::rendezvous {

/// Tries to connect to host:port until a connection succeeds (returns "") or the deadline passes
/// (returns why the last attempt failed, e.g. "Connection refused"). The probe connection is
/// closed at once; servers see a client that connects and leaves.
std::string wait_until_listening(const std::string& host, int port,
                                 std::chrono::steady_clock::time_point deadline);

class ServerCloseWatch {
 public:
  /// A connection to host:port, or null when none could be made by the deadline.
  static std::unique_ptr<ServerCloseWatch> open(const std::string& host, int port,
                                                std::chrono::steady_clock::time_point deadline);
  ~ServerCloseWatch();
  ServerCloseWatch(const ServerCloseWatch&) = delete;
  ServerCloseWatch& operator=(const ServerCloseWatch&) = delete;

  /// Waits until the server closed the connection (or its process ended); false when the
  /// deadline passed first.
  bool wait_closed(std::chrono::steady_clock::time_point deadline) const;

  const std::string& host() const { return host_; }
  int port() const { return port_; }

 private:
  ServerCloseWatch(int fd, std::string host, int port)
      : fd_(fd), host_(std::move(host)), port_(port) {}
  int fd_;
  std::string host_;
  int port_;
};

}  // namespace ddp::rendezvous
