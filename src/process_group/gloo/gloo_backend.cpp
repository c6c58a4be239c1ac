#include "process_group/gloo/gloo_backend.h"

#include <algorithm>
#include <thread>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <vector>

#include "common/error_context.h"
#include "process_group/c10d_backend.h"
#include "process_group/gloo/gloo_connect.h"

namespace ddp::detail {
namespace {

std::vector<int> ranks_that_arrived(c10d::Store& store, int group_size) {
  std::vector<int> arrived;
  for (int rank = 0; rank < group_size; ++rank) {
    try {
      if (store.check({arrival_key(rank)})) arrived.push_back(rank);
    } catch (const std::exception&) {
      // The store itself is gone (rank 0 died): nothing more to learn.
    }
  }
  return arrived;
}

// All ranks time out together. For the world group, group rank 0 hosts the store: if it exits
// at once, the others can no longer ask the store who arrived. So the others say when they have
// looked, and rank 0 waits for that, briefly and within bounds, before it reports its own error.
void wait_until_every_arrived_rank_has_looked(c10d::Store& store, int group_rank,
                                              const std::vector<int>& arrived,
                                              std::chrono::milliseconds timeout) {
  const std::string key = "ddp_rendezvous_diagnosed";
  try {
    if (group_rank != 0) {
      store.add(key, 1);
      return;
    }
    const auto deadline =
        std::chrono::steady_clock::now() + std::min(timeout, std::chrono::milliseconds(10000));
    const int64_t others = static_cast<int64_t>(arrived.size()) - 1;
    while (store.add(key, 0) < others && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  } catch (const std::exception&) {
    // The store is gone: there is nobody left to wait for.
  }
}

}  // namespace

std::shared_ptr<Backend> make_gloo_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                           int group_rank, int group_size,
                                           std::chrono::milliseconds timeout,
                                           const GlooDeviceChoice& device,
                                           const std::string& operation) {
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  // Two threads, as torch.distributed's Python binding uses: one collective can progress while
  // the next is being queued.
  options->threads = 2;
  try {
    if (!device.interface.empty()) {
      options->devices.push_back(
          c10d::ProcessGroupGloo::createDeviceForInterface(device.interface));
    } else if (!device.hostname.empty()) {
      options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(device.hostname));
    } else {
      options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    }
  } catch (const std::exception& error) {
    rethrow_backend_failure(
        operation + " (creating the gloo device" +
            (device.interface.empty() ? std::string()
                                      : " for GLOO_SOCKET_IFNAME=" + device.interface) +
            ")",
        error);
  }
  c10::intrusive_ptr<GlooWithConnections> group;
  // A timeout, this rank's own or one that another rank reported (its note, as a TimeoutError),
  // is named by the ranks that never arrived where there are any: they are its cause, whichever
  // waiting rank's clock ran out first.
  auto name_missing_ranks = [&](const std::vector<int>& arrived) {
    wait_until_every_arrived_rank_has_looked(*store, group_rank, arrived, timeout);
    if (static_cast<int>(arrived.size()) < group_size) {
      std::vector<int> missing;
      for (int rank = 0; rank < group_size; ++rank) {
        if (std::find(arrived.begin(), arrived.end(), rank) == arrived.end()) {
          missing.push_back(rank);
        }
      }
      fail<TimeoutError>(operation, "only " + std::to_string(arrived.size()) + " of " +
                                        std::to_string(group_size) + " ranks arrived within " +
                                        std::to_string(timeout.count()) +
                                        " ms (missing group ranks: " + join_ints(missing) +
                                        "). Start every rank with the same world size, or raise "
                                        "InitOptions().timeout.");
    }
  };
  try {
    group = connect_gloo_group(store, group_rank, group_size, options, timeout, operation);
  } catch (const TimeoutError&) {
    // Only where ranks are missing: a peer's timeout among ranks that all arrived (one stopped,
    // say) is already named, and nobody would wait here for a stopped rank to look. And only
    // where the store answered every question: rank 0, which hosts it, may have reported the
    // peer's timeout and exited already, and a rank the store could not be asked about is not
    // a rank that never arrived. It still answers after the questions, so it answered them all.
    const std::vector<int> arrived = ranks_that_arrived(*store, group_size);
    bool store_answers = false;
    try {
      store_answers = store->check({arrival_key(group_rank)});
    } catch (const std::exception&) {
    }
    if (store_answers && static_cast<int>(arrived.size()) < group_size) {
      name_missing_ranks(arrived);
    }
    throw;
  } catch (const DistributedError&) {
    throw;
  } catch (const std::exception& error) {
    name_missing_ranks(ranks_that_arrived(*store, group_size));
    rethrow_backend_failure(operation, error);
  }
  C10dTraits traits;
  traits.name = "gloo";
  traits.bfloat16 = false;  // ProcessGroupGloo's reductions have no bfloat16 kernel
  return std::make_shared<C10dBackend>(std::move(group), std::move(traits));
}

}  // namespace ddp::detail
