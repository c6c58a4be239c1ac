// Joins the current run of a rendezvous file (file://), refusing a second process with one rank.
//
// A FileStore file outlives its jobs: a crashed run leaves it behind (a clean one removes it), and
// a restart reuses it. Its keys would make the next run's rendezvous see arrivals that never
// happened, so each run's keys live under "generation/<g>/": the file counts its current
// generation and each generation its arrivals, and the rank that completes a generation's
// rendezvous moves the file on to the next one, where a later run starts afresh.
//
// Before it counts its arrival, a rank claims its rank among the file's own keys, with its process
// and generation. A second process claiming the same rank is refused, naming both
// (MismatchError), while the first is known to run on this host or, on another host, waits in a
// rendezvous that is not complete. Refused, it takes no place in a generation (which would push a
// rank of the job into the next one, to wait there alone), and it records the dispute in the first
// one's generation, whose ranks then refuse to start too (rank_claim.h). A first claimant known to
// have exited belongs to an earlier run: the claim passes on, and a generation whose rendezvous
// such a process left incomplete is abandoned. Not recognised: a second claimant on another host
// once the job has started (it waits alone in the next generation and times out).
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

namespace ddp::rendezvous {

/// The store of this rank's generation of `file` (a FileStore). Throws MismatchError when another
/// process holds `rank` (see above).
c10::intrusive_ptr<c10d::Store> join_file_rendezvous(const c10::intrusive_ptr<c10d::Store>& file,
                                                     int rank, int world_size);

}  // namespace ddp::rendezvous
