// DistributedSampler: each rank's share of a dataset, the same indices as
// torch.utils.data.DistributedSampler for every size, replica count, rank, shuffle, seed,
// drop_last and epoch (a CPU generator seeded with seed + epoch and randperm, as in Python).
//
// It is also a libtorch sampler, for torch::data::make_data_loader. That loader takes its sampler
// by value, so set_epoch on the caller's object would never reach the loader's copy; here every
// copy of a DistributedSampler shares one epoch: keep your copy, call set_epoch(e) on it before
// each epoch, and the loader's copy follows. (libtorch's own DistributedRandomSampler differs from
// PyTorch's order in five ways and is not used.)
// Thread-safety: set_epoch and indices() may be called from different threads; the libtorch
// sampler interface (reset, next) belongs to the one loader that owns the copy.
#pragma once

#include <torch/arg.h>
#include <torch/data/samplers/base.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace ddp {

/// Options of DistributedSampler, with PyTorch's defaults.
struct SamplerOptions {
  /// Number of ranks sharing the dataset; -1: the world size of the default group. Default: -1.
  TORCH_ARG(int64_t, num_replicas) = -1;
  /// This rank; -1: the rank in the default group. Default: -1.
  TORCH_ARG(int64_t, rank) = -1;
  /// Shuffle with a generator seeded by seed + epoch (the same on every rank). Default: true.
  TORCH_ARG(bool, shuffle) = true;
  /// Default: 0.
  TORCH_ARG(uint64_t, seed) = 0;
  /// Drop the tail so that every rank gets the same count without padding. Default: false (pad by
  /// repeating the first indices).
  TORCH_ARG(bool, drop_last) = false;
};

class DistributedSampler : public torch::data::samplers::Sampler<std::vector<size_t>> {
 public:
  /// Throws DistributedError for a rank out of range, zero replicas, or drop_last with fewer
  /// samples than replicas.
  explicit DistributedSampler(int64_t dataset_size, SamplerOptions options = SamplerOptions());

  /// The epoch whose order indices() and the loader use; shared by every copy.
  void set_epoch(int64_t epoch);
  int64_t epoch() const;

  /// This rank's indices for the current epoch, in order.
  std::vector<int64_t> indices() const;
  /// Indices per rank (= indices().size()).
  int64_t num_samples() const { return num_samples_; }
  /// num_samples() * num_replicas.
  int64_t total_size() const { return num_samples_ * num_replicas_; }
  int64_t num_replicas() const { return num_replicas_; }
  int64_t rank() const { return rank_; }

  // The libtorch sampler interface. reset() takes the current epoch's indices (the loader calls
  // it at the start of each pass); next() hands them out in batches.
  void reset(torch::optional<size_t> new_size = torch::nullopt) override;
  torch::optional<std::vector<size_t>> next(size_t batch_size) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 private:
  int64_t dataset_size_;
  SamplerOptions options_;
  int64_t num_replicas_;
  int64_t rank_;
  int64_t num_samples_;
  std::shared_ptr<int64_t> epoch_;  // shared by copies, see the header comment
  std::vector<int64_t> pass_;       // the current pass of the libtorch interface
  size_t position_ = 0;
};

}  // namespace ddp
