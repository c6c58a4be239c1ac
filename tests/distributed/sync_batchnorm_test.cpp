// SyncBatchNorm across ranks: each rank's output, gradients and running statistics equal those of
// torch::nn::BatchNorm on the concatenated batch in one process, whatever the split of the batch.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <numeric>
#include <string>
#include <vector>

#include "ddp/ddp.h"
#include "support/multiprocess.h"

using ddp::testing::run_ranks_ok;

namespace {

constexpr int64_t kChannels = 3;
constexpr int kSteps = 3;
constexpr double kTolerance = 1e-5;

void init(const std::string& backend) {
  ddp::init_process_group(ddp::InitOptions().backend(backend).timeout(std::chrono::seconds(30)));
}

void expect_close(const torch::Tensor& actual, const torch::Tensor& expected,
                  const std::string& what) {
  ASSERT_TRUE(actual.defined()) << what << " is undefined";
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  if (actual.numel() == 0) return;
  const double difference = (actual - expected).abs().max().item<double>();
  EXPECT_LE(difference, kTolerance) << what << " differs by " << difference;
}

// The rank's first sample within the whole batch.
int64_t offset_of(const std::vector<int64_t>& sizes, int rank) {
  return std::accumulate(sizes.begin(), sizes.begin() + rank, int64_t{0});
}

// Runs kSteps training steps of a SyncBatchNorm on this rank's part of a seeded whole batch, and
// of a BatchNorm on the whole batch, and compares: output, input gradient, weight and bias
// gradients summed over the ranks (DDP would average them), running statistics. `spatial` is the
// input's shape after (N, C), so that every dimensionality goes through.
void expect_equals_batch_norm_on_the_whole_batch(int rank, const std::vector<int64_t>& sizes,
                                                 const std::vector<int64_t>& spatial) {
  const int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  const int64_t offset = offset_of(sizes, rank);
  const int64_t local = sizes[static_cast<size_t>(rank)];
  std::vector<int64_t> shape{total, kChannels};
  shape.insert(shape.end(), spatial.begin(), spatial.end());

  torch::manual_seed(0);
  const auto weight = torch::rand({kChannels}, torch::kDouble) + 0.5;
  const auto bias = torch::randn({kChannels}, torch::kDouble);
  // The reference is torch::batch_norm, which takes any dimensionality, as SyncBatchNorm does.
  ddp::SyncBatchNorm sync(kChannels);
  sync->to(torch::kDouble);
  {
    torch::NoGradGuard no_grad;
    sync->weight.copy_(weight);
    sync->bias.copy_(bias);
  }
  auto reference_weight = weight.clone().requires_grad_();
  auto reference_bias = bias.clone().requires_grad_();
  auto running_mean = torch::zeros({kChannels}, torch::kDouble);
  auto running_var = torch::ones({kChannels}, torch::kDouble);

  for (int step = 0; step < kSteps; ++step) {
    const auto whole = torch::randn(shape, torch::kDouble) * (step + 1) + step;
    const auto upstream = torch::randn(shape, torch::kDouble);

    auto input = whole.narrow(0, offset, local).clone().requires_grad_();
    auto output = sync(input);
    (output * upstream.narrow(0, offset, local)).sum().backward();

    auto whole_input = whole.clone().requires_grad_();
    auto expected = torch::batch_norm(whole_input, reference_weight, reference_bias, running_mean,
                                      running_var, /*training=*/true, /*momentum=*/0.1,
                                      /*eps=*/1e-5, /*cudnn_enabled=*/false);
    (expected * upstream).sum().backward();

    const std::string at = " at step " + std::to_string(step);
    expect_close(output, expected.narrow(0, offset, local), "output" + at);
    expect_close(input.grad(), whole_input.grad().narrow(0, offset, local), "input grad" + at);
    auto weight_grad = sync->weight.grad().clone();
    auto bias_grad = sync->bias.grad().clone();
    ddp::all_reduce(weight_grad);
    ddp::all_reduce(bias_grad);
    expect_close(weight_grad, reference_weight.grad(), "summed weight grad" + at);
    expect_close(bias_grad, reference_bias.grad(), "summed bias grad" + at);
    expect_close(sync->running_mean, running_mean, "running_mean" + at);
    expect_close(sync->running_var, running_var, "running_var" + at);

    sync->weight.mutable_grad().reset();
    sync->bias.mutable_grad().reset();
    reference_weight.mutable_grad().reset();
    reference_bias.mutable_grad().reset();
  }
  EXPECT_EQ(sync->num_batches_tracked.item<int64_t>(), kSteps);
}

void run_on_both_backends(const std::vector<int64_t>& sizes, const std::vector<int64_t>& spatial) {
  for (const std::string backend : {"shm", "gloo"}) {
    SCOPED_TRACE(backend);
    run_ranks_ok(static_cast<int>(sizes.size()), [&](int rank) {
      init(backend);
      expect_equals_batch_norm_on_the_whole_batch(rank, sizes, spatial);
      ddp::destroy_process_group();
    });
  }
}

}  // namespace

TEST(SyncBatchNorm, TwoRanksWithEqualBatchesEqualBatchNormOnTheWholeBatchInFloat64) {
  run_on_both_backends({4, 4}, {5, 6});
}

TEST(SyncBatchNorm, TwoRanksWithUnequalBatchesEqualBatchNormOnTheWholeBatchInFloat64) {
  run_on_both_backends({2, 7}, {5, 6});
}

TEST(SyncBatchNorm, ThreeRanksWithEqualBatchesEqualBatchNormOnTheWholeBatchInFloat64) {
  run_on_both_backends({3, 3, 3}, {4});
}

TEST(SyncBatchNorm, ThreeRanksWithUnequalBatchesEqualBatchNormOnTheWholeBatchInFloat64) {
  run_on_both_backends({1, 5, 2}, {2, 3, 2});
}

TEST(SyncBatchNorm, TwoDimensionalInputOfUnequalBatchesEqualsBatchNormOnTheWholeBatch) {
  run_on_both_backends({3, 6}, {});
}

// loss = output.sum(): the empty rank's forward and backward still join both collectives (or the
// others would wait for it until the timeout), and the others normalize with their own values.
TEST(SyncBatchNorm, ARankWithAnEmptyBatchJoinsBothCollectivesAndTheOthersEqualBatchNorm) {
  const std::vector<int64_t> sizes{3, 0, 4};
  for (const std::string backend : {"shm", "gloo"}) {
    SCOPED_TRACE(backend);
    run_ranks_ok(3, [&](int rank) {
      init(backend);
      torch::manual_seed(0);
      const auto whole = torch::randn({7, kChannels, 4}, torch::kDouble);
      ddp::SyncBatchNorm1d sync(kChannels);
      sync->to(torch::kDouble);
      const int64_t offset = offset_of(sizes, rank);
      auto input =
          whole.narrow(0, offset, sizes[static_cast<size_t>(rank)]).clone().requires_grad_();
      auto output = sync(input);
      output.sum().backward();

      auto whole_input = whole.clone().requires_grad_();
      auto running_mean = torch::zeros({kChannels}, torch::kDouble);
      auto running_var = torch::ones({kChannels}, torch::kDouble);
      auto expected =
          torch::batch_norm(whole_input, {}, {}, running_mean, running_var, true, 0.1, 1e-5, false);
      expected.sum().backward();
      const int64_t local = sizes[static_cast<size_t>(rank)];
      expect_close(output, expected.narrow(0, offset, local), "output");
      ASSERT_TRUE(input.grad().defined() || local == 0);
      if (local > 0) {
        expect_close(input.grad(), whole_input.grad().narrow(0, offset, local), "input grad");
      }
      expect_close(sync->running_mean, running_mean, "running_mean");
      expect_close(sync->running_var, running_var, "running_var");
      ddp::destroy_process_group();
    });
  }
}

// Eval mode normalizes with the running statistics, alone: ranks that run different numbers of
// eval forwards (a collective in any of them would hang) still end at the barrier together.
TEST(SyncBatchNorm, EvalModeEqualsBatchNormAndDoesNotCommunicate) {
  run_ranks_ok(2, [](int rank) {
    init("shm");
    torch::manual_seed(0);
    ddp::SyncBatchNorm2d sync{torch::nn::BatchNormOptions(kChannels)};
    torch::nn::BatchNorm2d plain(kChannels);
    {
      torch::NoGradGuard no_grad;
      for (auto* bn : {&sync->running_mean, &plain->running_mean}) bn->copy_(torch::arange(3.0));
      for (auto* bn : {&sync->running_var, &plain->running_var}) bn->fill_(2.5);
    }
    sync->eval();
    plain->eval();
    for (int i = 0; i <= rank * 3; ++i) {
      const auto x = torch::randn({2, kChannels, 3, 3});
      EXPECT_TRUE(torch::allclose(sync(x), plain(x)));
    }
    ddp::barrier();
    ddp::destroy_process_group();
  });
}

// The model of a training program, converted and wrapped in DDP: two ranks with half of each batch
// each train it exactly as one process trains BatchNorm's model on the whole batch, and their
// running statistics agree. Buffers are not broadcast, so nothing but SyncBatchNorm can make them
// agree.
TEST(SyncBatchNorm, ConvertedModelInDdpOnTwoRanksTrainsLikeOneProcessOnTheWholeBatch) {
  for (const std::string backend : {"shm", "gloo"}) {
    SCOPED_TRACE(backend);
    run_ranks_ok(2, [&](int rank) {
      init(backend);
      const auto make_model = [] {
        torch::manual_seed(0);
        torch::nn::Sequential model(torch::nn::Linear(6, 16), torch::nn::BatchNorm1d(16),
                                    torch::nn::ReLU(), torch::nn::Linear(16, 3));
        model->to(torch::kDouble);
        return model;
      };
      auto net = make_model();
      auto reference = make_model();
      ddp::convert_sync_batchnorm(net);
      ASSERT_NE(net[1]->as<ddp::SyncBatchNorm1dImpl>(), nullptr);
      ddp::DistributedDataParallel model(net, ddp::DDPOptions().broadcast_buffers(false));
      torch::optim::SGD optimizer(net->parameters(), 0.1);
      torch::optim::SGD reference_optimizer(reference->parameters(), 0.1);
      for (int step = 0; step < 4; ++step) {
        torch::manual_seed(100 + step);
        const auto x = torch::randn({8, 6}, torch::kDouble) * 3 + 1;
        const auto y = torch::randn({8, 3}, torch::kDouble);
        optimizer.zero_grad();
        torch::mse_loss(model(x.narrow(0, rank * 4, 4)), y.narrow(0, rank * 4, 4)).backward();
        optimizer.step();
        reference_optimizer.zero_grad();
        torch::mse_loss(reference->forward(x), y).backward();
        reference_optimizer.step();
      }
      const auto parameters = net->named_parameters();
      for (const auto& expected : reference->named_parameters()) {
        expect_close(parameters[expected.key()], expected.value(), expected.key());
      }
      const auto buffers = net->named_buffers();
      for (const auto& expected : reference->named_buffers()) {
        expect_close(buffers[expected.key()].to(torch::kDouble),
                     expected.value().to(torch::kDouble), expected.key());
        const auto all = ddp::all_gather(buffers[expected.key()]);
        EXPECT_TRUE(torch::equal(all[0], all[1])) << expected.key() << " differs between ranks";
      }
      ddp::destroy_process_group();
    });
  }
}
