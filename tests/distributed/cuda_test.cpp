// CUDA tensors through the collectives, DDP, DataParallel and checkpoints.
//
// Every test skips, saying why, where no GPU is present (CI); scripts/gpu_check.sh runs them on
// a machine with one. With fewer GPUs than ranks the ranks share a GPU through gloo (CUDA tensors
// go through the host), since NCCL needs one GPU per rank; NCCL runs at one rank per GPU.
// The test process never touches CUDA itself: its ranks are forks, and CUDA does not survive a
// fork (cuda_devices() asks in a child of its own).
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include "ddp/ddp.h"
#include "support/multiprocess.h"

using ddp::testing::cuda_devices;
using ddp::testing::run_ranks;
using ddp::testing::run_ranks_ok;

namespace {

#define SKIP_WITHOUT_GPU() \
  if (cuda_devices() == 0) GTEST_SKIP() << "no GPU here (CPU libtorch, or none visible)"

// NCCL where every rank can have a GPU of its own, else gloo through the host.
std::string backend_for(int world) { return cuda_devices() >= world ? "nccl" : "gloo"; }

c10::Device device_of(int rank) { return ddp::set_device(rank % cuda_devices()); }

bool same_on_host(const torch::Tensor& a, const torch::Tensor& b, double tolerance = 0) {
  return tolerance == 0 ? torch::equal(a.cpu(), b.cpu())
                        : torch::allclose(a.cpu(), b.cpu(), tolerance, tolerance);
}

}  // namespace

TEST(Cuda, CollectivesOnCudaTensorsAtOneAndTwoRanks) {
  SKIP_WITHOUT_GPU();
  for (int world : {1, 2}) {
    const std::string backend = backend_for(world);
    run_ranks_ok(world, [world, backend](int rank) {
      const auto device = device_of(rank);
      ddp::init_process_group(ddp::InitOptions().backend(backend));
      EXPECT_EQ(ddp::get_backend(), backend);
      const auto on_gpu = torch::TensorOptions().device(device);
      const double sum = world * (world + 1) / 2.0;  // of rank + 1 over the ranks

      auto t = torch::full({1000}, rank + 1.0, on_gpu);
      ddp::all_reduce(t);
      EXPECT_TRUE(t.is_cuda());
      EXPECT_TRUE(same_on_host(t, torch::full({1000}, sum)));
      auto average = torch::full({7}, rank + 1.0, on_gpu);
      ddp::all_reduce(average, ddp::ReduceOp::AVG);
      EXPECT_TRUE(same_on_host(average, torch::full({7}, sum / world)));
      auto biggest = torch::full({3}, rank * 10, on_gpu.dtype(torch::kLong));
      ddp::all_reduce(biggest, ddp::ReduceOp::MAX);
      EXPECT_TRUE(same_on_host(biggest, torch::full({3}, (world - 1) * 10, torch::kLong)));
      auto strided = torch::full({4, 6}, rank + 1.0, on_gpu).t();  // not contiguous
      ddp::all_reduce(strided);
      EXPECT_TRUE(same_on_host(strided, torch::full({6, 4}, sum)));
      auto later = torch::full({5}, rank + 1.0, on_gpu);
      ddp::all_reduce_async(later).wait();
      EXPECT_TRUE(same_on_host(later, torch::full({5}, sum)));

      auto b = torch::full({5}, rank * 1.0, on_gpu);
      ddp::broadcast(b, world - 1);
      EXPECT_TRUE(same_on_host(b, torch::full({5}, world - 1.0)));
      auto parts = ddp::all_gather(torch::full({2}, rank * 1.0, on_gpu));
      ASSERT_EQ(static_cast<int>(parts.size()), world);
      for (int r = 0; r < world; ++r) {
        EXPECT_TRUE(parts[r].is_cuda());
        EXPECT_TRUE(same_on_host(parts[r], torch::full({2}, r * 1.0)));
      }
      std::vector<torch::Tensor> inputs;
      for (int r = 0; r < world; ++r) inputs.push_back(torch::full({3}, r + 10.0 * rank, on_gpu));
      auto out = torch::empty({3}, on_gpu);
      ddp::reduce_scatter(out, inputs);
      EXPECT_TRUE(same_on_host(out, torch::full({3}, world * rank + 10.0 * (sum - world))));
      auto gathered = ddp::gather(torch::full({2}, rank * 1.0, on_gpu), 0);
      if (rank == 0) {
        ASSERT_EQ(static_cast<int>(gathered.size()), world);
        EXPECT_TRUE(gathered.back().is_cuda());
        EXPECT_TRUE(same_on_host(gathered.back(), torch::full({2}, world - 1.0)));
      }
      std::vector<torch::Tensor> pieces;
      if (rank == 0) {
        for (int r = 0; r < world; ++r) pieces.push_back(torch::full({2}, r * 3.0, on_gpu));
      }
      auto piece = torch::empty({2}, on_gpu);
      ddp::scatter(piece, pieces, 0);
      EXPECT_TRUE(same_on_host(piece, torch::full({2}, rank * 3.0)));
      if (world == 2) {
        auto message = torch::full({4}, 42.0, on_gpu);
        if (rank == 0) ddp::send(message, 1);
        if (rank == 1) {
          auto received = torch::zeros({4}, on_gpu);
          ddp::recv(received, 0);
          EXPECT_TRUE(same_on_host(received, message));
        }
      }
      ddp::barrier();
      ddp::destroy_process_group();
    });
  }
}

TEST(Cuda, NcclNeedsOneGpuPerRankAndSaysSo) {
  SKIP_WITHOUT_GPU();
  // Two ranks on GPU 0: "nccl" refuses with both ranks named; "auto" falls back to the host.
  for (const std::string backend : {"nccl", "auto"}) {
    run_ranks_ok(2, [backend](int rank) {
      ddp::set_device(0);
      if (backend == "nccl") {
        try {
          ddp::init_process_group(ddp::InitOptions().backend(backend));
          ADD_FAILURE() << "NCCL accepted two ranks on one GPU";
        } catch (const ddp::DistributedError& error) {
          const std::string what = error.what();
          EXPECT_NE(what.find("ranks 0 and 1 both use the same GPU"), std::string::npos) << what;
          EXPECT_NE(what.find("ddp::set_device()"), std::string::npos) << what;
        }
        return;
      }
      ddp::init_process_group(ddp::InitOptions().backend(backend));
      auto t = torch::full({3}, rank + 1.0, torch::Device(torch::kCUDA, 0));
      ddp::all_reduce(t);
      EXPECT_TRUE(same_on_host(t, torch::full({3}, 3.0)));
      ddp::destroy_process_group();
    });
  }
}

namespace {

torch::nn::Sequential make_net() {
  torch::manual_seed(0);
  return torch::nn::Sequential(torch::nn::Linear(20, 64), torch::nn::ReLU(),
                               torch::nn::Linear(64, 64), torch::nn::ReLU(),
                               torch::nn::Linear(64, 5));
}

}  // namespace

TEST(Cuda, DdpOnCudaEqualsOneProcessWithTheWholeBatch) {
  SKIP_WITHOUT_GPU();
  for (int world : {1, 2}) {
    const std::string backend = backend_for(world);
    run_ranks_ok(world, [world, backend](int rank) {
      constexpr int kPerRank = 8;
      const auto device = device_of(rank);
      ddp::init_process_group(ddp::InitOptions().backend(backend));
      auto reference = make_net();
      reference->to(device);
      auto net = make_net();
      net->to(device);
      ddp::DistributedDataParallel model(net, ddp::DDPOptions().device_ids({device}));
      torch::optim::SGD reference_sgd(reference->parameters(),
                                      torch::optim::SGDOptions(0.05).momentum(0.9));
      torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
      for (int step = 0; step < 10; ++step) {
        torch::manual_seed(100 + step);
        auto x = torch::randn({world * kPerRank, 20});  // on the CPU: DDP moves it
        auto y = torch::randint(0, 5, {world * kPerRank});
        reference_sgd.zero_grad();
        torch::nn::functional::cross_entropy(reference->forward(x.to(device)), y.to(device))
            .backward();
        reference_sgd.step();
        sgd.zero_grad();
        auto output = model(x.narrow(0, rank * kPerRank, kPerRank));
        EXPECT_TRUE(output.is_cuda());
        torch::nn::functional::cross_entropy(output,
                                             y.narrow(0, rank * kPerRank, kPerRank).to(device))
            .backward();
        sgd.step();
      }
      auto params = net->parameters();
      auto expected = reference->parameters();
      for (size_t i = 0; i < params.size(); ++i) {
        EXPECT_TRUE(same_on_host(params[i], expected[i], 1e-5))
            << "parameter " << i << " differs by "
            << (params[i] - expected[i]).abs().max().item<double>();
      }
      ddp::destroy_process_group();
    });
  }
}

TEST(Cuda, DdpDeviceIdsMustNameTheModulesGpu) {
  SKIP_WITHOUT_GPU();
  run_ranks_ok(1, [](int) {
    const auto device = ddp::set_device(0);
    ddp::init_process_group();
    auto on_cpu = make_net();
    try {
      ddp::DistributedDataParallel model(on_cpu, ddp::DDPOptions().device_ids({device}));
      ADD_FAILURE() << "a CPU module was taken with device_ids " << device;
    } catch (const ddp::DistributedError& error) {
      EXPECT_NE(std::string(error.what()).find("but the module's parameters are on cpu"),
                std::string::npos)
          << error.what();
    }
    auto split = make_net();
    (*split)[0]->to(device);  // one layer on the GPU, the rest on the CPU
    EXPECT_THROW(ddp::DistributedDataParallel(split, ddp::DDPOptions()), ddp::DistributedError);
    ddp::destroy_process_group();
  });
}

TEST(Cuda, DataParallelWithTwoReplicasOfOneGpuEqualsThePlainModule) {
  SKIP_WITHOUT_GPU();
  run_ranks_ok(1, [](int) {
    const c10::Device gpu(c10::kCUDA, 0);
    auto plain = make_net();
    plain->to(gpu);
    auto net = make_net();
    net->to(gpu);
    ddp::DataParallel parallel(net, {gpu, gpu});
    torch::manual_seed(7);
    auto x = torch::randn({16, 20}, torch::TensorOptions().device(gpu));
    auto expected = plain->forward(x);
    auto output = parallel(x);
    EXPECT_TRUE(same_on_host(output, expected, 1e-6));
    expected.sum().backward();
    output.sum().backward();
    auto grads = net->parameters();
    auto expected_grads = plain->parameters();
    for (size_t i = 0; i < grads.size(); ++i) {
      EXPECT_TRUE(same_on_host(grads[i].grad(), expected_grads[i].grad(), 1e-5)) << i;
    }
  });
}

TEST(Cuda, CheckpointFromTheGpuLoadsOnTheCpuAndBackOnTheGpu) {
  SKIP_WITHOUT_GPU();
  const std::string path = ddp::testing::fresh_path("gpu.pt");
  run_ranks_ok(1, [path](int) {
    const c10::Device gpu(c10::kCUDA, 0);
    auto trained = make_net();
    trained->to(gpu);
    torch::optim::SGD sgd(trained->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    torch::nn::functional::cross_entropy(
        trained->forward(torch::randn({4, 20}, torch::TensorOptions().device(gpu))),
        torch::randint(0, 5, {4}, torch::TensorOptions().device(gpu)))
        .backward();
    sgd.step();
    ddp::save_checkpoint(path, *trained, &sgd,
                         {{"scale", torch::full({2}, 3.0, torch::TensorOptions().device(gpu))}});

    torch::manual_seed(1);
    auto on_cpu = torch::nn::Sequential(torch::nn::Linear(20, 64), torch::nn::ReLU(),
                                        torch::nn::Linear(64, 64), torch::nn::ReLU(),
                                        torch::nn::Linear(64, 5));
    torch::optim::SGD cpu_sgd(on_cpu->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    auto extra = ddp::load_checkpoint(path, *on_cpu, &cpu_sgd);
    EXPECT_TRUE(extra.at("scale").toTensor().device().is_cpu());  // map_location: the CPU
    auto back = make_net();
    back->to(gpu);
    torch::optim::SGD gpu_sgd(back->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    auto on_gpu = ddp::load_checkpoint(path, *back, &gpu_sgd, ddp::LoadOptions().map_location(gpu));
    EXPECT_TRUE(on_gpu.at("scale").toTensor().is_cuda());
    auto saved = trained->parameters();
    auto cpu_params = on_cpu->parameters();
    auto gpu_params = back->parameters();
    for (size_t i = 0; i < saved.size(); ++i) {
      EXPECT_TRUE(cpu_params[i].device().is_cpu());
      EXPECT_TRUE(gpu_params[i].is_cuda());
      EXPECT_TRUE(same_on_host(cpu_params[i], saved[i])) << i;
      EXPECT_TRUE(same_on_host(gpu_params[i], saved[i])) << i;
    }
    // The momentum buffers follow their parameters: a step from each lands in the same place.
    for (auto* optimizer : {&sgd, &gpu_sgd}) {
      for (auto& p : optimizer->param_groups()[0].params()) p.mutable_grad() = torch::ones_like(p);
      optimizer->step();
    }
    for (size_t i = 0; i < saved.size(); ++i) {
      EXPECT_TRUE(same_on_host(gpu_params[i], saved[i], 1e-6)) << i;
    }
  });
  // Python reads it with a plain torch.load (no map_location): every tensor was saved on the CPU.
  const std::string& python = ddp::testing::torch_python();
  if (python.empty()) return;
  const std::string check = "'" + python + "' -c 'import torch,sys; c=torch.load(sys.argv[1], " +
                            "weights_only=True); assert all(not t.is_cuda for t in " +
                            "c[\"model\"].values()), c' " + path;
  EXPECT_EQ(std::system(check.c_str()), 0) << check;
}
