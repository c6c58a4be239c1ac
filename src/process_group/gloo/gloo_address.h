// Which local address gloo listens on, when the user has not named an interface.
//
// c10d binds gloo to the address this host's name resolves to, and falls back to loopback when
// that fails, silently. On clusters the name often resolves to nothing, or to 127.0.1.1 (Debian's
// /etc/hosts), or to a network the other hosts cannot reach: a multi-host job then cannot
// connect. The other hosts reach this one the way this one reaches the rendezvous host
// (MASTER_ADDR), so the address to listen on is the source address of the route there.
#pragma once

#include <string>

namespace ddp::detail {

/// The source address (numeric IPv4 or IPv6) that the kernel would use to reach
/// `rendezvous_host` (a name or an address). When that route is this host's loopback (the
/// rendezvous host is this host, named through 127.0.1.1), the first address of an interface
/// that is up and not loopback; empty when there is none, or the host does not resolve.
std::string address_facing(const std::string& rendezvous_host);

}  // namespace ddp::detail
