// comm_hooks::powerSGD across ranks: equal to PyTorch's own powerSGD_hook (Debian's
// python3-torch) on the same model and data, and equal to plain averaging before it starts.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <torch/torch.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "ddp/ddp.h"
#include "support/multiprocess.h"

using ddp::testing::run_ranks_ok;

namespace {

// One training run of the reference comparison. Two hidden widths: 4200 makes DDP split the
// gradients into two buckets (the first closes past 1 MiB), 200 keeps one bucket, where the two
// [4, 18] matrices (conv and head) are compressed side by side: PyTorch groups a bucket's matrices
// by shape, which decides the order of the random initial Qs.
struct Run {
  int64_t rank;
  bool error_feedback;
  bool warm_start;
  int64_t start_iter;
  int64_t hidden;
  int64_t seed;
};

// rank 1: every matrix compressed, Gram-Schmidt; rank 2: some compressed; rank 4: QR. The last
// run draws new random Qs every iteration (no warm start), from start_iter 1.
const std::vector<Run> kRuns = {{1, true, true, 2, 4200, 0},
                                {1, true, true, 2, 200, 7},
                                {2, true, true, 3, 4200, 11},
                                {4, true, true, 2, 4200, 3},
                                {2, false, false, 1, 200, 5}};
constexpr int kSteps = 6;
constexpr int kBatch = 4;

std::string runs_text() {
  std::ostringstream text;
  for (const Run& run : kRuns) {
    text << run.rank << ',' << run.error_feedback << ',' << run.warm_start << ',' << run.start_iter
         << ',' << run.hidden << ',' << run.seed << ';';
  }
  return text.str();
}

// Each rank trains every run with PyTorch's DDP and hook; rank 0 writes each run's initial
// parameters and, after each backward, the averaged gradients (float32, parameter order).
constexpr const char* kPythonRanks = R"(
import os, torch, torch.nn as nn, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, out = dist.get_rank(), os.environ["PSGD_OUT"]
steps, batch = int(os.environ["PSGD_STEPS"]), int(os.environ["PSGD_BATCH"])

class Net(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3)
        self.fc1 = nn.Linear(64, hidden)
        self.fc2 = nn.Linear(hidden, 18)
        self.head = nn.Linear(18, 4)
    def forward(self, x):
        x = torch.relu(self.conv(x)).flatten(1)
        return self.head(torch.relu(self.fc2(torch.relu(self.fc1(x)))))

# PyTorch's hook waits for P's and Q's all-reduces inside callbacks that run on gloo's worker
# threads (2 of them): with two buckets both threads wait there, nothing runs the all-reduces they
# wait for, and 1.13 hangs at the first compressed step. Waiting for each bucket inside the hook
# avoids it; the arithmetic is the hook's own.
def ordered_powerSGD_hook(state, bucket):
    future = psgd.powerSGD_hook(state, bucket)
    future.wait()
    return future

def flat(tensors):
    return torch.cat([t.detach().reshape(-1) for t in tensors]).numpy().tobytes()

for number, spec in enumerate(os.environ["PSGD_RUNS"].strip(";").split(";")):
    r, ef, ws, start, hidden, seed = (int(v) for v in spec.split(","))
    torch.manual_seed(number)
    net = Net(hidden)
    if rank == 0:
        open(f"{out}/init_{number}.bin", "wb").write(flat(net.parameters()))
    model = DDP(net)
    state = psgd.PowerSGDState(None, matrix_approximation_rank=r, start_powerSGD_iter=start,
                               use_error_feedback=bool(ef), warm_start=bool(ws), random_seed=seed)
    model.register_comm_hook(state, ordered_powerSGD_hook)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05)
    grads = open(f"{out}/grads_{number}.bin", "wb") if rank == 0 else None
    for step in range(steps):
        g = torch.Generator().manual_seed(1000 * number + 100 * rank + step)
        x, y = torch.randn(batch, 2, 6, 6, generator=g), torch.randn(batch, 4, generator=g)
        optimizer.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        if grads:
            grads.write(flat(p.grad for p in net.parameters()))
        optimizer.step()
    if grads:
        grads.close()
dist.barrier()
dist.destroy_process_group()
)";

struct NetImpl : torch::nn::Module {
  explicit NetImpl(int64_t hidden)
      : conv(register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(2, 4, 3)))),
        fc1(register_module("fc1", torch::nn::Linear(64, hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, 18))),
        head(register_module("head", torch::nn::Linear(18, 4))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::relu(conv(x)).flatten(1);
    return head(torch::relu(fc2(torch::relu(fc1(h)))));
  }
  torch::nn::Conv2d conv;
  torch::nn::Linear fc1, fc2, head;
};
TORCH_MODULE(Net);

torch::Tensor read_floats(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_FALSE(bytes.empty()) << path << " is missing or empty";
  return torch::from_blob(bytes.data(), {static_cast<int64_t>(bytes.size() / sizeof(float))},
                          torch::kFloat)
      .clone();
}

torch::Tensor flat_grads(Net& net) {
  std::vector<torch::Tensor> grads;
  for (const auto& p : net->parameters()) grads.push_back(p.grad().reshape(-1));
  return torch::cat(grads);
}

void train_like_python(int rank, const std::string& out) {
  ddp::init_process_group(ddp::InitOptions().backend("gloo").timeout(std::chrono::seconds(60)));
  at::set_num_threads(1);
  for (size_t number = 0; number < kRuns.size(); ++number) {
    const Run& run = kRuns[number];
    Net net(run.hidden);
    {
      torch::NoGradGuard no_grad;
      const torch::Tensor init = read_floats(out + "/init_" + std::to_string(number) + ".bin");
      int64_t offset = 0;
      for (auto& p : net->parameters()) {
        p.copy_(init.narrow(0, offset, p.numel()).view_as(p));
        offset += p.numel();
      }
    }
    ddp::DistributedDataParallel model(net);
    model.register_comm_hook(ddp::comm_hooks::powerSGD(ddp::PowerSGDOptions()
                                                           .matrix_approximation_rank(run.rank)
                                                           .start_powerSGD_iter(run.start_iter)
                                                           .use_error_feedback(run.error_feedback)
                                                           .warm_start(run.warm_start)
                                                           .random_seed(run.seed)));
    torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.05));
    const torch::Tensor expected =
        read_floats(out + "/grads_" + std::to_string(number) + ".bin").view({kSteps, -1});
    double largest = 0;
    for (int step = 0; step < kSteps; ++step) {
      auto generator = at::make_generator<at::CPUGeneratorImpl>(1000 * number + 100 * rank + step);
      auto x = torch::randn({kBatch, 2, 6, 6}, generator);
      auto y = torch::randn({kBatch, 4}, generator);
      optimizer.zero_grad();
      (model(x) - y).pow(2).mean().backward();
      const double difference = (flat_grads(net) - expected[step]).abs().max().item<double>();
      // Bit-identical: the same kernels of the same libtorch, in the same order, on the same sums
      // (two ranks: gloo adds the same two numbers either way).
      EXPECT_EQ(difference, 0.0) << "run " << number << " step " << step;
      largest = std::max(largest, difference);
      optimizer.step();
    }
    std::printf("[rank %d] run %zu: %d steps, largest difference from PyTorch %g\n", rank, number,
                kSteps, largest);
  }
  ddp::barrier();
  ddp::destroy_process_group();
}

// Trains two copies of one model side by side, one averaged by DDP itself and one by PowerSGD
// starting at iteration `start`; returns, per step, whether their gradients were equal.
std::vector<bool> steps_equal_to_plain_ddp(int64_t start, int steps) {
  torch::manual_seed(0);
  Net plain(32), compressed(32);
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < plain->parameters().size(); ++i) {
      compressed->parameters()[i].copy_(plain->parameters()[i]);
    }
  }
  ddp::DistributedDataParallel plain_model(plain), compressed_model(compressed);
  compressed_model.register_comm_hook(
      ddp::comm_hooks::powerSGD(ddp::PowerSGDOptions().start_powerSGD_iter(start)));
  std::vector<bool> equal;
  for (int step = 0; step < steps; ++step) {
    auto generator = at::make_generator<at::CPUGeneratorImpl>(100 * ddp::get_rank() + step);
    auto x = torch::randn({kBatch, 2, 6, 6}, generator);
    auto y = torch::randn({kBatch, 4}, generator);
    for (auto* model : {&plain_model, &compressed_model}) {
      model->module()->zero_grad();
      ((*model)(x)-y).pow(2).mean().backward();
    }
    equal.push_back(torch::equal(flat_grads(plain), flat_grads(compressed)));
  }
  return equal;
}

// The gradients of `steps` steps of a small model under PowerSGD (compressing from step 2).
std::vector<torch::Tensor> powersgd_gradients(int steps) {
  torch::manual_seed(0);
  Net net(32);
  ddp::DistributedDataParallel model(net);
  model.register_comm_hook(ddp::comm_hooks::powerSGD(
      ddp::PowerSGDOptions().matrix_approximation_rank(2).start_powerSGD_iter(2)));
  std::vector<torch::Tensor> gradients;
  for (int step = 0; step < steps; ++step) {
    auto generator = at::make_generator<at::CPUGeneratorImpl>(100 * ddp::get_rank() + step);
    auto x = torch::randn({kBatch, 2, 6, 6}, generator);
    auto y = torch::randn({kBatch, 4}, generator);
    net->zero_grad();
    (model(x) - y).pow(2).mean().backward();
    gradients.push_back(flat_grads(net));
  }
  return gradients;
}

}  // namespace

// The second all-reduce starts inside DDP's wait for the buckets: on the shared-memory backend
// too, where the ranks of one host meet by default. Two ranks sum the same two numbers on any
// backend, so the gradients must be equal.
TEST(PowerSGDHook, OnSharedMemoryItGivesTheGradientsItGivesOnGloo) {
  run_ranks_ok(2, [](int) {
    ddp::init_process_group(ddp::InitOptions().backend("gloo").timeout(std::chrono::seconds(30)));
    const auto on_gloo = powersgd_gradients(5);
    ddp::destroy_process_group();
    ddp::init_process_group(ddp::InitOptions().backend("shm").timeout(std::chrono::seconds(30)));
    const auto on_shm = powersgd_gradients(5);
    ddp::destroy_process_group();
    for (size_t step = 0; step < on_gloo.size(); ++step) {
      EXPECT_TRUE(torch::equal(on_gloo[step], on_shm[step])) << "step " << step;
    }
  });
}

// PyTorch's hook divides each gradient by the world size and sums, DDP multiplies by its inverse
// and sums: with two ranks both are exact, so the gradients must be bit-equal until compression
// starts, and differ from then on.
TEST(PowerSGDHook, BeforeStartPowerSGDIterItAveragesLikePlainDDPAndAfterItCompresses) {
  run_ranks_ok(2, [](int) {
    ddp::init_process_group(ddp::InitOptions().backend("gloo").timeout(std::chrono::seconds(30)));
    EXPECT_EQ(steps_equal_to_plain_ddp(/*start=*/4, /*steps=*/6),
              std::vector<bool>({true, true, true, true, false, false}));
    ddp::destroy_process_group();
  });
}

TEST(PowerSGDHook, GradientsAreBitIdenticalToPyTorchsPowerSGDHookOnTheSameModelAndData) {
  if (ddp::testing::torch_python().empty()) {
    GTEST_SKIP() << "no Python with torch (python3-torch, or DDP_TEST_PYTHON)";
  }
  const std::string out = ddp::testing::fresh_path("powersgd");
  ASSERT_EQ(::mkdir(out.c_str(), 0700), 0);
  const std::string runs = runs_text();
  run_ranks_ok(
      2,
      [&](int) {
        ::setenv("PSGD_OUT", out.c_str(), 1);
        ::setenv("PSGD_RUNS", runs.c_str(), 1);
        ::setenv("PSGD_STEPS", std::to_string(kSteps).c_str(), 1);
        ::setenv("PSGD_BATCH", std::to_string(kBatch).c_str(), 1);
        ddp::testing::exec_python(kPythonRanks);
      },
      std::chrono::seconds(60));
  run_ranks_ok(
      2, [&](int rank) { train_like_python(rank, out); }, std::chrono::seconds(60));
}
