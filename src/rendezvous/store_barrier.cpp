#include "rendezvous/store_barrier.h"

#include <thread>

#include "common/error_context.h"

namespace ddp::rendezvous {

void store_based_barrier(c10d::Store& store, const std::string& key, int world_size,
                         std::chrono::milliseconds timeout, const std::string& operation) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int64_t arrived = store.add(key, 1);
  // Polling with add(key, 0), as PyTorch does, keeps us compatible with Python ranks, which never
  // set a completion key. The back-off stays short: this runs once per group creation.
  auto pause = std::chrono::microseconds(200);
  while (arrived < world_size) {
    if (std::chrono::steady_clock::now() > deadline) {
      detail::fail<TimeoutError>(
          operation, "timed out after " + std::to_string(timeout.count()) +
                         " ms waiting for the other ranks: only " + std::to_string(arrived) +
                         " of " + std::to_string(world_size) +
                         " ranks arrived. Start every rank (the same world size on " +
                         "each), or raise InitOptions().timeout.");
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(10000));
    arrived = store.add(key, 0);
  }
}

}  // namespace ddp::rendezvous
