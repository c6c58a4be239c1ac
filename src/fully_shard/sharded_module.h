// What the rest of the library asks of a model that fully_shard may have sharded.
#pragma once

#include <torch/nn/module.h>

namespace ddp::detail {

/// Whether `model` is or holds a FullyShardedUnit (its parameters' data are shards).
bool holds_fully_sharded_units(const torch::nn::Module& model);

}  // namespace ddp::detail
