// What the rest of the library asks of a model that fully_shard may have sharded.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace ddp::detail {

/// Whether `model` is or holds a FullyShardedUnit (its parameters' data are shards).
bool holds_fully_sharded_units(const torch::nn::Module& model);

/// Which rows of a whole parameter a shard holds.
struct ShardRows {
  std::vector<int64_t> whole_shape;
  int64_t first_row = 0;
  int64_t rows = 0;

  /// This rank's rows of `whole` (shaped like the whole parameter), shaped like the shard.
  at::Tensor of(const at::Tensor& whole) const;
};

/// The shards' rows, by parameter (the TensorImpl that the module holds).
std::map<const c10::TensorImpl*, ShardRows> shard_rows_of(const torch::nn::Module& model);

/// `rows`, shaped like `parameter`'s shard (an optimizer's per-element state of it), whole: every
/// rank's rows gathered. Collective over the parameter's unit's group. REQUIRES: `parameter` is a
/// parameter of one of `model`'s units.
at::Tensor gather_rows(const torch::nn::Module& model, const at::Tensor& parameter,
                       const at::Tensor& rows);

/// The model's parameters whole and its buffers, under their names (ddp::full_state_dict).
/// Collective over the units' group.
std::vector<std::pair<std::string, at::Tensor>> whole_module_state(const torch::nn::Module& model);

}  // namespace ddp::detail
