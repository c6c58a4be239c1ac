// Join: the context of uneven inputs (include/ddp/join.h).
//
// One exchange serves both sides of an iteration: a rank still training adds itself to the
// "training" ranks (notify_join_context, from the first joinable), a rank in finish() adds nothing
// there and, with throw_on_early_termination, itself to the "terminating" ranks. So every rank
// learns in the same all-reduce who still trains and whether the loop ends by an error.
#include "ddp/join.h"

#include <string>

#include "collectives/unverified.h"
#include "common/error_context.h"
#include "trace/flight_recorder.h"

namespace ddp {
namespace {

struct JoinRound {
  std::vector<int> training;     // global ranks that have not finished
  std::vector<int> terminating;  // global ranks that finished with throw_on_early_termination
};

JoinRound exchange_round(Joinable& first, bool training, bool terminating) {
  const ProcessGroup group = first.join_process_group();
  const int size = group.size();
  std::vector<int64_t> mine(2 * size, 0);
  if (training) mine[group.rank()] = 1;
  if (terminating) mine[size + group.rank()] = 1;
  detail::TraceLabel label("ddp::Join round");
  const auto sums = detail::sum_counts(mine, group, first.join_device());
  const auto ranks = group.ranks();
  JoinRound round;
  for (int i = 0; i < size; ++i) {
    if (sums[i] > 0) round.training.push_back(ranks[i]);
    if (sums[size + i] > 0) round.terminating.push_back(ranks[i]);
  }
  return round;
}

std::string ranks_text(const std::vector<int>& ranks) {
  return std::string(ranks.size() == 1 ? "rank " : "ranks ") + detail::join_ints(ranks);
}

}  // namespace

Join::Join(std::vector<Joinable*> joinables, JoinOptions options)
    : joinables_(std::move(joinables)), options_(options) {
  constexpr const char* kOperation = "Join";
  if (joinables_.empty()) {
    detail::fail<InvalidArgumentError>(kOperation,
                                       "needs at least one joinable (the DistributedDataParallel)");
  }
  for (size_t i = 0; i < joinables_.size(); ++i) {
    if (!joinables_[i]) {
      detail::fail<InvalidArgumentError>(kOperation,
                                         "joinable " + std::to_string(i) + " is a null pointer");
    }
    if (joinables_[i]->in_join_) {
      detail::fail<InvalidArgumentError>(
          kOperation, "joinable " + std::to_string(i) +
                          " is already in another Join; finish or destroy that one first");
    }
    if (joinables_[i]->join_process_group().name() != joinables_[0]->join_process_group().name()) {
      detail::fail<InvalidArgumentError>(
          kOperation, "all joinables must use one process group, but joinable " +
                          std::to_string(i) + " uses '" +
                          joinables_[i]->join_process_group().name() + "' and joinable 0 '" +
                          joinables_[0]->join_process_group().name() + "'");
    }
  }
  if (!options_.enable()) return;
  try {
    for (size_t i = 0; i < joinables_.size(); ++i) {
      hooks_.push_back(joinables_[i]->join_hook(options_));
      joinables_[i]->join_options_ = options_;
      joinables_[i]->is_first_ = i == 0;
      joinables_[i]->in_join_ = true;
    }
  } catch (...) {
    leave();
    throw;
  }
}

Join::~Join() { leave(); }

void Join::leave() {
  for (Joinable* joinable : joinables_) {
    if (joinable) joinable->in_join_ = false;
  }
  hooks_.clear();
}

void Join::finish() {
  if (finished_) {
    detail::fail<InvalidArgumentError>("Join.finish", "finish() was already called on this Join");
  }
  finished_ = true;
  if (!options_.enable()) return;
  struct LeaveAtEnd {
    Join* join;
    ~LeaveAtEnd() { join->leave(); }
  } leave_at_end{this};
  Joinable& first = *joinables_[0];
  bool is_last_joiner = true;
  if (first.join_process_group().size() > 1) {
    for (;;) {
      const JoinRound round = exchange_round(first, /*training=*/false,
                                             options_.throw_on_early_termination());
      if (round.training.empty()) break;
      if (options_.throw_on_early_termination()) {
        detail::fail<UnevenInputsError>(
            "Join.finish",
            "this rank ran out of inputs while " + ranks_text(round.training) +
                " still had some. With JoinOptions().throw_on_early_termination(true) every "
                "rank raises this error in the same iteration: catch ddp::UnevenInputsError to "
                "leave the loop on every rank, or leave the option false to let finish() shadow "
                "the ranks still training.");
      }
      for (auto& hook : hooks_) hook->main_hook();
      is_last_joiner = false;
    }
  }
  for (auto& hook : hooks_) hook->post_hook(is_last_joiner);
}

void Join::notify_join_context(Joinable& joinable) {
  if (!joinable.is_first_joinable() || joinable.join_process_group().size() == 1) return;
  const JoinRound round = exchange_round(joinable, /*training=*/true, /*terminating=*/false);
  if (!round.terminating.empty()) {
    detail::fail<UnevenInputsError>(
        "Join",
        ranks_text(round.terminating) +
            " ran out of inputs while this rank still has some, and the Join was made with "
            "JoinOptions().throw_on_early_termination(true): every rank raises this error in "
            "the same iteration. Catch ddp::UnevenInputsError to leave the loop on every rank.");
  }
}

}  // namespace ddp
