#include "fully_shard/shard_layout.h"

#include <algorithm>

namespace ddp::detail {

int64_t ShardedParameter::rows_of(int rank) const {
  return std::clamp<int64_t>(rows - rank * chunk_rows, 0, chunk_rows);
}

int64_t ShardedParameter::first_row_of(int rank) const {
  return std::min<int64_t>(rank * chunk_rows, rows);
}

ShardLayout ShardLayout::of(const std::vector<std::vector<int64_t>>& shapes, int group_size) {
  ShardLayout layout;
  for (const auto& shape : shapes) {
    ShardedParameter parameter;
    parameter.shape = shape;
    parameter.rows = shape.empty() ? 1 : shape[0];
    parameter.row_numel = 1;
    for (size_t d = 1; d < shape.size(); ++d) parameter.row_numel *= shape[d];
    parameter.chunk_rows = (parameter.rows + group_size - 1) / group_size;
    parameter.shard_offset = layout.shard_numel;
    parameter.whole_offset = layout.whole_numel;
    layout.shard_numel += parameter.chunk_numel();
    layout.whole_numel += parameter.numel();
    layout.parameters.push_back(std::move(parameter));
  }
  return layout;
}

}  // namespace ddp::detail
