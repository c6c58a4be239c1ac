// Where each parameter's rows live when a unit is sharded: FSDP2's layout, every parameter split
// along its first dimension into group-size chunks of ceil(rows / size) rows, the last ranks
// holding fewer rows or none. A unit keeps its shards in one flat buffer (each parameter's chunk
// padded to the whole chunk, so that every rank's buffer has the same size and one all-gather or
// reduce-scatter moves the whole unit), and its whole parameters in another, one after another.
#pragma once

#include <cstdint>
#include <vector>

namespace ddp::detail {

struct ShardedParameter {
  std::vector<int64_t> shape;  // the whole parameter's (a 0-dim one counts as one row)
  int64_t rows = 0;            // first dimension
  int64_t row_numel = 0;       // elements per row
  int64_t chunk_rows = 0;      // ceil(rows / group size)
  int64_t shard_offset = 0;    // of the padded chunk in a rank's flat shard buffer
  int64_t whole_offset = 0;    // in the flat buffer of whole parameters

  /// The rows that `rank` keeps: chunk_rows, fewer at the end, or none.
  int64_t rows_of(int rank) const;
  /// The first of them (`rows` where it keeps none: 5 rows at 4 ranks leave rank 3 none, and its
  /// chunk would start at row 6).
  int64_t first_row_of(int rank) const;
  int64_t chunk_numel() const { return chunk_rows * row_numel; }
  int64_t numel() const { return rows * row_numel; }
};

struct ShardLayout {
  std::vector<ShardedParameter> parameters;
  int64_t shard_numel = 0;  // a rank's flat shard buffer, padding included
  int64_t whole_numel = 0;  // every whole parameter

  static ShardLayout of(const std::vector<std::vector<int64_t>>& shapes, int group_size);
};

}  // namespace ddp::detail
