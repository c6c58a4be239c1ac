// Uneven inputs: ranks with different numbers of batches. Without ddp::Join every rank fails
// clearly, on every backend, when one leaves DDP's loop early; with it, the ranks that finish
// early shadow the others' collectives and all end with the model PyTorch's DDP + Join reaches.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <torch/torch.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

#include "ddp/ddp.h"
#include "support/multiprocess.h"

using ddp::testing::elapsed_ms;
using ddp::testing::run_ranks;
using ddp::testing::run_ranks_ok;

namespace {

// For the tests whose ranks fail: their errors come within it. The others take a long one, so
// that a loaded machine cannot fail them.
constexpr auto kShortTimeout = std::chrono::seconds(4);
constexpr auto kTimeout = std::chrono::seconds(60);

torch::nn::Sequential small_mlp(bool with_batchnorm = false) {
  torch::manual_seed(0);
  torch::nn::Sequential net(torch::nn::Linear(6, 8), torch::nn::Tanh(), torch::nn::Linear(8, 3));
  if (with_batchnorm) net->push_back(torch::nn::BatchNorm1d(3));
  return net;
}

void train_steps(ddp::DistributedDataParallel<torch::nn::Sequential>& model,
                 torch::optim::Optimizer& optimizer, int steps) {
  for (int step = 0; step < steps; ++step) {
    optimizer.zero_grad();
    model(torch::randn({4, 6})).pow(2).sum().backward();
    optimizer.step();
  }
}

template <typename Error, typename Action>
std::string expect_error_saying(Action&& action, std::initializer_list<const char*> parts) {
  try {
    action();
    ADD_FAILURE() << "expected " << typeid(Error).name();
  } catch (const Error& e) {
    for (const char* part : parts) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
          << "missing '" << part << "' in: " << e.what();
    }
    return e.what();
  }
  return "";
}

// Every backend the uneven-input checks must hold on. "hierarchical": ranks posing as hosts.
const char* const kBackends[] = {"shm", "gloo", "hierarchical"};

void init_for(const std::string& backend, int rank,
              std::chrono::milliseconds timeout = kShortTimeout) {
  if (backend == "hierarchical") {
    ::setenv("DDP_CPP_HOST_ID", rank % 2 == 0 ? "a" : "b", 1);
    ddp::init_process_group(ddp::InitOptions().timeout(timeout));
    ASSERT_EQ(ddp::get_backend(), "hierarchical");
  } else {
    ddp::init_process_group(ddp::InitOptions().backend(backend).timeout(timeout));
  }
}

}  // namespace

// The case of the issue: rank 0 has 3 batches, the others 2; then every rank all-reduces a tensor
// the size of a bucket. Before, shm failed with "call kind/dtype/count 4/0/40 against ..." and
// gloo after the whole timeout with "a peer did not take part".
TEST(UnevenInputs, ARankThatGoesOnToAnotherCollectiveFailsEveryRankNamingJoin) {
  for (std::string backend : kBackends) {
    const int world = backend == "hierarchical" ? 4 : 2;
    run_ranks_ok(world, [backend](int rank) {
      // A long timeout: the error must come at once, not from the timeout.
      init_for(backend, rank, std::chrono::seconds(20));
      auto net = small_mlp();
      ddp::DistributedDataParallel model(net);
      torch::optim::SGD optimizer(net->parameters(), 0.1);
      train_steps(model, optimizer, 2);
      auto start = std::chrono::steady_clock::now();
      expect_error_saying<ddp::MismatchError>(
          [&] {
            train_steps(model, optimizer, rank == 0 ? 1 : 0);
            auto t = torch::ones({83});  // the parameters' element count
            ddp::all_reduce(t);
          },
          {"DistributedDataParallel's gradient all-reduce (backward) of 83 Float elements",
           "all_reduce of 83 Float elements", "uneven inputs", "ddp::Join"});
      EXPECT_LT(elapsed_ms(start), 10000) << backend << ": long before the timeout";
    });
  }
}

// Buffers are broadcast in forward, the step's first collective then.
TEST(UnevenInputs, ARankThatLeavesWhileOthersBroadcastBuffersFailsEveryRank) {
  run_ranks_ok(2, [](int rank) {
    ddp::init_process_group(ddp::InitOptions().backend("gloo").timeout(kShortTimeout));
    auto net = small_mlp(/*with_batchnorm=*/true);
    ddp::DistributedDataParallel model(net);
    torch::optim::SGD optimizer(net->parameters(), 0.1);
    train_steps(model, optimizer, 2);
    expect_error_saying<ddp::MismatchError>(
        [&] {
          train_steps(model, optimizer, rank == 0 ? 1 : 0);
          ddp::barrier();
        },
        {"DistributedDataParallel's buffer broadcast (forward)", "calls barrier",
         "uneven inputs", "ddp::Join"});
  });
}

TEST(UnevenInputs, ARankThatExitsFailsTheOthersWithAPeerLostErrorNamingJoin) {
  for (std::string backend : kBackends) {
    const int world = backend == "hierarchical" ? 4 : 2;
    ddp::testing::Launch launch;
    launch.world_size = world;
    auto outcomes = run_ranks(launch, [backend, world](int rank) {
      init_for(backend, rank);
      auto net = small_mlp();
      ddp::DistributedDataParallel model(net);
      torch::optim::SGD optimizer(net->parameters(), 0.1);
      train_steps(model, optimizer, 2);
      if (rank == world - 1) ::_exit(0);  // out of data: done
      auto start = std::chrono::steady_clock::now();
      auto what = expect_error_saying<ddp::PeerLostError>(
          [&] { train_steps(model, optimizer, 1); }, {"uneven inputs", "ddp::Join"});
      std::fprintf(stderr, "%s rank %d: %s\n", backend.c_str(), rank, what.c_str());
      EXPECT_LT(elapsed_ms(start), 4000 + 3000) << backend;
    });
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(outcomes[r].exit_code, 0) << backend << ": " << outcomes[r].describe();
    }
  }
}

TEST(UnevenInputs, ARankThatDestroysTheGroupFailsTheOthersNamingJoin) {
  for (std::string backend : kBackends) {
    const int world = backend == "hierarchical" ? 4 : 2;
    auto* reported = static_cast<std::atomic<int>*>(::mmap(
        nullptr, sizeof(std::atomic<int>), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
        -1, 0));
    ASSERT_NE(reported, MAP_FAILED);
    reported->store(0);
    ddp::testing::Launch launch;
    launch.world_size = world;
    auto outcomes = run_ranks(launch, [backend, world, reported](int rank) {
      // Not the short timeout: the error comes from the destroy, not a timeout, and on pip's 2.15
      // a first connect to rank 0's store has twice stalled for 4 s here (unexplained).
      init_for(backend, rank, std::chrono::seconds(20));
      {
        auto net = small_mlp();
        ddp::DistributedDataParallel model(net);
        torch::optim::SGD optimizer(net->parameters(), 0.1);
        train_steps(model, optimizer, 2);
        if (rank == world - 1) {
          ddp::destroy_process_group();
          // Alive until the others have their error: not a lost process, a group torn down.
          while (reported->load() < world - 1) std::this_thread::yield();
          return;
        }
        auto what = expect_error_saying<ddp::DistributedError>(
            [&] { train_steps(model, optimizer, 1); }, {"uneven inputs", "ddp::Join"});
        std::fprintf(stderr, "%s rank %d: %s\n", backend.c_str(), rank, what.c_str());
        reported->fetch_add(1);
      }
    });
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(outcomes[r].exit_code, 0) << backend << ": " << outcomes[r].describe();
    }
    ::munmap(reported, sizeof(std::atomic<int>));
  }
}

namespace {

// The data of the Join tests, by formula so that PyTorch's side makes the same tensors.
torch::Tensor join_input(int rank, int batch) {
  return torch::sin(torch::arange(24, torch::kFloat) * 0.37 + (11 * rank + 3 * batch))
      .reshape({4, 6});
}
torch::Tensor join_target(int rank, int batch) {
  return torch::cos(torch::arange(12, torch::kFloat) * 0.5 + (rank + batch)).reshape({4, 3});
}

torch::nn::Sequential join_mlp() {
  torch::nn::Sequential net(torch::nn::Linear(6, 8), torch::nn::Tanh(), torch::nn::Linear(8, 3));
  torch::NoGradGuard no_grad;
  int k = 0;
  for (auto& p : net->parameters()) {
    p.copy_((0.3 * torch::cos(torch::arange(p.numel(), torch::kFloat) * 0.1 + k++))
                .reshape(p.sizes()));
  }
  return net;
}

constexpr int kBatchesPerRank[] = {5, 4, 2};

torch::Tensor flat(torch::nn::Module& module) {
  std::vector<torch::Tensor> parts;
  for (const auto& p : module.parameters()) parts.push_back(p.detach().reshape(-1));
  return torch::cat(parts);
}

// One process: in each step, the ranks that still have a batch contribute their loss's gradient,
// averaged over the group (divide) or over those ranks.
torch::Tensor one_process_result(bool divide_by_initial_world_size) {
  auto net = join_mlp();
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int step = 0; step < kBatchesPerRank[0]; ++step) {
    std::vector<int> active;
    for (int r = 0; r < 3; ++r) {
      if (step < kBatchesPerRank[r]) active.push_back(r);
    }
    const double divisor = divide_by_initial_world_size ? 3.0 : double(active.size());
    optimizer.zero_grad();
    torch::Tensor loss = torch::zeros({});
    for (int r : active) {
      loss = loss + torch::mse_loss(net->forward(join_input(r, step)), join_target(r, step));
    }
    (loss / divisor).backward();
    optimizer.step();
  }
  return flat(*net);
}

// Rank `rank` of the uneven job in C++: its own number of batches, then finish().
torch::Tensor train_under_join(int rank, ddp::JoinOptions options) {
  auto net = join_mlp();
  ddp::DistributedDataParallel model(net);
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  ddp::Join join({&model}, options);
  for (int batch = 0; batch < kBatchesPerRank[rank]; ++batch) {
    optimizer.zero_grad();
    torch::mse_loss(model(join_input(rank, batch)), join_target(rank, batch)).backward();
    optimizer.step();
  }
  join.finish();
  return flat(*net);
}

// The same job in PyTorch; rank 0 writes its final parameters to $JOIN_OUT.
constexpr const char* kPythonJoinRank = R"(
import os, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed.algorithms.join import Join
dist.init_process_group("gloo")
r = dist.get_rank()
net = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
with torch.no_grad():
    for k, p in enumerate(net.parameters()):
        p.copy_((0.3 * torch.cos(torch.arange(p.numel(), dtype=torch.float32) * 0.1 + k)).reshape(p.shape))
model = DDP(net)
opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
with Join([model], divide_by_initial_world_size=os.environ["JOIN_DIVIDE"] == "1"):
    for b in range([5, 4, 2][r]):
        x = torch.sin(torch.arange(24, dtype=torch.float32) * 0.37 + (11 * r + 3 * b)).reshape(4, 6)
        y = torch.cos(torch.arange(12, dtype=torch.float32) * 0.5 + (r + b)).reshape(4, 3)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
if r == 0:
    with open(os.environ["JOIN_OUT"] + ".part", "w") as f:
        f.write(" ".join("%.9g" % v for v in flat.tolist()))
    os.rename(os.environ["JOIN_OUT"] + ".part", os.environ["JOIN_OUT"])
dist.destroy_process_group()
)";

torch::Tensor read_floats(const std::string& path) {
  std::ifstream in(path);
  std::vector<float> values;
  float value;
  while (in >> value) values.push_back(value);
  return torch::tensor(values);
}

}  // namespace

TEST(Join, ThreeRanksWithFiveFourAndTwoBatchesEqualOneProcess) {
  for (std::string backend : {"shm", "gloo"}) {
    for (bool divide : {true, false}) {
      run_ranks_ok(3, [&](int rank) {
        // In the ranks: the test process runs no backward before it forks (autograd's threads).
        const torch::Tensor expected = one_process_result(divide);
        ddp::init_process_group(ddp::InitOptions().backend(backend).timeout(kTimeout));
        auto mine = train_under_join(rank, ddp::JoinOptions().divide_by_initial_world_size(divide));
        EXPECT_TRUE(torch::allclose(mine, expected, 0, 1e-5))
            << backend << " divide " << divide << ": max difference "
            << (mine - expected).abs().max().item<double>();
        // Every rank ends with the model of the one that finished last.
        auto all = ddp::all_gather(mine);
        for (const auto& other : all) EXPECT_TRUE(torch::equal(other, all[0]));
      });
    }
  }
}

TEST(Join, ThreeRanksReachThePyTorchDdpJoinParameters) {
  if (ddp::testing::torch_python().empty()) {
    GTEST_SKIP() << "no Python with torch (python3-torch, or DDP_TEST_PYTHON)";
  }
  for (bool divide : {true, false}) {
    const std::string out = ddp::testing::fresh_path("pytorch_join") + ".txt";
    run_ranks_ok(
        3,
        [&](int) {
          ::setenv("JOIN_DIVIDE", divide ? "1" : "0", 1);
          ::setenv("JOIN_OUT", out.c_str(), 1);
          ddp::testing::exec_python(kPythonJoinRank);
        },
        std::chrono::seconds(90));
    const torch::Tensor theirs = read_floats(out);
    ASSERT_EQ(theirs.numel(), 83) << out;
    run_ranks_ok(3, [&](int rank) {
      ddp::init_process_group(ddp::InitOptions().backend("gloo").timeout(kTimeout));
      auto mine = train_under_join(rank, ddp::JoinOptions().divide_by_initial_world_size(divide));
      EXPECT_TRUE(torch::allclose(mine, theirs, 0, 1e-5))
          << "divide " << divide << ": max difference "
          << (mine - theirs).abs().max().item<double>();
    });
  }
}

TEST(Join, ThrowOnEarlyTerminationRaisesOnEveryRankInTheSameIteration) {
  run_ranks_ok(3, [](int rank) {
    ddp::init_process_group(ddp::InitOptions().backend("gloo").timeout(kTimeout));
    auto net = join_mlp();
    ddp::DistributedDataParallel model(net);
    torch::optim::SGD optimizer(net->parameters(), 0.1);
    int batches_done = 0;
    try {
      ddp::Join join({&model}, ddp::JoinOptions().throw_on_early_termination(true));
      for (int batch = 0; batch < kBatchesPerRank[rank]; ++batch) {
        optimizer.zero_grad();
        torch::mse_loss(model(join_input(rank, batch)), join_target(rank, batch)).backward();
        optimizer.step();
        ++batches_done;
      }
      join.finish();
      ADD_FAILURE() << "rank " << rank << " finished without an error";
    } catch (const ddp::UnevenInputsError& e) {
      const std::string what = e.what();
      if (rank == 2) {
        EXPECT_NE(what.find("this rank ran out of inputs while ranks 0, 1"), std::string::npos)
            << what;
      } else {
        EXPECT_NE(what.find("rank 2 ran out of inputs"), std::string::npos) << what;
      }
    }
    // Rank 2 had two batches: the others stop at the start of their third.
    EXPECT_EQ(batches_done, 2);
    // The ranks leave together: the group still works.
    auto t = torch::ones({3});
    ddp::all_reduce(t);
    EXPECT_EQ(t[0].item<float>(), 3.0f);
  });
}

TEST(Join, FinishedRanksShadowBuffersUnusedParametersAndNoSync) {
  // BatchNorm buffers come from the highest rank still training; a parameter unused on every
  // rank keeps its .grad; no_sync iterations are not shadowed. Checked against rank 0, which
  // trains longest, doing the same without peers' data affecting the buffers it ends with.
  run_ranks_ok(2, [](int rank) {
    ddp::init_process_group(ddp::InitOptions().backend("shm").timeout(kTimeout));
    torch::manual_seed(0);
    auto net = torch::nn::Sequential(torch::nn::Linear(6, 8), torch::nn::BatchNorm1d(8),
                                     torch::nn::Linear(8, 3));
    auto unused = net->register_parameter("unused", torch::ones({2}));
    ddp::DistributedDataParallel model(net, ddp::DDPOptions().find_unused_parameters(true));
    torch::optim::SGD optimizer(net->parameters(), 0.1);
    ddp::Join join({&model});
    const int batches = rank == 0 ? 4 : 1;
    for (int batch = 0; batch < batches; ++batch) {
      optimizer.zero_grad();
      if (batch == 1) {
        auto guard = model.no_sync();
        model(join_input(rank, batch)).sum().backward();
      }
      model(join_input(rank, batch)).sum().backward();
      optimizer.step();
    }
    join.finish();
    EXPECT_FALSE(unused.grad().defined());
    // After finish, every rank holds rank 0's model, buffers included.
    for (const auto& buffer : net->buffers()) {
      auto all = ddp::all_gather(buffer.to(torch::kDouble).reshape(-1));
      EXPECT_TRUE(torch::equal(all[0], all[1]));
    }
    auto all = ddp::all_gather(flat(*net));
    EXPECT_TRUE(torch::equal(all[0], all[1]));
  });
}

TEST(Join, SyncBatchNormNeedsThrowOnEarlyTermination) {
  run_ranks_ok(2, [](int) {
    ddp::init_process_group(ddp::InitOptions().backend("gloo").timeout(kTimeout));
    torch::nn::Sequential net(torch::nn::Linear(6, 8), ddp::SyncBatchNorm1d(8));
    ddp::DistributedDataParallel model(net);
    expect_error_saying<ddp::InvalidArgumentError>(
        [&] { ddp::Join join({&model}); },
        {"SyncBatchNorm ('1')", "throw_on_early_termination(true)"});
    ddp::Join join({&model}, ddp::JoinOptions().throw_on_early_termination(true));
    join.finish();  // every rank finishes at once: no error
  });
}

TEST(Join, ADestructorWithoutFinishRunsNoCollectiveAndThePeersFailClearly) {
  ddp::testing::Launch launch;
  auto outcomes = run_ranks(launch, [](int rank) {
    ddp::init_process_group(ddp::InitOptions().backend("gloo").timeout(kShortTimeout));
    auto net = join_mlp();
    ddp::DistributedDataParallel model(net);
    torch::optim::SGD optimizer(net->parameters(), 0.1);
    try {
      ddp::Join join({&model});
      for (int batch = 0; batch < 3; ++batch) {
        if (rank == 1 && batch == 1) throw std::runtime_error("a bad batch");
        optimizer.zero_grad();
        torch::mse_loss(model(join_input(rank, batch)), join_target(rank, batch)).backward();
        optimizer.step();
      }
      join.finish();
      ADD_FAILURE() << "rank 0 finished";
    } catch (const ddp::PeerLostError& e) {
      EXPECT_EQ(rank, 0) << e.what();
      EXPECT_EQ(e.lost_rank(), 1) << e.what();
    } catch (const std::runtime_error& e) {
      EXPECT_EQ(rank, 1);
      EXPECT_STREQ(e.what(), "a bad batch");
      ::_exit(0);  // leaves: its peer must see it go, not wait for a collective
    }
  });
  EXPECT_EQ(outcomes[0].exit_code, 0) << outcomes[0].describe();
  EXPECT_EQ(outcomes[1].exit_code, 0) << outcomes[1].describe();
}

TEST(Join, BadJoinablesAreRefusedByName) {
  run_ranks_ok(2, [](int) {
    ddp::init_process_group(ddp::InitOptions().backend("gloo").timeout(kTimeout));
    auto net = join_mlp();
    ddp::DistributedDataParallel model(net);
    expect_error_saying<ddp::InvalidArgumentError>([] { ddp::Join join({}); },
                                                   {"at least one joinable"});
    expect_error_saying<ddp::InvalidArgumentError>([] { ddp::Join join({nullptr}); },
                                                   {"joinable 0 is a null pointer"});
    ddp::Join join({&model});
    expect_error_saying<ddp::InvalidArgumentError>([&] { ddp::Join nested({&model}); },
                                                   {"already in another Join"});
    join.finish();
    expect_error_saying<ddp::InvalidArgumentError>([&] { join.finish(); }, {"already called"});
  });
}

TEST(Join, CommHooksStaticGraphAndBucketViewsAreShadowedToo) {
  run_ranks_ok(3, [&](int rank) {
    // A comm hook averages over the group itself: the result is divide_by_initial_world_size's.
    const torch::Tensor expected = one_process_result(/*divide_by_initial_world_size=*/true);
    ddp::init_process_group(ddp::InitOptions().backend("gloo").timeout(kTimeout));
    auto net = join_mlp();
    ddp::DistributedDataParallel model(
        net, ddp::DDPOptions().static_graph(true).gradient_as_bucket_view(true));
    model.register_comm_hook(ddp::comm_hooks::bf16_compress());
    torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    ddp::Join join({&model});
    for (int batch = 0; batch < kBatchesPerRank[rank]; ++batch) {
      optimizer.zero_grad();
      torch::mse_loss(model(join_input(rank, batch)), join_target(rank, batch)).backward();
      optimizer.step();
    }
    join.finish();
    auto mine = flat(*net);
    // bfloat16 keeps 8 bits of each averaged gradient.
    EXPECT_TRUE(torch::allclose(mine, expected, 0, 2e-3))
        << "max difference " << (mine - expected).abs().max().item<double>();
    auto all = ddp::all_gather(mine);
    for (const auto& other : all) EXPECT_TRUE(torch::equal(other, all[0]));
  });
}

TEST(Join, MixedPrecisionIsShadowedInTheBucketsDtype) {
  // The finished rank's zeros go out in reduce_dtype (bfloat16 buckets), as the others' averages.
  run_ranks_ok(2, [](int rank) {
    ddp::init_process_group(ddp::InitOptions().backend("gloo").timeout(kTimeout));
    auto net = join_mlp();
    ddp::DistributedDataParallel model(
        net, ddp::DDPOptions().mixed_precision(ddp::MixedPrecision().param_dtype(torch::kBFloat16)));
    torch::optim::SGD optimizer(net->parameters(), 0.1);
    ddp::Join join({&model});
    for (int batch = 0; batch < (rank == 0 ? 3 : 1); ++batch) {
      optimizer.zero_grad();
      torch::mse_loss(model(join_input(rank, batch)).to(torch::kFloat), join_target(rank, batch))
          .backward();
      optimizer.step();
    }
    join.finish();
    for (const auto& p : net->parameters()) EXPECT_EQ(p.scalar_type(), torch::kFloat);
    auto all = ddp::all_gather(flat(*net));
    EXPECT_TRUE(torch::equal(all[0], all[1]));
  });
}
