// C++ and Python ranks in one job: ddp-cpp's rendezvous and groups follow torch.distributed's
// (the "default_pg" store prefix, group names, the store-based barrier), so a PyTorch rank
// (Debian's python3-torch) can take part in our collectives and vice versa.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "compat/libtorch_compat.h"
#include "ddp/ddp.h"
#include "support/multiprocess.h"

namespace {

// The same sequence of calls as cpp_rank below, in Python.
constexpr const char* kPythonRank = R"(
import torch, torch.distributed as dist
dist.init_process_group("gloo")
r = dist.get_rank()
t = torch.full((4,), float(r + 1)); dist.all_reduce(t); assert t[0].item() == 3, t
b = torch.full((2,), float(r * 7)); dist.broadcast(b, 1); assert b[0].item() == 7, b
parts = [torch.zeros(3) for _ in range(2)]; dist.all_gather(parts, torch.full((3,), float(r)))
assert [p[0].item() for p in parts] == [0.0, 1.0], parts
g = dist.new_group([0, 1])
m = torch.tensor([float(r + 5)]); dist.all_reduce(m, op=dist.ReduceOp.MAX, group=g)
assert m.item() == 6, m
dist.barrier()
dist.destroy_process_group()
)";

void cpp_rank(int rank) {
  // The fingerprint check is an exchange of ddp-cpp's own: PyTorch ranks do not make it.
  ddp::init_process_group(ddp::InitOptions().backend("gloo").verify_collectives(false).timeout(
      std::chrono::seconds(30)));
  auto t = torch::full({4}, rank + 1.0);
  ddp::all_reduce(t);
  EXPECT_EQ(t[0].item<float>(), 3.0f);
  auto b = torch::full({2}, rank * 7.0);
  ddp::broadcast(b, 1);
  EXPECT_EQ(b[0].item<float>(), 7.0f);
  auto parts = ddp::all_gather(torch::full({3}, rank * 1.0));
  EXPECT_EQ(parts[1][0].item<float>(), 1.0f);
  auto group = ddp::new_group({0, 1});
  auto m = torch::full({1}, rank + 5.0);
  ddp::all_reduce(m, ddp::ReduceOp::MAX, group);
  EXPECT_EQ(m[0].item<float>(), 6.0f);
  ddp::barrier();
  ddp::destroy_process_group();
}

void run_mixed(int python_rank) {
  if (ddp::testing::torch_python().empty()) {
    GTEST_SKIP() << "no Python with torch (python3-torch, or DDP_TEST_PYTHON)";
  }
  ddp::testing::run_ranks_ok(
      2,
      [python_rank](int rank) {
        if (rank == python_rank) {
          ddp::testing::exec_python(kPythonRank);
        }
        cpp_rank(rank);
      },
      std::chrono::seconds(60));
}

}  // namespace

TEST(PyTorchInterop, PythonRankJoinsACppRankZeroJob) { run_mixed(/*python_rank=*/1); }

TEST(PyTorchInterop, CppRankJoinsAPythonRankZeroJob) { run_mixed(/*python_rank=*/0); }

// With the default backend ("auto") the ddp-cpp rank waits for every rank's host identity, which a
// Python rank never publishes: init must fail within the timeout, naming that rank and the fix,
// rather than hang or fail later with a store error.
TEST(PyTorchInterop, DefaultBackendWithAPythonRankNamesItAndAsksForGloo) {
  if (ddp::testing::torch_python().empty()) {
    GTEST_SKIP() << "no Python with torch (python3-torch, or DDP_TEST_PYTHON)";
  }
  constexpr const char* kPythonPeer = R"(
import datetime, torch.distributed as dist
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=20))
)";
  ddp::testing::Launch launch;
  launch.timeout = std::chrono::seconds(60);
  auto outcomes = ddp::testing::run_ranks(launch, [kPythonPeer](int rank) {
    if (rank == 1) {
      ddp::testing::exec_python(kPythonPeer);
    }
    // Rank 0 hosts the store, so the Python rank fails fast once this one has exited. The timeout
    // leaves room for the Python rank to start (importing torch takes seconds on a loaded
    // machine): one that arrives too late is a different error, not the one tested here.
    try {
      ddp::init_process_group(ddp::InitOptions().timeout(std::chrono::seconds(10)));
      ADD_FAILURE() << "init_process_group succeeded with a Python rank and backend \"auto\"";
    } catch (const ddp::DistributedError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("rank(s) 1 joined"), std::string::npos) << what;
      EXPECT_NE(what.find("backend(\"gloo\")"), std::string::npos) << what;
    }
  });
  EXPECT_EQ(outcomes[0].exit_code, 0) << outcomes[0].describe();
}

// torchrun's static rendezvous: its agent hosts the store on MASTER_PORT and sets
// TORCHELASTIC_USE_AGENT_STORE=True; every worker, rank 0 included, is a client whose keys live
// under "/worker/attempt_<restart count>". Here a Python process hosts the store as the agent
// would.
TEST(PyTorchInterop, WorkersOfTorchrunsAgentStoreRendezvousThroughIt) {
  if (ddp::testing::torch_python().empty()) {
    GTEST_SKIP() << "no Python with torch (python3-torch, or DDP_TEST_PYTHON)";
  }
  constexpr const char* kAgent = R"(
import datetime, os
from torch.distributed import TCPStore
args = ("127.0.0.1", int(os.environ["MASTER_PORT"]), 3, True, datetime.timedelta(seconds=60))
try:  # 2.x hosts with libuv by default; Debian 13's torch has none
  store = TCPStore(*args, wait_for_workers=False, use_libuv=False)
except TypeError:  # 1.13 has only the classic server
  store = TCPStore(*args, wait_for_workers=False)
store.wait(["/worker/attempt_1/test_done"])
)";
  ddp::testing::Launch launch;
  launch.world_size = 3;  // two workers and the agent
  launch.timeout = std::chrono::seconds(60);
  auto outcomes = ddp::testing::run_ranks(launch, [kAgent](int rank) {
    if (rank == 2) {
      ddp::testing::exec_python(kAgent);
    }
    ::setenv("WORLD_SIZE", "2", 1);
    ::setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
    ::setenv("TORCHELASTIC_RESTART_COUNT", "1", 1);
    ddp::init_process_group(ddp::InitOptions().backend("gloo").timeout(std::chrono::seconds(30)));
    auto t = torch::full({2}, rank + 1.0);
    ddp::all_reduce(t);
    EXPECT_EQ(t[0].item<float>(), 3.0f);
    ddp::barrier();
    ddp::destroy_process_group();
    if (rank == 0) {
      c10d::TCPStoreOptions options;
      options.port = static_cast<std::uint16_t>(std::stoi(std::getenv("MASTER_PORT")));
      options.waitWorkers = false;
      ddp::compat::use_classic_tcp_store(options);
      c10d::TCPStore("127.0.0.1", options)
          .set("/worker/attempt_1/test_done", std::vector<uint8_t>{'1'});
    }
  });
  for (const auto& outcome : outcomes) EXPECT_EQ(outcome.exit_code, 0) << outcome.describe();
}
