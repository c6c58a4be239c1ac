// The peers this process is connected to, by the addresses its transports name them with.
//
// gloo reports a lost connection by the socket address of its other end ("Read error
// [127.0.0.1]:65220: Connection reset by peer"), which says nothing to a person reading it. Each
// gloo group therefore learns, when it is made, which rank (and process, and host) is behind the
// address of every one of its connections (gloo_peers.h), and records it here; an error that
// names such an address can then name the rank that was lost. Addresses are unique among the
// live connections of a process, so one directory serves every group: the same process behind
// two groups' connections is the same rank. destroy_process_group forgets them all.
//
// Thread-safety: every function may be called from any thread (one mutex).
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace ddp::detail {

struct PeerIdentity {
  int rank = -1;     // global rank
  std::string host;  // its host name
  int pid = 0;
  /// When its process started, in clock ticks since boot (/proc/PID/stat): tells it from a later
  /// process that was given the same pid. 0 when unknown.
  unsigned long long start_time = 0;
  /// "rank 1 (pid 4242 on host-a)"
  std::string describe() const;
  /// "RANK PID HOST PID_SPACE START_TIME", what a rank publishes in the store; parse() reads it
  /// back.
  std::string text() const;
  static PeerIdentity parse(const std::string& text);
  /// This process, as `rank`.
  static PeerIdentity of_this_process(int rank);
  /// True only when this process can tell for sure that the peer has exited: it ran on this
  /// host, in this process's PID namespace, and its pid is gone. False when it cannot tell.
  bool known_to_have_exited() const;
  /// True only when this process can tell for sure that the peer still runs: it ran on this
  /// host, in this PID namespace, and its pid is a live process that started when it did.
  bool known_to_be_running() const;
  /// True only when this process can tell for sure that the peer is stopped (SIGSTOP, Ctrl-Z, a
  /// debugger): it runs on this host and cannot answer until it is continued.
  bool known_to_be_stopped() const;
  /// Where its pid means something: the machine's boot id and the PID namespace. Host names can
  /// repeat (containers, copied images); these cannot. Empty when unknown.
  std::string pid_space;
};

/// "rank 2 (pid 42 on host-a) is stopped (...).", what a timeout message should say first, for each
/// of `peers` known to be stopped; "" when none is.
std::string describe_stopped(const std::vector<PeerIdentity>& peers);

/// Records that the connection whose far end gloo calls `address` ("[10.0.0.2]:51234") leads to
/// `peer`.
void remember_peer_address(const std::string& address, const PeerIdentity& peer);

/// The peer whose address `text` (a transport's error message) names, if any.
std::optional<PeerIdentity> peer_named_in(const std::string& text);

/// A peer of this process's gloo groups that is known to have exited, waiting up to `patience`
/// for one to be: a process that is killed closes its connections a moment before it can be
/// seen gone. This names the lost peer where gloo's message names an address that was not
/// published (gloo does not always report a connection by the address its peer gave for it).
std::optional<PeerIdentity> peer_known_to_have_exited(std::chrono::milliseconds patience);

/// Every peer in the directory, once each.
std::vector<PeerIdentity> known_peers();

/// Forgets every address (destroy_process_group: the connections are closed).
void forget_peer_addresses();

}  // namespace ddp::detail
