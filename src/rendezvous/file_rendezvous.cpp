#include "rendezvous/file_rendezvous.h"

#include <optional>
#include <sstream>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "common/peer_directory.h"
#include "common/store_text.h"
#include "rendezvous/rank_claim.h"
#include "rendezvous/store_factory.h"

namespace ddp::rendezvous {
namespace {

using detail::bytes_of;
using detail::PeerIdentity;
using detail::text_of;

// The file's generation now; counters are decimal text in a FileStore (add writes them so).
const std::string kGenerationKey = "ddp_generation";

std::string generation_prefix(int64_t generation) {
  return "generation/" + std::to_string(generation);
}
std::string arrivals_key(int64_t generation) {
  return generation_prefix(generation) + "/ddp_arrivals";
}
std::string claim_key(int rank) { return "ddp_file_rank/" + std::to_string(rank); }

// Who holds a rank, and in which generation: "GENERATION IDENTITY".
struct Claim {
  int64_t generation = -1;
  PeerIdentity owner;

  std::string text() const { return std::to_string(generation) + " " + owner.text(); }
  static Claim parse(const std::string& text) {
    Claim claim;
    std::istringstream in(text);
    in >> claim.generation >> std::ws;
    std::string identity;
    std::getline(in, identity);
    claim.owner = PeerIdentity::parse(identity);
    return claim;
  }
  std::string names() const { return "pid " + std::to_string(owner.pid) + " on " + owner.host; }
};

std::optional<Claim> claim_of(c10d::Store& file, int rank) {
  if (!file.check({claim_key(rank)})) return std::nullopt;
  return Claim::parse(text_of(file.get(claim_key(rank))));
}

bool incomplete(c10d::Store& file, int64_t generation, int world_size) {
  return file.add(arrivals_key(generation), 0) < world_size;
}

// Moves the file on from `generation` (unless another rank already did); returns the current one.
int64_t leave_generation(c10d::Store& file, int64_t generation) {
  file.compareSet(kGenerationKey, bytes_of(std::to_string(generation)),
                  bytes_of(std::to_string(generation + 1)));
  return file.add(kGenerationKey, 0);
}

// Some rank of `generation` was claimed by a process known to have exited before the rendezvous
// completed: a crashed run's, which this one must not join. Or the file has moved past it since
// this rank read it: the ranks of this run that saw the crashed run's claims left it (and may have
// claimed their ranks anew, hiding those claims), or it filled; either way it is not this rank's.
bool abandoned(c10d::Store& file, int64_t generation, int world_size) {
  if (file.add(kGenerationKey, 0) > generation) return true;
  if (!incomplete(file, generation, world_size)) return false;
  for (int rank = 0; rank < world_size; ++rank) {
    const auto claim = claim_of(file, rank);
    if (claim && claim->generation == generation && claim->owner.known_to_have_exited()) {
      return true;
    }
  }
  return false;
}

// Claims `rank` for this process in `generation` (see the header). Returns the claim made.
Claim claim_rank_in_file(const c10::intrusive_ptr<c10d::Store>& file, int rank, int world_size,
                         int64_t generation) {
  Claim mine{generation, PeerIdentity::of_this_process(rank)};
  for (;;) {
    std::vector<uint8_t> current;
    if (auto claim = claim_of(*file, rank)) {
      current = bytes_of(claim->text());
      const bool same_process = claim->owner.pid == mine.owner.pid &&
                                claim->owner.host == mine.owner.host &&
                                claim->owner.start_time == mine.owner.start_time;
      if (!same_process) {
        std::string about;
        if (claim->owner.known_to_be_running()) {
          about = "first, still running";
        } else if (!claim->owner.known_to_have_exited() &&
                   incomplete(*file, claim->generation, world_size)) {
          about =
              "first, waiting in this file's rendezvous; if it no longer runs, the file was "
              "left by a run that failed: delete it";
        }
        if (!about.empty()) {
          auto first_job = c10::make_intrusive<c10d::PrefixStore>(
              generation_prefix(claim->generation) + "/" + kDefaultGroupPrefix, file);
          refuse_second_claimant(*first_job, rank, world_size, claim->names(), about);
        }
      }
    }
    if (text_of(file->compareSet(claim_key(rank), current, bytes_of(mine.text()))) == mine.text()) {
      return mine;
    }
  }
}

}  // namespace

c10::intrusive_ptr<c10d::Store> join_file_rendezvous(const c10::intrusive_ptr<c10d::Store>& file,
                                                     int rank, int world_size) {
  int64_t generation = file->add(kGenerationKey, 0);
  while (abandoned(*file, generation, world_size)) generation = leave_generation(*file, generation);
  Claim mine = claim_rank_in_file(file, rank, world_size, generation);
  for (;;) {
    const int64_t arrival = file->add(arrivals_key(generation), 1);
    if (arrival == world_size) leave_generation(*file, generation);
    if (arrival <= world_size) break;
    // The generation filled before this rank was counted: the next one is this rank's.
    generation = std::max(generation + 1, file->add(kGenerationKey, 0));
    mine.generation = generation;
    file->set(claim_key(rank), bytes_of(mine.text()));
  }
  return c10::make_intrusive<c10d::PrefixStore>(generation_prefix(generation), file);
}

}  // namespace ddp::rendezvous
