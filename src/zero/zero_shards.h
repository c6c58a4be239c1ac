// What a ZeroRedundancyOptimizer keeps besides its torch::optim::Optimizer base: the partition,
// the wrapped optimizer of this rank's part, and the consolidated state. Internal to src/zero/.
#pragma once

#include <ATen/core/ivalue.h>

#include <memory>
#include <vector>

#include "ddp/zero_redundancy_optimizer.h"
#include "zero/zero_partition.h"

namespace ddp {

struct ZeroRedundancyOptimizer::Shards {
  ZeroOptimizerFactory factory;
  ProcessGroup group;
  ZeroExchange exchange = ZeroExchange::kBroadcast;
  int rank = 0;        // in the group
  int world_size = 1;  // of the group
  c10::Device device{c10::kCPU};
  std::vector<at::Tensor> params;  // every parameter, numbered across the groups
  detail::ZeroPartition partition;
  std::vector<std::vector<int64_t>> owned_flat;  // per rank: its indices, group after group
  std::unique_ptr<torch::optim::Optimizer> local;
  /// consolidate_state_dict's result, on the rank it went to.
  c10::IValue consolidated;
  bool has_consolidated = false;
};

namespace detail {
/// The bytes of `optimizer`'s state tensors (what ZeRO divides between the ranks).
int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer);
}  // namespace detail

}  // namespace ddp
