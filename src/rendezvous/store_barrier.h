// The store-based barrier that ends init_process_group and new_group, compatible with
// torch.distributed's _store_based_barrier (same key, same counting), so that C++ and Python ranks
// can share one job. On timeout it says how many ranks arrived.
#pragma once

#include <chrono>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace ddp::rendezvous {

/// REQUIRES: `store` is the default store ("default_pg" prefix); `key` is the barrier's, as
/// compat::creation_barrier names it for the libtorch in use.
void store_based_barrier(c10d::Store& store, const std::string& key, int world_size,
                         std::chrono::milliseconds timeout, const std::string& operation);

}  // namespace ddp::rendezvous
