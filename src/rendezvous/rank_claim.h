// Refuses, at rendezvous, processes that would corrupt the job: two claiming the same rank, or
// ranks started with different world sizes.
//
// Without this check such a job fails deep inside gloo (an "enforce fail" in its address
// exchange) or, worse, half-works. Each rank claims "its" rank in the store with compare-and-set
// and a token unique to its process (pid@host); a rank whose claim finds another process's token,
// or a world size other than its own, raises an error that names both processes. The process
// that claims second is refused at once; it also records the dispute in the store, and every
// rank of the job looks for one at the end of init_process_group (check_no_rank_dispute), so that
// the first claimant and the ranks that met it are refused too, naming both, instead of starting
// a job that cannot be right. A claimant that comes after the job's ranks have looked (a stray
// process started late) is refused alone: the running job is not disturbed. The check costs a few
// store round trips per rank and waits for nobody.
#pragma once

#include <chrono>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace ddp::rendezvous {

/// Throws MismatchError when another process claimed `rank` in `store`, or when a rank claimed
/// a different world size. The same process may claim again (a retried init).
void claim_rank(c10d::Store& store, int rank, int world_size);

/// Throws MismatchError: this process is the second to claim `rank`; `first` names the first
/// claimant ("pid 12 on host-a"), `about_first` says what is known of it. Records the dispute in
/// `job_store` (the store of the first claimant's job), whose ranks then refuse to start too.
[[noreturn]] void refuse_second_claimant(c10d::Store& job_store, int rank, int world_size,
                                         const std::string& first, const std::string& about_first);

/// Throws MismatchError, naming both processes, when some process was refused because it claimed
/// a rank that another process of this job holds. Called by every rank once the job is complete;
/// rank 0, whose process hosts the store, then waits (within `timeout`, at most 10 s) until the
/// others have read the dispute.
void check_no_rank_dispute(c10d::Store& store, int rank, int world_size,
                           std::chrono::milliseconds timeout);

}  // namespace ddp::rendezvous
