// The four reference models of the DDP benchmark, in C++: the same architectures, parameter
// registration order and parameter counts as /work/shared/peers/reference_models.py (the peer's),
// so that both benchmarks train the same networks.
//
//   mlp          1,863,690  Flatten, Linear 784-1024, ReLU, Linear 1024-1024, ReLU, Linear 1024-10
//   cnn          1,199,882  conv 1-32 3x3, conv 32-64 3x3, max-pool 2, fc 9216-128, fc 128-10
//   resnet         272,474  CIFAR ResNet-20 (BasicBlocks with batch norm)
//   transformer  4,226,560  TinyGPT: 4 pre-norm encoder layers, d 256, 4 heads, ff 1024, seq 64
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "ddp/fully_shard.h"

namespace ddp_bench {

/// What the benchmark needs of a model: one tensor in, logits out.
class BenchModel : public torch::nn::Module {
 public:
  virtual torch::Tensor forward(torch::Tensor x) = 0;
  /// Makes the model's units ddp::FullyShardedUnits (collective); throws where a model has none.
  virtual void fully_shard(const ddp::FullyShardOptions& options);
};

/// A built model and its default per-rank batch.
struct BuiltModel {
  std::shared_ptr<BenchModel> model;
  int64_t default_batch;
};

/// Builds "mlp", "cnn", "resnet" or "transformer"; throws std::invalid_argument otherwise.
BuiltModel build(const std::string& name);

/// Random inputs and labels for one batch, as the peer's make_batch: images and labels 0..9, or
/// token ids 0..2047 shifted by one for the transformer.
std::pair<torch::Tensor, torch::Tensor> make_batch(const std::string& name, int64_t batch,
                                                   at::Generator& generator);

/// The sharded-training benchmark's fixed transformer (issue 32): TinyGPT with vocabulary 8192,
/// d_model 768, 12 blocks, 12 heads, MLP 3072, sequence 64 (97,696,256 parameters); the peer
/// builds it as reference_models.TinyGPT(8192, 768, 12, 12, 3072, 64).
std::shared_ptr<BenchModel> zero_transformer();

/// Number of parameter elements (buffers excluded).
int64_t parameter_count(const torch::nn::Module& module);

}  // namespace ddp_bench
