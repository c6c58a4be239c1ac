// DDPCore::stats(): the recorder's step numbers with the buckets and the setup around them.
#include <ATen/core/Tensor.h>

#include "ddp/distributed_data_parallel.h"
#include "reducer/reducer.h"

namespace ddp::detail {

DDPStats DDPCore::stats() const {
  DDPStats stats;
  reducer_->stats().fill(stats);
  stats.bucket_sizes_bytes = reducer_->bucket_sizes_bytes();
  stats.bucket_count = static_cast<int64_t>(stats.bucket_sizes_bytes.size());
  stats.rebuilds = reducer_->rebuilds();
  for (const auto& parameter : reducer_->parameters()) {
    ++stats.parameter_count;
    stats.parameter_bytes += static_cast<int64_t>(parameter.nbytes());
  }
  const ProcessGroup& group = options_.process_group();
  stats.world_size = group.size();
  stats.rank = group.rank();
  stats.bucket_cap_bytes = static_cast<int64_t>(options_.bucket_cap_mb() * 1024 * 1024);
  stats.find_unused_parameters = options_.find_unused_parameters();
  stats.static_graph = options_.static_graph();
  stats.gradient_as_bucket_view = options_.gradient_as_bucket_view();
  stats.has_comm_hook = reducer_->has_comm_hook();
  return stats;
}

void DDPCore::reset_stats() { reducer_->stats().reset(); }

}  // namespace ddp::detail
