#include "zero/zero_partition.h"

#include <algorithm>
#include <numeric>

namespace ddp::detail {

ZeroPartition partition_by_size(const std::vector<std::vector<int64_t>>& numels, int world_size) {
  ZeroPartition result;
  result.owned.assign(world_size, std::vector<std::vector<int64_t>>(numels.size()));
  std::vector<int64_t> sizes(world_size, 0);
  int64_t first_index = 0;
  for (size_t group = 0; group < numels.size(); ++group) {
    const auto& sizes_in_group = numels[group];
    std::vector<int64_t> order(sizes_in_group.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return sizes_in_group[a] > sizes_in_group[b]; });
    result.owner.resize(result.owner.size() + sizes_in_group.size());
    for (int64_t i : order) {
      const int rank =
          static_cast<int>(std::min_element(sizes.begin(), sizes.end()) - sizes.begin());
      result.owned[rank][group].push_back(first_index + i);
      result.owner[first_index + i] = rank;
      sizes[rank] += sizes_in_group[i];
    }
    first_index += static_cast<int64_t>(sizes_in_group.size());
  }
  return result;
}

}  // namespace ddp::detail
