// CUDA: what "auto" chooses, DDP's options and comm hooks on CUDA tensors, buffers, sub-groups,
// devices from LOCAL_RANK, an NCCL peer that dies, DataParallel across GPUs.
//
// As in cuda_test.cpp: every test skips saying "no GPU" where there is none (CI), a test that
// needs two GPUs says "needs 2 GPUs", and the test process never touches CUDA itself (its ranks
// are forks). scripts/gpu_check.sh runs them where a GPU is lent.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>

#include "ddp/ddp.h"
#include "ddp/powersgd_hook.h"
#include "support/multiprocess.h"

using ddp::testing::cuda_devices;
using ddp::testing::run_ranks;
using ddp::testing::run_ranks_ok;

namespace {

#define SKIP_WITHOUT_GPUS(n)                                                              \
  if (cuda_devices() == 0) GTEST_SKIP() << "no GPU here (CPU libtorch, or none visible)"; \
  if (cuda_devices() < (n))                                                               \
  GTEST_SKIP() << "needs " << (n) << " GPUs, this machine has " << cuda_devices()

torch::nn::Sequential make_net() {
  torch::manual_seed(0);
  return torch::nn::Sequential(torch::nn::Linear(20, 64), torch::nn::ReLU(),
                               torch::nn::Linear(64, 64), torch::nn::ReLU(),
                               torch::nn::Linear(64, 5));
}

// Trains `net` for `steps` steps of a seeded batch through `forward`: this rank's part of it
// where `wrapped` (DDP moves it to the device), else all of it on `device`.
void train(torch::nn::Sequential& net, const std::function<torch::Tensor(torch::Tensor)>& forward,
           bool wrapped, c10::Device device, int rank, int world, int steps) {
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  constexpr int kPerRank = 8;
  for (int step = 0; step < steps; ++step) {
    torch::manual_seed(100 + step);
    auto x = torch::randn({world * kPerRank, 20});
    auto y = torch::randint(0, 5, {world * kPerRank});
    if (wrapped) {
      x = x.narrow(0, rank * kPerRank, kPerRank);
      y = y.narrow(0, rank * kPerRank, kPerRank);
    }
    sgd.zero_grad();
    auto out = forward(wrapped ? x : x.to(device));
    torch::nn::functional::cross_entropy(out, y.to(device)).backward();
    sgd.step();
  }
}

void expect_close(torch::nn::Sequential& a, torch::nn::Sequential& b, double tolerance) {
  auto pa = a->parameters();
  auto pb = b->parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_TRUE(torch::allclose(pa[i].cpu(), pb[i].cpu(), tolerance, tolerance))
        << "parameter " << i << " differs by "
        << (pa[i].cpu() - pb[i].cpu()).abs().max().item<double>();
  }
}

}  // namespace

TEST(Cuda, AutoGivesCudaTensorsToNcclWhereEveryRankHasAGpuOfItsOwn) {
  SKIP_WITHOUT_GPUS(1);
  const int world = std::min(cuda_devices(), 2);
  run_ranks_ok(world, [world](int rank) {
    const auto device = ddp::set_device(rank);
    ddp::init_process_group();  // "auto"
    EXPECT_EQ(ddp::get_backend(), world == 1 ? "cpu:gloo,cuda:nccl" : "cpu:shm,cuda:nccl");
    auto t = torch::full({4}, rank + 1.0, torch::TensorOptions().device(device));
    ddp::all_reduce(t);
    EXPECT_TRUE(torch::equal(t.cpu(), torch::full({4}, world * (world + 1) / 2.0)));
    ddp::barrier();  // on the GPU (NCCL), ordering what was queued before it
    ddp::destroy_process_group();
  });
}

TEST(Cuda, DdpOptionsAndCommHooksOnCudaMatchThePlainModule) {
  SKIP_WITHOUT_GPUS(1);
  struct Variant {
    const char* name;
    ddp::DDPOptions options;
    std::function<ddp::CommHook()> hook;
    double tolerance;
  };
  const std::vector<Variant> variants = {
      {"plain", ddp::DDPOptions(), nullptr, 1e-5},
      {"gradient_as_bucket_view", ddp::DDPOptions().gradient_as_bucket_view(true), nullptr, 1e-5},
      {"find_unused_parameters", ddp::DDPOptions().find_unused_parameters(true), nullptr, 1e-5},
      {"static_graph", ddp::DDPOptions().static_graph(true), nullptr, 1e-5},
      {"fp16", ddp::DDPOptions(), [] { return ddp::comm_hooks::fp16_compress(); }, 1e-2},
      {"bf16", ddp::DDPOptions(), [] { return ddp::comm_hooks::bf16_compress(); }, 5e-2},
      {"powerSGD", ddp::DDPOptions(),
       [] {
         return ddp::comm_hooks::powerSGD(
             ddp::PowerSGDOptions().start_powerSGD_iter(2).matrix_approximation_rank(4));
       },
       5e-1},
  };
  for (const auto& variant : variants) {
    SCOPED_TRACE(variant.name);
    run_ranks_ok(1, [&variant](int rank) {
      const auto device = ddp::set_device(rank);
      ddp::init_process_group();
      auto reference = make_net();
      reference->to(device);
      train(
          reference, [&](torch::Tensor x) { return reference->forward(x); }, false, device, rank, 1,
          6);
      auto net = make_net();
      net->to(device);
      ddp::DDPOptions options = variant.options;
      ddp::DistributedDataParallel model(net, options.device_ids({device}));
      if (variant.hook) model.register_comm_hook(variant.hook());
      train(
          net, [&](torch::Tensor x) { return model(x); }, true, device, rank, 1, 6);
      expect_close(net, reference, variant.tolerance);
      ddp::destroy_process_group();
    });
  }
}

TEST(Cuda, NoSyncAccumulatesOnCudaAndTheNextStepReducesTheSum) {
  SKIP_WITHOUT_GPUS(1);
  run_ranks_ok(1, [](int rank) {
    const auto device = ddp::set_device(rank);
    ddp::init_process_group();
    auto net = make_net();
    net->to(device);
    ddp::DistributedDataParallel model(net, ddp::DDPOptions().device_ids({device}));
    auto x = torch::randn({8, 20});
    {
      auto guard = model.no_sync();
      model(x).sum().backward();
    }
    model(x).sum().backward();
    auto reference = make_net();
    reference->to(device);
    (reference->forward(x.to(device)).sum() * 2).backward();
    for (size_t i = 0; i < net->parameters().size(); ++i) {
      EXPECT_TRUE(torch::allclose(net->parameters()[i].grad().cpu(),
                                  reference->parameters()[i].grad().cpu(), 1e-5, 1e-5));
    }
    ddp::destroy_process_group();
  });
}

TEST(Cuda, BatchNormBuffersOnCudaAreBroadcastFromRankZeroBeforeEachForward) {
  SKIP_WITHOUT_GPUS(1);
  const int world = 2;  // sharing one GPU through gloo where there is only one
  const std::string backend = cuda_devices() >= world ? "auto" : "gloo";
  run_ranks_ok(world, [backend](int rank) {
    const auto device = ddp::set_device(rank % cuda_devices());
    ddp::init_process_group(ddp::InitOptions().backend(backend));
    torch::nn::Sequential net(torch::nn::Linear(6, 4), torch::nn::BatchNorm1d(4));
    net->to(device);
    ddp::DistributedDataParallel model(net, ddp::DDPOptions().device_ids({device}));
    net->eval();  // running statistics are used, not updated
    auto running_mean = net->named_buffers()["1.running_mean"];
    if (rank == 1) running_mean.fill_(7.0);
    model(torch::randn({3, 6}));
    EXPECT_TRUE(torch::equal(running_mean.cpu(), torch::zeros({4})))
        << "rank " << rank << " kept its own running mean";
    ddp::destroy_process_group();
  });
}

TEST(Cuda, NewGroupWithNcclOnCudaTensors) {
  SKIP_WITHOUT_GPUS(1);
  const int world = std::min(cuda_devices(), 2);
  run_ranks_ok(world, [world](int rank) {
    const auto device = ddp::set_device(rank);
    ddp::init_process_group(ddp::InitOptions().backend("gloo"));
    std::vector<int> all;
    for (int r = 0; r < world; ++r) all.push_back(r);
    auto group = ddp::new_group(all, "nccl");
    auto t = torch::full({3}, rank + 1.0, torch::TensorOptions().device(device));
    ddp::all_reduce(t, ddp::ReduceOp::SUM, group);
    EXPECT_TRUE(torch::equal(t.cpu(), torch::full({3}, world * (world + 1) / 2.0)));
    ddp::destroy_process_group();
  });
}

TEST(Cuda, AProcessThatSeesOneGpuTakesItWhateverItsLocalRank) {
  SKIP_WITHOUT_GPUS(1);
  run_ranks_ok(1, [](int) {
    ::setenv("CUDA_VISIBLE_DEVICES", "0", 1);  // before this fork touches CUDA
    ::setenv("LOCAL_RANK", "3", 1);
    EXPECT_EQ(ddp::set_device(), c10::Device(c10::kCUDA, 0));
  });
}

TEST(Cuda, ANcclPeerThatDiesFailsTheOtherWithinTheTimeout) {
  SKIP_WITHOUT_GPUS(2);
  ddp::testing::Launch launch;
  launch.world_size = 2;
  auto outcomes = run_ranks(launch, [](int rank) {
    const auto device = ddp::set_device(rank);
    ddp::init_process_group(ddp::InitOptions().backend("nccl").timeout(std::chrono::seconds(10)));
    auto t = torch::ones({16}, torch::TensorOptions().device(device));
    ddp::all_reduce(t);
    if (rank == 1) ::_exit(3);  // gone before the second all_reduce
    try {
      ddp::all_reduce(t);
      ADD_FAILURE() << "the all_reduce with a dead peer succeeded";
    } catch (const ddp::DistributedError& error) {
      EXPECT_NE(std::string(error.what()).find("all_reduce"), std::string::npos) << error.what();
    }
    ::_exit(::testing::Test::HasFailure() ? 1 : 0);
  });
  EXPECT_EQ(outcomes[0].exit_code, 0) << outcomes[0].describe();
  EXPECT_EQ(outcomes[1].exit_code, 3) << outcomes[1].describe();
}

TEST(Cuda, DataParallelAcrossTwoGpusEqualsThePlainModule) {
  SKIP_WITHOUT_GPUS(2);
  run_ranks_ok(1, [](int) {
    auto reference = make_net();
    reference->to(torch::Device(torch::kCUDA, 0));
    auto net = make_net();
    net->to(torch::Device(torch::kCUDA, 0));
    ddp::DataParallel parallel(net,
                               {torch::Device(torch::kCUDA, 0), torch::Device(torch::kCUDA, 1)});
    auto x = torch::randn({16, 20}, torch::Device(torch::kCUDA, 0));
    parallel(x).sum().backward();
    reference->forward(x).sum().backward();
    for (size_t i = 0; i < net->parameters().size(); ++i) {
      EXPECT_TRUE(torch::allclose(net->parameters()[i].grad().cpu(),
                                  reference->parameters()[i].grad().cpu(), 1e-5, 1e-5));
    }
  });
}
