// SyncBatchNorm in one process: BatchNorm's behaviour where there is nothing to synchronize, its
// names and checks, the per-channel steps that the ranks combine, and convert_sync_batchnorm.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "ddp/ddp.h"
#include "sync_batchnorm/batch_norm_kernels.h"

namespace {

std::vector<std::string> keys_of(const torch::OrderedDict<std::string, torch::Tensor>& dict) {
  return dict.keys();
}

// A module holding a BatchNorm as a typed member, which libtorch cannot swap.
struct Encoder : torch::nn::Module {
  Encoder() {
    conv = register_module("conv", torch::nn::Conv2d(2, 4, 3));
    bn1 = register_module("bn1", torch::nn::BatchNorm2d(4));
  }
  torch::nn::Conv2d conv{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr};
};

// libtorch's way to nest a Sequential in a Sequential: a subclass whose forward has fixed types.
struct BlockImpl : torch::nn::SequentialImpl {
  using SequentialImpl::SequentialImpl;
  torch::Tensor forward(torch::Tensor x) { return SequentialImpl::forward(std::move(x)); }
};
TORCH_MODULE(Block);

struct Net : torch::nn::Module {
  Net() {
    encoder = register_module("encoder", std::make_shared<Encoder>());
    head = register_module("head", torch::nn::Sequential(torch::nn::BatchNorm1d(4)));
  }
  std::shared_ptr<Encoder> encoder;
  torch::nn::Sequential head{nullptr};
};

}  // namespace

// Before init_process_group there is no one to synchronize with: PyTorch falls back to
// batch_norm, and so does ddp::SyncBatchNorm, bit for bit.
TEST(SyncBatchNorm, WithoutAProcessGroupTrainsExactlyLikeBatchNorm) {
  ASSERT_FALSE(ddp::is_initialized());
  ddp::SyncBatchNorm2d sync(torch::nn::BatchNormOptions(3).momentum(c10::nullopt));
  torch::nn::BatchNorm2d plain(torch::nn::BatchNormOptions(3).momentum(c10::nullopt));
  for (int step = 0; step < 3; ++step) {
    const auto x = torch::randn({4, 3, 5, 5}) * (step + 2);
    auto a = x.clone().requires_grad_();
    auto b = x.clone().requires_grad_();
    sync(a).pow(2).sum().backward();
    plain(b).pow(2).sum().backward();
    EXPECT_TRUE(torch::equal(a.grad(), b.grad()));
  }
  EXPECT_TRUE(torch::equal(sync->weight.grad(), plain->weight.grad()));
  EXPECT_TRUE(torch::equal(sync->bias.grad(), plain->bias.grad()));
  EXPECT_TRUE(torch::equal(sync->running_mean, plain->running_mean));
  EXPECT_TRUE(torch::equal(sync->running_var, plain->running_var));
  EXPECT_EQ(sync->num_batches_tracked.item<int64_t>(), 3);
}

TEST(SyncBatchNorm, EvalModeEqualsBatchNormWithItsRunningStatistics) {
  ddp::SyncBatchNorm sync(4);
  torch::nn::BatchNorm3d plain(4);
  {
    torch::NoGradGuard no_grad;
    for (auto* t : {&sync->running_mean, &plain->running_mean}) t->copy_(torch::arange(4.0));
    for (auto* t : {&sync->running_var, &plain->running_var}) t->copy_(torch::arange(1.0, 5.0));
  }
  sync->eval();
  plain->eval();
  const auto x = torch::randn({2, 4, 3, 3, 3});
  EXPECT_TRUE(torch::equal(sync(x), plain(x)));
  EXPECT_TRUE(torch::equal(sync->running_mean, torch::arange(4.0)));
}

// Same parameter and buffer names, in the same order: a BatchNorm's checkpoint loads into a
// SyncBatchNorm.
TEST(SyncBatchNorm, HasBatchNormsNamesSoThatItsCheckpointsLoad) {
  torch::nn::BatchNorm2d plain(5);
  ddp::SyncBatchNorm2d sync(5);
  EXPECT_EQ(keys_of(sync->named_parameters()), keys_of(plain->named_parameters()));
  EXPECT_EQ(keys_of(sync->named_buffers()), keys_of(plain->named_buffers()));
  {
    torch::NoGradGuard no_grad;
    plain->weight.uniform_();
    plain->running_var.uniform_(1, 2);
    plain->num_batches_tracked.fill_(7);
  }
  std::stringstream stream;
  torch::save(plain, stream);
  torch::load(sync, stream);
  EXPECT_TRUE(torch::equal(sync->weight, plain->weight));
  EXPECT_TRUE(torch::equal(sync->running_var, plain->running_var));
  EXPECT_EQ(sync->num_batches_tracked.item<int64_t>(), 7);
}

TEST(SyncBatchNorm, TakesBatchNormOptionsAndServesInASequential) {
  torch::nn::Sequential net(torch::nn::Linear(3, 4),
                            ddp::SyncBatchNorm1d(torch::nn::BatchNormOptions(4)
                                                     .eps(1e-3)
                                                     .momentum(c10::nullopt)
                                                     .affine(false)
                                                     .track_running_stats(false)));
  const auto& options = net[1]->as<ddp::SyncBatchNorm1dImpl>()->options;
  EXPECT_EQ(options.eps(), 1e-3);
  EXPECT_FALSE(options.momentum().has_value());
  EXPECT_FALSE(options.affine());
  EXPECT_FALSE(options.track_running_stats());
  EXPECT_TRUE(options.process_group().is_world());
  EXPECT_EQ(net->forward(torch::randn({6, 3})).sizes(), (std::vector<int64_t>{6, 4}));
  std::ostringstream printed;
  printed << *net[1];
  EXPECT_EQ(
      printed.str(),
      "ddp::SyncBatchNorm1d(4, eps=0.001, momentum=None, affine=false, track_running_stats=false)");
}

// BatchNormNd's dimension checks, as typed errors that say what to do; any dimensionality from 2
// up for SyncBatchNorm; the channel count against num_features.
TEST(SyncBatchNorm, ChecksTheInputsDimensionsLikeBatchNormNd) {
  const auto message_of = [](const std::function<void()>& call) -> std::string {
    try {
      call();
    } catch (const ddp::InvalidArgumentError& error) {
      return error.what();
    }
    return "no InvalidArgumentError";
  };
  ddp::SyncBatchNorm1d one(2);
  ddp::SyncBatchNorm2d two(2);
  ddp::SyncBatchNorm3d three(2);
  ddp::SyncBatchNorm any(2);
  EXPECT_NE(message_of([&] {
              one(torch::randn({2, 2, 2, 2}));
            }).find("expected 2D or 3D input"),
            std::string::npos);
  EXPECT_NE(message_of([&] {
              two(torch::randn({2, 2, 2}));
            }).find("expected 4D input (got 3D"),
            std::string::npos);
  EXPECT_NE(message_of([&] {
              three(torch::randn({2, 2, 2, 2}));
            }).find("expected 5D input"),
            std::string::npos);
  EXPECT_NE(message_of([&] { any(torch::randn({4})); }).find("expected at least 2D input"),
            std::string::npos);
  EXPECT_NE(message_of([&] {
              two(torch::randn({2, 3, 2, 2}));
            }).find("num_features"),
            std::string::npos);
  for (int64_t dims = 2; dims <= 6; ++dims) {
    std::vector<int64_t> shape(static_cast<size_t>(dims), 2);
    EXPECT_EQ(any(torch::randn(shape)).sizes(), torch::IntArrayRef(shape));
  }
}

// The steps the ranks run, on CPU, with the ranks played by chunks of one batch: the chunks'
// combined statistics and gradient sums give BatchNorm's output and gradients on the whole batch.
TEST(SyncBatchNormKernels, ChunksCombinedGiveBatchNormOnTheWholeBatch) {
  torch::manual_seed(0);
  const auto whole = torch::randn({9, 3, 4}, torch::kDouble) * 2 + 1;
  const auto upstream = torch::randn_like(whole);
  const auto weight = torch::rand({3}, torch::kDouble) + 0.5;
  const auto bias = torch::randn({3}, torch::kDouble);
  const std::vector<int64_t> sizes{2, 0, 7};
  const double eps = 1e-5;

  std::vector<torch::Tensor> means, invstds, counts;
  int64_t offset = 0;
  for (int64_t size : sizes) {
    if (size > 0) {
      auto [mean, invstd] = ddp::detail::batch_norm_stats(whole.narrow(0, offset, size), eps);
      means.push_back(mean);
      invstds.push_back(invstd);
      counts.push_back(torch::full({1}, size * 4.0, torch::kDouble));
    }
    offset += size;
  }
  auto running_mean = torch::zeros({3}, torch::kDouble);
  auto running_var = torch::ones({3}, torch::kDouble);
  auto [mean, invstd] = ddp::detail::batch_norm_gather_stats_with_counts(
      whole, torch::stack(means), torch::stack(invstds), running_mean, running_var, 0.1, eps,
      torch::cat(counts));

  auto whole_input = whole.clone().requires_grad_();
  auto reference_weight = weight.clone().requires_grad_();
  auto reference_bias = bias.clone().requires_grad_();
  auto expected_mean = torch::zeros({3}, torch::kDouble);
  auto expected_var = torch::ones({3}, torch::kDouble);
  auto expected = torch::batch_norm(whole_input, reference_weight, reference_bias, expected_mean,
                                    expected_var, true, 0.1, eps, false);
  (expected * upstream).sum().backward();
  EXPECT_TRUE(torch::allclose(running_mean, expected_mean));
  EXPECT_TRUE(torch::allclose(running_var, expected_var));

  auto sum_dy = torch::zeros({3}, torch::kDouble);
  auto sum_dy_xmu = torch::zeros({3}, torch::kDouble);
  auto grad_weight = torch::zeros({3}, torch::kDouble);
  offset = 0;
  for (int64_t size : sizes) {
    if (size > 0) {
      auto pieces = ddp::detail::batch_norm_backward_reduce(upstream.narrow(0, offset, size),
                                                            whole.narrow(0, offset, size), mean,
                                                            invstd, weight, true, true, true);
      sum_dy += std::get<0>(pieces);
      sum_dy_xmu += std::get<1>(pieces);
      grad_weight += std::get<2>(pieces);
    }
    offset += size;
  }
  EXPECT_TRUE(torch::allclose(grad_weight, reference_weight.grad()));
  EXPECT_TRUE(torch::allclose(sum_dy, reference_bias.grad()));
  const auto int_counts = torch::tensor({8, 28}, torch::kInt);
  offset = 0;
  for (int64_t size : sizes) {
    const auto input = whole.narrow(0, offset, size);
    if (size > 0) {
      EXPECT_TRUE(
          torch::allclose(ddp::detail::batch_norm_elemt(input, weight, bias, mean, invstd, eps),
                          expected.narrow(0, offset, size)));
      EXPECT_TRUE(torch::allclose(
          ddp::detail::batch_norm_backward_elemt(upstream.narrow(0, offset, size), input, mean,
                                                 invstd, weight, sum_dy, sum_dy_xmu, int_counts),
          whole_input.grad().narrow(0, offset, size)));
    }
    offset += size;
  }
}

// A Sequential in a Sequential, a ModuleList and a ModuleDict: every BatchNorm becomes the
// SyncBatchNorm of its dimensionality, holding the same tensors under the same names, in the
// same mode; forward runs the new modules.
TEST(SyncBatchNormConversion, ReplacesBatchNormsInContainersKeepingTensorsNamesAndMode) {
  Block inner(torch::nn::Conv2d(2, 4, 3), torch::nn::BatchNorm2d(4));
  torch::nn::Sequential net(inner, torch::nn::Flatten(), torch::nn::Linear(4 * 3 * 3, 5),
                            torch::nn::BatchNorm1d(5));
  torch::nn::ModuleList list(torch::nn::BatchNorm3d(2));
  torch::nn::ModuleDict model(
      std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>>{
          {"net", net.ptr()}, {"list", list.ptr()}, {"norm", torch::nn::BatchNorm1d(3).ptr()}});
  model->train();
  inner[1]->eval();
  {
    torch::NoGradGuard no_grad;
    for (auto& buffer : model->buffers()) buffer.add_(2);
  }
  const auto parameters_before = model->named_parameters();
  const auto buffers_before = model->named_buffers();

  EXPECT_EQ(ddp::convert_sync_batchnorm(model).get(), model.ptr().get());
  EXPECT_NE(inner[1]->as<ddp::SyncBatchNorm2dImpl>(), nullptr);
  EXPECT_NE(net[3]->as<ddp::SyncBatchNorm1dImpl>(), nullptr);
  EXPECT_NE(list[0]->as<ddp::SyncBatchNorm3dImpl>(), nullptr);
  EXPECT_NE(model["norm"]->as<ddp::SyncBatchNorm1dImpl>(), nullptr);
  EXPECT_FALSE(inner[1]->is_training());
  EXPECT_TRUE(net[3]->is_training());
  const auto parameters_after = model->named_parameters();
  const auto buffers_after = model->named_buffers();
  ASSERT_EQ(keys_of(parameters_after), keys_of(parameters_before));
  ASSERT_EQ(keys_of(buffers_after), keys_of(buffers_before));
  // The same tensors, not copies: an optimizer made before the conversion trains the new modules.
  for (const auto& item : parameters_before) {
    EXPECT_TRUE(parameters_after[item.key()].is_same(item.value())) << item.key();
  }
  for (const auto& item : buffers_before) {
    EXPECT_TRUE(buffers_after[item.key()].is_same(item.value())) << item.key();
  }
  // Sequential's forward runs the new module: it counts its batches.
  net->forward(torch::randn({4, 2, 5, 5}));
  EXPECT_EQ(net[3]->as<ddp::SyncBatchNorm1dImpl>()->num_batches_tracked.item<int64_t>(), 3);
}

TEST(SyncBatchNormConversion, RefusesATypedMemberNamingItsPathAndChangesNothing) {
  auto net = std::make_shared<Net>();
  try {
    ddp::convert_sync_batchnorm(net);
    FAIL() << "no error";
  } catch (const ddp::InvalidArgumentError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("'encoder.bn1'"), std::string::npos) << message;
    EXPECT_NE(message.find("ddp::SyncBatchNorm2d"), std::string::npos) << message;
    EXPECT_EQ(message.find("head"), std::string::npos) << message;
  }
  // The swappable one was left too: a refused model is unchanged.
  EXPECT_NE(net->head[0]->as<torch::nn::BatchNorm1dImpl>(), nullptr);
}

TEST(SyncBatchNormConversion, ReturnsATopLevelBatchNormConverted) {
  torch::nn::BatchNorm2d plain(3);
  plain->eval();
  auto converted = ddp::convert_sync_batchnorm(plain);
  auto* sync = converted->as<ddp::SyncBatchNorm2dImpl>();
  ASSERT_NE(sync, nullptr);
  EXPECT_TRUE(sync->weight.is_same(plain->weight));
  EXPECT_TRUE(sync->running_var.is_same(plain->running_var));
  EXPECT_FALSE(sync->is_training());
  EXPECT_EQ(sync->options.num_features(), 3);
}
