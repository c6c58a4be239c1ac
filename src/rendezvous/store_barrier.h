// The store-based barrier that ends init_process_group and new_group, compatible with
// torch.distributed's _store_based_barrier (same key, same counting), so that C++ and Python ranks
// can share one job. On timeout it says how many ranks arrived.
#pragma once

#include <chrono>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace ddp::rendezvous {

/// REQUIRES: `store` and `key` are where and how torch.distributed of the libtorch in use counts
/// this barrier (compat::creation_barrier; the default store for init, the new groups' parent
/// store for new_group).
void store_based_barrier(c10d::Store& store, const std::string& key, int world_size,
                         std::chrono::milliseconds timeout, const std::string& operation);

}  // namespace ddp::rendezvous
