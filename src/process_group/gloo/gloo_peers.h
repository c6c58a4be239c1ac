// Which rank is at the far end of each of this process's gloo connections.
//
// When a peer dies, gloo names only the socket address of the connection that broke. Right after
// a gloo group is made (every connection is up), each member publishes in the group's store its
// global rank, pid, host and the local address of each of its connections, which is exactly the
// address its peers' gloo names when that connection breaks; each member reads the others' and
// records them in the peer directory (common/peer_directory.h). This works on one host (every
// address is 127.0.0.1: the ports tell them apart) and across hosts, and costs one store write
// and one read per member, as gloo's own rendezvous does.
//
// Called once per gloo group, by every member, on the thread that makes the group.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "common/peer_directory.h"

namespace gloo {
class Context;
}

namespace ddp::detail {

/// Publishes this member's connections and learns the others'. `members`: who each group rank
/// said it was when it arrived (pid 0 for a Python rank, which publishes nothing: its lost
/// connections stay unnamed). A member that does not publish within `timeout` stopped or exited
/// right after the connections were made: TimeoutError naming the silent members.
void learn_gloo_peers(const std::vector<std::shared_ptr<::gloo::Context>>& contexts,
                      c10d::Store& store, int group_rank, const std::vector<PeerIdentity>& members,
                      std::chrono::milliseconds timeout, const std::string& operation);

}  // namespace ddp::detail
