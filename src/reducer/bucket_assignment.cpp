#include "reducer/bucket_assignment.h"

#include <c10/util/Exception.h>

#include <map>
#include <tuple>

namespace ddp::detail {

std::vector<std::vector<size_t>> assign_buckets(const std::vector<TensorSpec>& tensors,
                                                const std::vector<size_t>& order,
                                                const std::vector<size_t>& limits) {
  TORCH_INTERNAL_ASSERT(!limits.empty(), "assign_buckets needs at least one limit");
  TORCH_INTERNAL_ASSERT(order.size() == tensors.size(), "order must list every tensor once");
  struct Open {
    std::vector<size_t> indices;
    size_t bytes = 0;
    size_t limit_index = 0;
  };
  using Key = std::tuple<int, int, int>;  // dtype, device type, device index
  std::map<Key, Open> open;
  std::vector<Key> open_order;  // first-seen order of the keys, for a deterministic tail
  std::vector<std::vector<size_t>> closed;
  for (size_t index : order) {
    const TensorSpec& spec = tensors.at(index);
    Key key{static_cast<int>(spec.dtype), static_cast<int>(spec.device.type()),
            spec.device.index()};
    auto [it, inserted] = open.try_emplace(key);
    if (inserted) open_order.push_back(key);
    Open& bucket = it->second;
    bucket.indices.push_back(index);
    bucket.bytes += spec.bytes;
    if (bucket.bytes >= limits[bucket.limit_index]) {
      closed.push_back(std::move(bucket.indices));
      bucket.indices.clear();
      bucket.bytes = 0;
      bucket.limit_index = std::min(bucket.limit_index + 1, limits.size() - 1);
    }
  }
  for (const Key& key : open_order) {
    if (!open[key].indices.empty()) closed.push_back(std::move(open[key].indices));
  }
  return closed;
}

}  // namespace ddp::detail
