// How ZeroRedundancyOptimizer splits the parameters between ranks: PyTorch's greedy balance.
//
// Within each parameter group, the parameters are taken largest first (a stable sort, so equal
// sizes keep their order) and each goes to the rank with the fewest elements so far (the lowest
// such rank on a tie); the running sizes carry over from one group to the next. The result
// depends only on the sizes, so every rank computes the same one.
#pragma once

#include <cstdint>
#include <vector>

namespace ddp::detail {

struct ZeroPartition {
  /// owned[rank][group]: the global indices (numbered across the groups) rank owns in group, in
  /// the order they were assigned: the order of its wrapped optimizer's groups.
  std::vector<std::vector<std::vector<int64_t>>> owned;
  /// owner[global index]: the rank that owns it.
  std::vector<int> owner;
};

/// numels[group][i]: the element count of parameter i of group.
ZeroPartition partition_by_size(const std::vector<std::vector<int64_t>>& numels, int world_size);

}  // namespace ddp::detail
