#include "rendezvous/rank_claim.h"

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <sstream>

#include "common/error_context.h"
#include "common/store_text.h"

namespace ddp::rendezvous {
namespace {

using detail::bytes_of;
using detail::text_of;

constexpr const char* kOperation = "init_process_group";
constexpr const char* kDisputeKey = "ddp_rank_dispute";

std::string rank_fix(int world_size) {
  return "Give every process its own RANK in 0.." + std::to_string(world_size - 1) +
         " (a launcher does), and stop stray processes of an earlier run.";
}

// "pid 1234 on host-a": what a person needs to find the process.
std::string this_process() {
  char host[HOST_NAME_MAX + 1] = {};
  ::gethostname(host, sizeof(host) - 1);
  return "pid " + std::to_string(::getpid()) + " on " + host;
}

void check_claims(c10d::Store& store, int rank, int world_size) {
  const std::string me = this_process();
  const std::string rank_key = "ddp_rank_owner/" + std::to_string(rank);
  const std::string owner = text_of(store.compareSet(rank_key, {}, bytes_of(me)));
  if (owner != me) refuse_second_claimant(store, rank, world_size, owner, "first");
  // The first rank to get here sets the job's world size; every other rank compares its own.
  const std::string mine = std::to_string(world_size) + " " + std::to_string(rank) + " " + me;
  std::istringstream first(text_of(store.compareSet("ddp_world_size", {}, bytes_of(mine))));
  int first_size = -1;
  int first_rank = -1;
  std::string first_process;
  first >> first_size >> first_rank >> std::ws;
  std::getline(first, first_process);
  if (first_size != world_size) {
    detail::fail<MismatchError>(
        kOperation, "the ranks disagree on the world size: this rank (rank " +
                        std::to_string(rank) + ", " + me + ") has world size " +
                        std::to_string(world_size) + ", but rank " + std::to_string(first_rank) +
                        " (" + first_process + ") has world size " + std::to_string(first_size) +
                        ". Start every rank with the same WORLD_SIZE.");
  }
}

}  // namespace

void refuse_second_claimant(c10d::Store& job_store, int rank, int world_size,
                            const std::string& first, const std::string& about_first) {
  const std::string me = this_process();
  // Tell the job: its ranks look for this at the end of their init (check_no_rank_dispute).
  const std::string dispute = "rank " + std::to_string(rank) +
                              " is claimed by two processes: " + first + " (first) and " + me +
                              " (second). " + rank_fix(world_size);
  job_store.compareSet(kDisputeKey, {}, bytes_of(dispute));
  detail::fail<MismatchError>(kOperation, "rank " + std::to_string(rank) +
                                              " is claimed by two processes: " + me +
                                              " (this one) and " + first + " (" + about_first +
                                              "). " + rank_fix(world_size));
}

void check_no_rank_dispute(c10d::Store& store, int rank, int world_size,
                           std::chrono::milliseconds timeout) {
  std::string dispute;
  try {
    if (!store.check({kDisputeKey})) return;
    dispute = text_of(store.get(kDisputeKey));
    // Rank 0 hosts the store: it leaves only once the others have read the dispute (or a bounded
    // while), so that they report it rather than a lost store.
    if (rank != 0) {
      store.set(kDisputeKey + std::string("/seen/") + std::to_string(rank), bytes_of("1"));
    } else {
      std::vector<std::string> seen;
      for (int other = 1; other < world_size; ++other) {
        seen.push_back(kDisputeKey + std::string("/seen/") + std::to_string(other));
      }
      try {
        if (!seen.empty()) store.wait(seen, std::min(timeout, std::chrono::milliseconds(10000)));
      } catch (const std::exception&) {
        // A rank that looked before the dispute was recorded will not say it saw it.
      }
    }
  } catch (const std::exception& error) {
    detail::rethrow_backend_failure(kOperation, error);
  }
  detail::fail<MismatchError>(kOperation, "this job cannot start: " + dispute);
}

void claim_rank(c10d::Store& store, int rank, int world_size) {
  try {
    check_claims(store, rank, world_size);
  } catch (const std::exception& error) {  // a store that fails; our own errors pass unchanged
    detail::rethrow_backend_failure(kOperation, error);
  }
}

}  // namespace ddp::rendezvous
