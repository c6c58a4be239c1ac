// Making c10d's gloo group within the group timeout, and naming the member that stopped it.
//
// gloo waits for a peer's first connection five times the group timeout (its pair.h: "use a
// longer timeout when waiting for initial connect"), and ProcessGroupGloo's constructor connects
// its pairs one after another: a rank that died just after it published its address held the
// others for 5x the timeout and more, and they could not say who it was. So:
// - every member says it has arrived, and who it is (PeerIdentity), before gloo's rendezvous;
// - the group is made on a thread of its own, while the caller looks, four times a second (less
//   often in groups of over 31), for members that have exited on this host, and for what the
//   other members found;
// - a member that gives up leaves a note in the store ("rank 2 is lost", or its error), so that
//   members on other hosts, which cannot see that process, learn it at their next look;
// - group rank 0, whose process hosts the store, waits up to 3 s for the others to have read the
//   notes before it reports, as a rank that exits at once would take the store with it;
// - past the timeout plus kConnectAllowance, the caller reports a TimeoutError. The thread is
//   left to end when gloo gives up; it holds the half-made group until then, but not the store,
//   which it reaches through a ReleasableStore that the caller releases when it gives up.
// The store takes requests from both threads: c10d's store clients serve one at a time.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <vector>

namespace ddp::detail {

/// c10d's ProcessGroupGloo, with its gloo contexts (the connections) in reach: gloo_peers.h
/// learns from them which rank is behind each connection.
class GlooWithConnections : public c10d::ProcessGroupGloo {
 public:
  using c10d::ProcessGroupGloo::ProcessGroupGloo;
  const std::vector<std::shared_ptr<::gloo::Context>>& connections() const { return contexts_; }
};

/// The key under which group rank `group_rank` says it has arrived and who it is. gloo's own
/// keys differ between gloo versions; these do not.
std::string arrival_key(int group_rank);

/// Says this member has arrived and makes the group, within `timeout` + kConnectAllowance.
/// Throws a PeerLostError naming a member that exited after it arrived, a DistributedError
/// carrying what another member found, a TimeoutError past the deadline, or what gloo threw.
c10::intrusive_ptr<GlooWithConnections> connect_gloo_group(
    const c10::intrusive_ptr<c10d::Store>& store, int group_rank, int group_size,
    const c10::intrusive_ptr<c10d::ProcessGroupGloo::Options>& options,
    std::chrono::milliseconds timeout, const std::string& operation);

}  // namespace ddp::detail
