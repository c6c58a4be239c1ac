// monitored_barrier: a barrier through the group's store that names the ranks that did not come.
//
// Rank 0 of the group waits for every other rank's arrival key until the deadline, then collects
// ALL missing ranks (PyTorch's wait_all_ranks=True behaviour: a complete list helps more than the
// first straggler), and publishes the outcome under a release key. The others publish their
// arrival and wait for the release (up to twice the timeout, since rank 0 answers only at its own
// deadline), so they too learn which ranks were missing.
#include <thread>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "collectives/collective_call.h"
#include "common/error_context.h"
#include "common/store_text.h"
#include "ddp/collectives.h"

namespace ddp {
namespace {

using detail::bytes_of;

bool wait_for_key(c10d::Store& store, const std::string& key,
                  std::chrono::steady_clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  if (left.count() <= 0) return store.check({key});
  try {
    store.wait({key}, left);
    return true;
  } catch (const std::exception&) {
    return store.check({key});  // timed out (or raced the deadline)
  }
}

}  // namespace

void monitored_barrier(std::chrono::milliseconds timeout, const ProcessGroup& group) {
  detail::CollectiveCall call("monitored_barrier", detail::Collective::kBarrier, group);
  auto& state = call.group();
  c10d::Store& store = *state.store;
  const std::string prefix =
      "monitored_barrier/" + std::to_string(state.monitored_barrier_count++) + "/";
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const std::string release = prefix + "release";
  try {
    if (state.group_rank != 0) {
      store.set(prefix + std::to_string(state.group_rank), bytes_of("1"));
      // Rank 0 gives its verdict only when its own deadline passes: allow it the same time again.
      if (!wait_for_key(store, release, deadline + timeout)) {
        call.fail<TimeoutError>("rank " + std::to_string(state.global_ranks[0]) +
                                " (group rank 0) did not release the barrier within " +
                                std::to_string(2 * timeout.count()) +
                                " ms: it has not arrived, or is itself waiting "
                                "for another rank; see its error");
      }
      auto outcome = store.get(release);
      std::string text(outcome.begin(), outcome.end());
      if (text != "ok") {
        call.fail<TimeoutError>("this rank arrived, but rank 0 reports that ranks " + text +
                                " failed to pass the barrier within " +
                                std::to_string(timeout.count()) + " ms");
      }
      return;
    }
    std::vector<int> missing;
    for (int peer = 1; peer < state.size(); ++peer) {
      if (!wait_for_key(store, prefix + std::to_string(peer), deadline)) {
        missing.push_back(state.global_ranks[peer]);
      }
    }
    store.set(release, bytes_of(missing.empty() ? "ok" : detail::join_ints(missing)));
    if (!missing.empty()) {
      call.fail<TimeoutError>(
          std::string(missing.size() == 1 ? "rank " : "ranks ") + detail::join_ints(missing) +
          " failed to pass monitored_barrier within " + std::to_string(timeout.count()) + " ms (" +
          std::to_string(missing.size()) + " of " + std::to_string(state.size()) +
          " ranks missing)");
    }
  } catch (const std::exception& error) {  // our own errors pass through unchanged
    detail::rethrow_backend_failure(call.operation(), error);
  }
}

void monitored_barrier(const ProcessGroup& group) {
  monitored_barrier(group.state()->timeout, group);
}

}  // namespace ddp
