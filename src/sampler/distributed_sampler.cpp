#include "ddp/distributed_sampler.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/serialize/archive.h>

#include "common/error_context.h"
#include "ddp/init.h"

namespace ddp {
namespace {

constexpr const char* kOperation = "DistributedSampler";

}  // namespace

DistributedSampler::DistributedSampler(int64_t dataset_size, SamplerOptions options)
    : dataset_size_(dataset_size), options_(options), epoch_(std::make_shared<int64_t>(0)) {
  num_replicas_ = options_.num_replicas() >= 0 ? options_.num_replicas() : get_world_size();
  rank_ = options_.rank() >= 0 ? options_.rank() : get_rank();
  if (dataset_size_ < 0) {
    detail::fail<InvalidArgumentError>(
        kOperation, "dataset_size must not be negative, got " + std::to_string(dataset_size_));
  }
  if (num_replicas_ < 1) {
    detail::fail<InvalidArgumentError>(
        kOperation, "num_replicas must be at least 1, got " + std::to_string(num_replicas_));
  }
  if (rank_ < 0 || rank_ >= num_replicas_) {
    detail::fail<InvalidArgumentError>(kOperation, "invalid rank " + std::to_string(rank_) +
                                                       ", rank should be in the interval [0, " +
                                                       std::to_string(num_replicas_ - 1) + "]");
  }
  if (options_.drop_last() && dataset_size_ < num_replicas_) {
    detail::fail<InvalidArgumentError>(
        kOperation, "drop_last with " + std::to_string(dataset_size_) + " samples and " +
                        std::to_string(num_replicas_) +
                        " replicas leaves no sample for any rank; use drop_last(false) "
                        "(pads by repetition) or fewer replicas");
  }
  if (options_.drop_last() && dataset_size_ % num_replicas_ != 0) {
    num_samples_ = (dataset_size_ - num_replicas_ + num_replicas_ - 1) / num_replicas_;  // ceil
  } else {
    num_samples_ = (dataset_size_ + num_replicas_ - 1) / num_replicas_;
  }
}

void DistributedSampler::set_epoch(int64_t epoch) { *epoch_ = epoch; }

int64_t DistributedSampler::epoch() const { return *epoch_; }

std::vector<int64_t> DistributedSampler::indices() const {
  const int64_t total = total_size();
  at::Tensor order;
  if (options_.shuffle()) {
    // Python: g = torch.Generator(); g.manual_seed(seed + epoch); torch.randperm(n, generator=g)
    auto generator = at::detail::createCPUGenerator(options_.seed() + *epoch_);
    order = at::randperm(dataset_size_, generator, at::kLong);
  } else {
    order = at::arange(dataset_size_, at::kLong);
  }
  std::vector<int64_t> all(order.data_ptr<int64_t>(), order.data_ptr<int64_t>() + dataset_size_);
  if (!options_.drop_last()) {
    // Pad with the head of the order, repeated as often as needed.
    for (int64_t i = 0; static_cast<int64_t>(all.size()) < total; ++i) {
      all.push_back(all[static_cast<size_t>(i % dataset_size_)]);
    }
  } else {
    all.resize(static_cast<size_t>(total));
  }
  std::vector<int64_t> mine;
  for (int64_t i = rank_; i < total; i += num_replicas_)
    mine.push_back(all[static_cast<size_t>(i)]);
  return mine;
}

void DistributedSampler::reset(torch::optional<size_t> new_size) {
  if (new_size && static_cast<int64_t>(*new_size) != dataset_size_) {
    auto shared_epoch = epoch_;
    *this = DistributedSampler(static_cast<int64_t>(*new_size),
                               SamplerOptions(options_).num_replicas(num_replicas_).rank(rank_));
    epoch_ = shared_epoch;
  }
  pass_ = indices();
  position_ = 0;
}

torch::optional<std::vector<size_t>> DistributedSampler::next(size_t batch_size) {
  if (position_ >= pass_.size()) return torch::nullopt;
  const size_t end = std::min(pass_.size(), position_ + batch_size);
  std::vector<size_t> batch(pass_.begin() + position_, pass_.begin() + end);
  position_ = end;
  return batch;
}

void DistributedSampler::save(torch::serialize::OutputArchive& archive) const {
  archive.write("epoch", at::tensor(*epoch_), /*is_buffer=*/true);
  archive.write("position", at::tensor(static_cast<int64_t>(position_)), /*is_buffer=*/true);
}

void DistributedSampler::load(torch::serialize::InputArchive& archive) {
  at::Tensor epoch, position;
  archive.read("epoch", epoch, /*is_buffer=*/true);
  archive.read("position", position, /*is_buffer=*/true);
  *epoch_ = epoch.item<int64_t>();
  pass_ = indices();
  position_ = static_cast<size_t>(position.item<int64_t>());
}

}  // namespace ddp
