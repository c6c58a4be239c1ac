// Refuses, at rendezvous, processes that would corrupt the job: two claiming the same rank, or
// ranks started with different world sizes.
//
// Without this check such a job fails deep inside gloo (an "enforce fail" in its address
// exchange) or, worse, half-works. Each rank claims "its" rank in the store with compare-and-set
// and a token unique to its process (pid@host); a rank whose claim finds another process's token,
// or a world size other than its own, raises an error that names both processes. The check costs
// two store round trips per rank and waits for nobody: the process that claims second is the one
// refused, at once; the first proceeds (and, if the job cannot complete, times out as usual).
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

namespace ddp::rendezvous {

/// Throws MismatchError when another process claimed `rank` in `store`, or when a rank claimed
/// a different world size. The same process may claim again (a retried init).
void claim_rank(c10d::Store& store, int rank, int world_size);

}  // namespace ddp::rendezvous
