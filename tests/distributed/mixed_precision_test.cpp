// DistributedDataParallel with mixed precision: forward and backward on bfloat16 copies, float32
// masters and gradients, buckets in reduce_dtype (counted at the backend), equivalence with one
// process running the same bfloat16 computation, and the combinations it refuses.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

#include "ddp/ddp.h"
#include "process_group/group_state.h"
#include "support/multiprocess.h"

using ddp::testing::run_ranks_ok;

namespace {

constexpr int kMpBatchPerRank = 4;

// Checks, inside its forward, the dtypes that mixed precision promises there.
struct CheckedNetImpl : torch::nn::Module {
  CheckedNetImpl() {
    torch::manual_seed(0);
    fc1 = register_module("fc1", torch::nn::Linear(6, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 3));
  }
  torch::Tensor forward(torch::Tensor x) {
    if (expected_dtype) {
      EXPECT_EQ(fc1->weight.scalar_type(), *expected_dtype);
      EXPECT_EQ(fc2->bias.scalar_type(), *expected_dtype);
      EXPECT_EQ(x.scalar_type(), *expected_dtype);
      ++checked_forwards;
    }
    return fc2(torch::relu(fc1(x)));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  std::optional<c10::ScalarType> expected_dtype;
  int checked_forwards = 0;
};
TORCH_MODULE(CheckedNet);

ddp::MixedPrecision bf16() { return ddp::MixedPrecision().param_dtype(torch::kBFloat16); }

std::pair<torch::Tensor, torch::Tensor> mp_batch(int world, int step) {
  torch::manual_seed(500 + step);
  return {torch::randn({world * kMpBatchPerRank, 6}), torch::randn({world * kMpBatchPerRank, 3})};
}

torch::Tensor mp_slice(const torch::Tensor& t, int rank) {
  return t.narrow(0, rank * kMpBatchPerRank, kMpBatchPerRank);
}

torch::Tensor mp_loss(const torch::Tensor& out, const torch::Tensor& y) {
  return torch::mse_loss(out.to(torch::kFloat), y);
}

std::vector<torch::Tensor> grads_of(torch::nn::Module& module) {
  std::vector<torch::Tensor> grads;
  for (const auto& p : module.parameters()) grads.push_back(p.grad().to(torch::kFloat).clone());
  return grads;
}

// The reference: one process, the same model cast to bfloat16, the whole batch.
std::vector<torch::Tensor> bf16_reference_grads(int world, int step) {
  CheckedNet reference;
  reference->to(torch::kBFloat16);
  auto [x, y] = mp_batch(world, step);
  mp_loss(reference->forward(x.to(torch::kBFloat16)), y).backward();
  return grads_of(*reference);
}

// Tolerance: both sides run the same bfloat16 operations; they differ in how rounding falls. Each
// rank's gradient is rounded to bfloat16 (8 significant bits: relative error up to 2^-9), the
// average of the two is rounded again in the bucket, and the reference rounds its whole-batch
// gradient once; the matrix products round their bfloat16 outputs over different batch sizes. A
// few units of 2^-8 relative to the gradient's norm cover that; 1/32 (8 units) leaves margin for
// cancellation, yet a missing average (a factor 2) or a rank's own half-batch gradient are far
// outside it. Measured with python3-torch 1.13 on this model and data: the bf16 average against
// the reference 0.000 to 0.006 of the norm, a rank's own gradient 0.6 to 1.8.
constexpr double kBf16RelativeTolerance = 1.0 / 32;

void expect_close_to_reference(const std::vector<torch::Tensor>& mine,
                               const std::vector<torch::Tensor>& reference) {
  ASSERT_EQ(mine.size(), reference.size());
  for (size_t i = 0; i < mine.size(); ++i) {
    const double error = (mine[i] - reference[i]).norm().item<double>();
    const double scale = reference[i].norm().item<double>();
    EXPECT_LT(error, kBf16RelativeTolerance * scale)
        << "parameter " << i << ": |difference| " << error << ", |reference| " << scale;
  }
}

// Two synchronized steps of 2 ranks with bf16 mixed precision against the one-process bf16
// reference: after backward the parameters are float32 with float32 grads close to the
// reference's, identical on both ranks.
void expect_mixed_precision_matches_bf16_reference(int rank, ddp::DDPOptions options) {
  CheckedNet net;
  ddp::DistributedDataParallel model(net, options.mixed_precision(bf16()));
  for (int step = 0; step < 2; ++step) {
    auto [x, y] = mp_batch(2, step);
    for (auto& p : net->parameters()) p.mutable_grad().reset();
    net->expected_dtype = torch::kBFloat16;
    mp_loss(model(mp_slice(x, rank)), mp_slice(y, rank)).backward();
    net->expected_dtype.reset();
    for (const auto& p : net->parameters()) {
      EXPECT_EQ(p.scalar_type(), torch::kFloat);
      ASSERT_TRUE(p.grad().defined());
      EXPECT_EQ(p.grad().scalar_type(), torch::kFloat);
    }
    auto mine = grads_of(*net);
    expect_close_to_reference(mine, bf16_reference_grads(2, step));
    for (const auto& grad : mine) {
      auto all = ddp::all_gather(grad);
      EXPECT_TRUE(torch::equal(all[0], all[1]));
    }
  }
  EXPECT_EQ(net->checked_forwards, 2);
}

uint64_t all_reduce_bytes() {
  return ddp::ProcessGroup().state()->traffic.bytes(ddp::detail::Collective::kAllReduce);
}
uint64_t all_gather_bytes() {
  return ddp::ProcessGroup().state()->traffic.bytes(ddp::detail::Collective::kAllGather);
}

int64_t parameter_count(torch::nn::Module& module) {
  int64_t count = 0;
  for (const auto& p : module.parameters()) count += p.numel();
  return count;
}

// Bytes of kAllReduce and kAllGather handed to the backend by `steps` synchronized steps.
std::pair<uint64_t, uint64_t> bytes_of_steps(int rank, const ddp::MixedPrecision& config,
                                            int steps) {
  CheckedNet net;
  ddp::DistributedDataParallel model(net, ddp::DDPOptions()
                                              .mixed_precision(config)
                                              .broadcast_buffers(false));
  // The first step records the ready order (a broadcast) and reduces after backward; count the
  // steady ones.
  auto [x, y] = mp_batch(2, 0);
  mp_loss(model(mp_slice(x, rank)), mp_slice(y, rank)).backward();
  const uint64_t reduced = all_reduce_bytes(), gathered = all_gather_bytes();
  for (int step = 0; step < steps; ++step) {
    mp_loss(model(mp_slice(x, rank)), mp_slice(y, rank)).backward();
  }
  return {all_reduce_bytes() - reduced, all_gather_bytes() - gathered};
}

std::string message_of(const std::function<void()>& body) {
  try {
    body();
  } catch (const ddp::InvalidArgumentError& error) {
    return error.what();
  }
  return "(no InvalidArgumentError)";
}

bool cpu_multiplies_float16() {
  try {
    auto a = torch::ones({2, 2}, torch::kHalf);
    (void)a.mm(a);
    return true;
  } catch (const c10::Error&) {
    return false;
  }
}

}  // namespace

TEST(MixedPrecision, DtypesDefaultToParamDtype) {
  auto config = ddp::MixedPrecision().param_dtype(torch::kBFloat16);
  EXPECT_EQ(config.effective_reduce_dtype(), torch::kBFloat16);
  EXPECT_EQ(config.effective_buffer_dtype(), torch::kBFloat16);
  config.reduce_dtype(torch::kFloat).buffer_dtype(torch::kFloat);
  EXPECT_EQ(config.effective_reduce_dtype(), torch::kFloat);
  EXPECT_EQ(config.effective_buffer_dtype(), torch::kFloat);
  EXPECT_FALSE(ddp::DDPOptions().mixed_precision().has_value());
}

TEST(MixedPrecision, TwoRanksEqualOneProcessRunningTheSameBf16ComputationOnTheWholeBatch) {
  for (const char* backend : {"gloo", "shm"}) {
    run_ranks_ok(2, [backend](int rank) {
      ddp::init_process_group(ddp::InitOptions().backend(backend));
      // Several buckets (the bf16 model is ~330 bytes of gradients).
      auto options = ddp::DDPOptions().bucket_cap_mb(0.0002).first_bucket_cap_mb(0.0001);
      expect_mixed_precision_matches_bf16_reference(rank, options);
      expect_mixed_precision_matches_bf16_reference(rank, ddp::DDPOptions().static_graph(true));
      expect_mixed_precision_matches_bf16_reference(
          rank, ddp::DDPOptions().find_unused_parameters(true));
      ddp::destroy_process_group();
    });
  }
}

TEST(MixedPrecision, AnUpdateBelowBf16ResolutionStillMovesTheFloat32Master) {
  run_ranks_ok(2, [](int rank) {
    ddp::init_process_group(ddp::InitOptions().backend("gloo"));
    auto net = std::make_shared<torch::nn::LinearImpl>(
        torch::nn::LinearOptions(1, 1).bias(false));
    net->weight.data().fill_(1.0);
    ddp::DistributedDataParallel model(net, ddp::DDPOptions().mixed_precision(bf16()));
    torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(1e-4));
    // d(sum(w * 1))/dw = 1 on every rank: the average is 1, the update lr * 1 = 1e-4, below half
    // of bfloat16's spacing just under 1 (2^-9 ~ 0.002).
    const float one_step = 1.0f - 1e-4f;
    EXPECT_EQ(torch::tensor({one_step}).to(torch::kBFloat16).item<float>(), 1.0f);
    optimizer.zero_grad();
    model(torch::ones({1, 1})).sum().backward();
    EXPECT_EQ(net->weight.grad().scalar_type(), torch::kFloat);
    EXPECT_FLOAT_EQ(net->weight.grad().item<float>(), 1.0f);
    optimizer.step();
    EXPECT_EQ(net->weight.scalar_type(), torch::kFloat);
    EXPECT_FLOAT_EQ(net->weight.item<float>(), one_step);
    for (int step = 1; step < 30; ++step) {
      optimizer.zero_grad();
      model(torch::ones({1, 1})).sum().backward();
      optimizer.step();
    }
    // 30 updates of 1e-4: the master is at 0.997, whose bfloat16 copy is no longer 1.
    EXPECT_NEAR(net->weight.item<float>(), 1.0f - 30e-4f, 1e-6);
    torch::NoGradGuard no_grad;
    EXPECT_LT(model(torch::ones({1, 1})).item<float>(), 1.0f);
    (void)rank;
    ddp::destroy_process_group();
  });
}

TEST(MixedPrecision, AccumulationWithoutZeroGradAddsTheNewFloat32AverageToTheOldGrad) {
  run_ranks_ok(2, [](int rank) {
    ddp::init_process_group(ddp::InitOptions().backend("gloo"));
    CheckedNet net;
    ddp::DistributedDataParallel model(net, ddp::DDPOptions().mixed_precision(bf16()));
    auto [x1, y1] = mp_batch(2, 1);
    auto [x2, y2] = mp_batch(2, 2);
    mp_loss(model(mp_slice(x1, rank)), mp_slice(y1, rank)).backward();
    auto first = grads_of(*net);
    for (auto& p : net->parameters()) p.mutable_grad().reset();
    mp_loss(model(mp_slice(x2, rank)), mp_slice(y2, rank)).backward();
    auto second = grads_of(*net);
    for (auto& p : net->parameters()) p.mutable_grad().reset();
    // Both again, without resetting in between: the sum of the two float32 averages, exactly.
    mp_loss(model(mp_slice(x1, rank)), mp_slice(y1, rank)).backward();
    mp_loss(model(mp_slice(x2, rank)), mp_slice(y2, rank)).backward();
    auto both = grads_of(*net);
    for (size_t i = 0; i < both.size(); ++i) {
      EXPECT_EQ(net->parameters()[i].grad().scalar_type(), torch::kFloat);
      EXPECT_TRUE(torch::equal(both[i], first[i] + second[i])) << "parameter " << i;
    }
    ddp::destroy_process_group();
  });
}

TEST(MixedPrecision, ANoGradForwardRunsInBf16AndLeavesFloat32ParametersAndGradsUntouched) {
  run_ranks_ok(2, [](int rank) {
    ddp::init_process_group(ddp::InitOptions().backend("gloo"));
    CheckedNet net;
    ddp::DistributedDataParallel model(net, ddp::DDPOptions().mixed_precision(bf16()));
    auto [x, y] = mp_batch(2, 0);
    mp_loss(model(mp_slice(x, rank)), mp_slice(y, rank)).backward();
    auto grads = grads_of(*net);
    auto before = net->fc1->weight.detach().clone();
    {
      torch::NoGradGuard no_grad;
      net->expected_dtype = torch::kBFloat16;
      auto out = model(mp_slice(x, rank));
      EXPECT_EQ(out.scalar_type(), torch::kBFloat16);
      net->expected_dtype.reset();
    }
    EXPECT_EQ(net->checked_forwards, 1);
    for (const auto& p : net->parameters()) EXPECT_EQ(p.scalar_type(), torch::kFloat);
    EXPECT_TRUE(torch::equal(net->fc1->weight, before));
    auto after = grads_of(*net);
    for (size_t i = 0; i < grads.size(); ++i) EXPECT_TRUE(torch::equal(grads[i], after[i]));
    ddp::destroy_process_group();
  });
}

TEST(MixedPrecision, BuffersAreBf16InForwardAndKeepWhatForwardWroteInFloat32) {
  run_ranks_ok(2, [](int rank) {
    ddp::init_process_group(ddp::InitOptions().backend("gloo"));
    torch::manual_seed(0);
    torch::nn::BatchNorm1d norm(8);
    auto net = torch::nn::Sequential(torch::nn::Linear(6, 8), norm, torch::nn::Linear(8, 3));
    ddp::DistributedDataParallel model(net, ddp::DDPOptions().mixed_precision(bf16()));
    auto [x, y] = mp_batch(2, 0);
    auto out = model(mp_slice(x, rank));
    EXPECT_EQ(norm->running_mean.scalar_type(), torch::kBFloat16);  // until backward ends
    mp_loss(out, mp_slice(y, rank)).backward();
    EXPECT_EQ(norm->running_mean.scalar_type(), torch::kFloat);
    EXPECT_EQ(norm->num_batches_tracked.scalar_type(), torch::kLong);
    EXPECT_EQ(norm->num_batches_tracked.item<int64_t>(), 1);
    EXPECT_GT(norm->running_mean.abs().sum().item<float>(), 0.0f);  // forward's update was kept
    // It was computed in bfloat16: the float32 master holds bfloat16 values.
    EXPECT_TRUE(torch::equal(norm->running_mean,
                             norm->running_mean.to(torch::kBFloat16).to(torch::kFloat)));
    ddp::destroy_process_group();
  });
}

TEST(MixedPrecision, Bf16ReduceDtypeHandsTheBackendHalfTheBytesOfFloat32) {
  run_ranks_ok(2, [](int rank) {
    ddp::init_process_group(ddp::InitOptions().backend("shm"));
    CheckedNet probe;
    const uint64_t count = static_cast<uint64_t>(parameter_count(*probe));
    constexpr int kSteps = 3;
    auto [bf16_reduced, bf16_gathered] = bytes_of_steps(rank, bf16(), kSteps);
    auto [fp32_reduced, fp32_gathered] =
        bytes_of_steps(rank, bf16().reduce_dtype(torch::kFloat), kSteps);
    EXPECT_EQ(fp32_reduced, kSteps * count * 4);
    EXPECT_EQ(bf16_reduced, kSteps * count * 2);
    EXPECT_EQ(bf16_gathered, 0u);
    EXPECT_EQ(fp32_gathered, 0u);
    ddp::destroy_process_group();
  });
  // gloo has no bfloat16 sum: the same bf16 bytes go to it as an all-gather.
  run_ranks_ok(2, [](int rank) {
    ddp::init_process_group(ddp::InitOptions().backend("gloo"));
    CheckedNet probe;
    const uint64_t count = static_cast<uint64_t>(parameter_count(*probe));
    auto [reduced, gathered] = bytes_of_steps(rank, bf16(), 2);
    EXPECT_EQ(reduced, 0u);
    EXPECT_EQ(gathered, 2 * count * 2);
    ddp::destroy_process_group();
  });
}

TEST(MixedPrecision, CombinationsItCannotServeAreRefusedByName) {
  run_ranks_ok(2, [](int) {
    ddp::init_process_group(ddp::InitOptions().backend("gloo"));
    CheckedNet net;
    auto message = message_of([&] {
      ddp::DistributedDataParallel model(
          net, ddp::DDPOptions().mixed_precision(bf16()).gradient_as_bucket_view(true));
    });
    EXPECT_NE(message.find("gradient_as_bucket_view"), std::string::npos) << message;
    EXPECT_NE(message.find("mixed_precision"), std::string::npos) << message;

    message = message_of([&] {
      ddp::DistributedDataParallel model(
          net, ddp::DDPOptions().mixed_precision(ddp::MixedPrecision().reduce_dtype(torch::kInt)));
    });
    EXPECT_NE(message.find("reduce_dtype must be a floating-point dtype"), std::string::npos)
        << message;

    ddp::DistributedDataParallel model(net, ddp::DDPOptions().mixed_precision(bf16()));
    message = message_of([&] { model.register_comm_hook(ddp::comm_hooks::bf16_compress()); });
    EXPECT_NE(message.find("comm hooks do not combine with mixed_precision"), std::string::npos)
        << message;
    message = message_of([&] { auto guard = model.no_sync(); });
    EXPECT_NE(message.find("no_sync() does not combine with mixed_precision"), std::string::npos)
        << message;
    // Still usable after the refusals, synchronized.
    auto [x, y] = mp_batch(2, 0);
    mp_loss(model(x.narrow(0, 0, 2)), y.narrow(0, 0, 2)).backward();
    EXPECT_EQ(net->fc1->weight.grad().scalar_type(), torch::kFloat);
    ddp::destroy_process_group();
  });
}

TEST(MixedPrecision, Float16OnTheCpuIsRefusedOnlyWhereLibtorchCannotMultiplyIt) {
  run_ranks_ok(2, [](int rank) {
    ddp::init_process_group(ddp::InitOptions().backend("gloo"));
    CheckedNet net;
    auto fp16 = ddp::DDPOptions().mixed_precision(ddp::MixedPrecision().param_dtype(torch::kHalf));
    if (!cpu_multiplies_float16()) {
      auto message = message_of([&] { ddp::DistributedDataParallel model(net, fp16); });
      EXPECT_NE(message.find("cannot multiply float16 matrices on the CPU"), std::string::npos)
          << message;
      EXPECT_NE(message.find("kBFloat16"), std::string::npos) << message;
    } else {
      ddp::DistributedDataParallel model(net, fp16);
      auto [x, y] = mp_batch(2, 0);
      net->expected_dtype = torch::kHalf;
      mp_loss(model(mp_slice(x, rank)), mp_slice(y, rank)).backward();
      EXPECT_EQ(net->checked_forwards, 1);
      EXPECT_EQ(net->fc1->weight.grad().scalar_type(), torch::kFloat);
      auto all = ddp::all_gather(net->fc1->weight.grad());
      EXPECT_TRUE(torch::equal(all[0], all[1]));
    }
    ddp::destroy_process_group();
  });
}
