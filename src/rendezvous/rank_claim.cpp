#include "rendezvous/rank_claim.h"

#include <unistd.h>

#include <climits>
#include <sstream>

#include "common/error_context.h"

namespace ddp::rendezvous {
namespace {

constexpr const char* kOperation = "init_process_group";

std::vector<uint8_t> bytes(const std::string& text) { return {text.begin(), text.end()}; }

std::string text(const std::vector<uint8_t>& bytes) { return {bytes.begin(), bytes.end()}; }

// "pid 1234 on host-a": what a person needs to find the process.
std::string this_process() {
  char host[HOST_NAME_MAX + 1] = {};
  ::gethostname(host, sizeof(host) - 1);
  return "pid " + std::to_string(::getpid()) + " on " + host;
}

void check_claims(c10d::Store& store, int rank, int world_size) {
  const std::string me = this_process();
  const std::string rank_key = "ddp_rank_owner/" + std::to_string(rank);
  const std::string owner = text(store.compareSet(rank_key, {}, bytes(me)));
  if (owner != me) {
    detail::fail<MismatchError>(
        kOperation, "rank " + std::to_string(rank) + " is claimed by two processes: " + me +
                        " (this one) and " + owner +
                        " (first). Give every process its own RANK in 0.." +
                        std::to_string(world_size - 1) +
                        " (a launcher does), and stop stray processes of an earlier run.");
  }
  // The first rank to get here sets the job's world size; every other rank compares its own.
  const std::string mine = std::to_string(world_size) + " " + std::to_string(rank) + " " + me;
  std::istringstream first(text(store.compareSet("ddp_world_size", {}, bytes(mine))));
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

void claim_rank(c10d::Store& store, int rank, int world_size) {
  try {
    check_claims(store, rank, world_size);
  } catch (const std::exception& error) {  // a store that fails; our own errors pass unchanged
    detail::rethrow_backend_failure(kOperation, error);
  }
}

}  // namespace ddp::rendezvous
