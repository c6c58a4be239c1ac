// The shm backend: every collective against its definition and against flat gloo, on one host
// and posing as several hosts (DDP_CPP_HOST_ID), its failures, and what it leaves in /dev/shm.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/FileStore.hpp>

#include "collectives/unverified.h"
#include "ddp/ddp.h"
#include "support/multiprocess.h"

using ddp::testing::elapsed_ms;
using ddp::testing::Launch;
using ddp::testing::run_ranks;
using ddp::testing::run_ranks_ok;

namespace {

const auto kTimeout = std::chrono::seconds(30);

// A job id per test, so that the test can look for its own segments in /dev/shm.
std::string job_id(const std::string& test) {
  return "shmtest-" + test + "-" + std::to_string(getpid());
}

void init_shm(const std::string& job, const std::string& backend = "shm") {
  ::setenv("TORCHELASTIC_RUN_ID", job.c_str(), 1);
  ddp::init_process_group(ddp::InitOptions().backend(backend).timeout(kTimeout));
}

std::vector<std::string> segments_of(const std::string& job) {
  std::vector<std::string> found;
  if (DIR* dir = opendir("/dev/shm")) {
    while (dirent* entry = readdir(dir)) {
      std::string name = entry->d_name;
      if (name.find(job) != std::string::npos) found.push_back(name);
    }
    closedir(dir);
  }
  return found;
}

// Rank r's input: small integers (exact in every dtype and in any summation order, and whose
// product over 4 ranks still fits int8), varying with the position.
torch::Tensor input_of(int rank, int64_t numel, torch::ScalarType dtype, bool bits) {
  auto index = torch::arange(numel, torch::kLong);
  auto values = bits ? torch::bitwise_left_shift(torch::ones_like(index), (index + rank) % 6)
                     : (index * 7 + rank * 3) % 3 + 1;
  return values.to(dtype);
}

torch::Tensor expected_reduction(int world, int64_t numel, torch::ScalarType dtype,
                                 ddp::ReduceOp op) {
  const bool bits =
      op == ddp::ReduceOp::BAND || op == ddp::ReduceOp::BOR || op == ddp::ReduceOp::BXOR;
  auto acc = input_of(0, numel, torch::kLong, bits);
  for (int r = 1; r < world; ++r) {
    auto x = input_of(r, numel, torch::kLong, bits);
    switch (op) {
      case ddp::ReduceOp::SUM:
        acc = acc + x;
        break;
      case ddp::ReduceOp::PRODUCT:
        acc = acc * x;
        break;
      case ddp::ReduceOp::MIN:
        acc = torch::minimum(acc, x);
        break;
      case ddp::ReduceOp::MAX:
        acc = torch::maximum(acc, x);
        break;
      case ddp::ReduceOp::BAND:
        acc = torch::bitwise_and(acc, x);
        break;
      case ddp::ReduceOp::BOR:
        acc = torch::bitwise_or(acc, x);
        break;
      case ddp::ReduceOp::BXOR:
        acc = torch::bitwise_xor(acc, x);
        break;
      default:
        break;
    }
  }
  return acc.to(dtype);
}

// Sizes around the transport's thresholds: one element, odd counts, the one-phase limit (32 KiB),
// several 1 MiB rounds with an uneven last slice.
const int64_t kCounts[] = {1, 7, 1000, 8192 + 3, (3 << 18) + 5};

void expect_all_reduce_matches_definition(int world, int rank) {
  const torch::ScalarType dtypes[] = {torch::kFloat, torch::kDouble, torch::kHalf, torch::kBFloat16,
                                      torch::kInt,   torch::kLong,   torch::kByte, torch::kChar};
  for (auto dtype : dtypes) {
    const bool integral = c10::isIntegralType(dtype, false);
    std::vector<ddp::ReduceOp> ops{ddp::ReduceOp::SUM, ddp::ReduceOp::PRODUCT, ddp::ReduceOp::MIN,
                                   ddp::ReduceOp::MAX};
    if (integral) {
      ops.insert(ops.end(), {ddp::ReduceOp::BAND, ddp::ReduceOp::BOR, ddp::ReduceOp::BXOR});
    }
    for (auto op : ops) {
      for (int64_t numel : kCounts) {
        const bool bits =
            op == ddp::ReduceOp::BAND || op == ddp::ReduceOp::BOR || op == ddp::ReduceOp::BXOR;
        auto t = input_of(rank, numel, dtype, bits);
        ddp::all_reduce(t, op);
        auto expected = expected_reduction(world, numel, dtype, op);
        ASSERT_TRUE(torch::equal(t, expected)) << ddp::to_string(op) << " " << c10::toString(dtype)
                                               << " x" << numel << " world " << world;
      }
    }
  }
}

}  // namespace

TEST(ShmBackend, AllReduceMatchesTheDefinitionForEveryDtypeOpAndSize) {
  for (int world : {2, 3}) {
    const std::string job = job_id("defs" + std::to_string(world));
    run_ranks_ok(world, [world, job](int rank) {
      init_shm(job);
      ASSERT_EQ(ddp::get_backend(), "shm");
      expect_all_reduce_matches_definition(world, rank);
      ddp::destroy_process_group();
    });
    EXPECT_TRUE(segments_of(job).empty()) << segments_of(job)[0];
  }
}

TEST(ShmBackend, TensorListsReduceAsOneBufferWithPremultipliedSums) {
  // DDP's reducer hands the backend its gradients where autograd left them: a list of tensors,
  // some adjacent in memory, some not, that must end as if reduced in one flat buffer, each
  // rank's value times 1/3 rounded, then summed in rank order (what PyTorch's DDP computes
  // before its all-reduce sums). Into other tensors (the reducer's buckets), leaving the inputs
  // as they were, and in place.
  const int world = 3;
  const std::string job = job_id("lists");
  run_ranks_ok(world, [world, job](int rank) {
    init_shm(job);
    ASSERT_TRUE(ddp::detail::reduces_lists_in_place(ddp::ProcessGroup(), torch::ones({1})));
    // Only the CPU floats it reduces in shared memory: DDP copies anything else into buckets.
    ASSERT_FALSE(ddp::detail::reduces_lists_in_place(ddp::ProcessGroup(),
                                                     torch::ones({1}).t().expand({2, 2})));
    for (auto dtype : {torch::kFloat, torch::kDouble}) {
      // 5: one phase; (3 << 18) + 5: several rounds, slices that straddle the pieces.
      for (int64_t numel : {int64_t(5), int64_t((3 << 18) + 5)}) {
        torch::manual_seed(rank);
        auto storage = torch::randn({2 * numel + 3}, dtype);
        std::vector<torch::Tensor> tensors{
            torch::randn({numel, 1}, dtype), storage.narrow(0, 0, numel),
            storage.narrow(0, numel, numel + 3), torch::randn({1}, dtype)};
        std::vector<torch::Tensor> flat;
        for (const auto& t : tensors) flat.push_back(t.reshape(-1));
        auto all = ddp::all_gather(torch::cat(flat));
        const double factor = 1.0 / 3;
        auto expected = all[0] * factor + all[1] * factor + all[2] * factor;
        auto bucket = torch::zeros({3 * numel + 4}, dtype);  // cut differently from the inputs
        std::vector<torch::Tensor> outputs{
            bucket.narrow(0, 0, numel).view({numel, 1}), bucket.narrow(0, numel, numel),
            bucket.narrow(0, 2 * numel, numel + 3), bucket.narrow(0, 3 * numel + 3, 1)};
        ddp::detail::premul_sum_async(tensors, outputs, factor, ddp::ProcessGroup()).wait();
        ASSERT_TRUE(torch::equal(bucket, expected)) << c10::toString(dtype) << " x" << numel;
        ASSERT_TRUE(torch::equal(torch::cat(flat), all[rank])) << "an input was written";
        ddp::detail::premul_sum_async(tensors, tensors, factor, ddp::ProcessGroup()).wait();
        flat.clear();
        for (const auto& t : tensors) flat.push_back(t.reshape(-1));
        ASSERT_TRUE(torch::equal(torch::cat(flat), expected))
            << c10::toString(dtype) << " x" << numel << ": max difference "
            << (torch::cat(flat) - expected).abs().max().item<double>();
      }
    }
    // A group of one has no segment: its sum is the premultiplied tensor itself.
    std::vector<ddp::ProcessGroup> singles;
    for (int r = 0; r < world; ++r) singles.push_back(ddp::new_group({r}, "shm"));
    auto alone = torch::arange(5, torch::kFloat);
    ddp::detail::premul_sum_async({alone}, {alone}, 0.5, singles[rank]).wait();
    EXPECT_TRUE(torch::equal(alone, torch::arange(5, torch::kFloat) * 0.5));
    ddp::destroy_process_group();
  });
  EXPECT_TRUE(segments_of(job).empty());
}

TEST(ShmBackend, BroadcastAllGatherReduceScatterAndBarrier) {
  const int world = 3;
  run_ranks_ok(world, [](int rank) {
    init_shm(job_id("colls"));
    for (int64_t numel : kCounts) {
      for (int root = 0; root < world; ++root) {
        auto t =
            rank == root ? torch::arange(numel, torch::kFloat) + root : torch::full({numel}, -1.0f);
        ddp::broadcast(t, root);
        ASSERT_TRUE(torch::equal(t, torch::arange(numel, torch::kFloat) + root)) << numel;
      }
      auto mine = torch::arange(numel, torch::kLong) * (rank + 1);
      auto gathered = ddp::all_gather(mine);
      ASSERT_EQ(gathered.size(), size_t(world));
      for (int r = 0; r < world; ++r) {
        ASSERT_TRUE(torch::equal(gathered[r], torch::arange(numel, torch::kLong) * (r + 1)));
      }
      std::vector<torch::Tensor> inputs;
      for (int dst = 0; dst < world; ++dst) {
        inputs.push_back(torch::arange(numel, torch::kDouble) + 10 * dst + rank);
      }
      auto out = torch::empty({numel}, torch::kDouble);
      ddp::reduce_scatter(out, inputs, ddp::ReduceOp::SUM);
      // sum over ranks r of (i + 10 * me + r) = world * (i + 10 * me) + 0 + 1 + 2
      ASSERT_TRUE(
          torch::equal(out, world * (torch::arange(numel, torch::kDouble) + 10 * rank) + 3));
      ddp::reduce_scatter(out, inputs, ddp::ReduceOp::AVG);
      ASSERT_TRUE(torch::equal(out, torch::arange(numel, torch::kDouble) + 10 * rank + 1));
      ddp::barrier();
    }
    ddp::destroy_process_group();
  });
}

TEST(ShmBackend, AsyncCollectivesRunInIssueOrderWithoutAWait) {
  // Rank 0 issues async all-reduces and then blocks in a gloo collective that needs rank 1,
  // which waits for those all-reduces synchronously: only the background thread can make progress.
  run_ranks_ok(2, [](int rank) {
    init_shm(job_id("async"));
    auto gloo = ddp::new_group({0, 1}, "gloo");
    std::vector<torch::Tensor> tensors;
    std::vector<ddp::Work> works;
    for (int i = 0; i < 4; ++i) tensors.push_back(torch::full({1 << 16}, float(i + rank)));
    if (rank == 0) {
      for (auto& t : tensors) works.push_back(ddp::all_reduce_async(t));
      auto token = torch::ones({1});
      ddp::all_reduce(token, ddp::ReduceOp::SUM, gloo);
      for (auto& w : works) w.wait();
    } else {
      for (auto& t : tensors) ddp::all_reduce(t);
      auto token = torch::ones({1});
      ddp::all_reduce(token, ddp::ReduceOp::SUM, gloo);
    }
    for (int i = 0; i < 4; ++i) EXPECT_EQ(tensors[i][0].item<float>(), float(2 * i + 1));
    ddp::destroy_process_group();
  });
}

TEST(ShmBackend, HierarchicalAcrossPosedHostsEqualsFlatGloo) {
  // Four ranks on this machine posing as two or three hosts, leaders first and interleaved.
  const std::vector<std::vector<std::string>> layouts = {
      {"a", "a", "b", "b"}, {"a", "b", "a", "b"}, {"a", "a", "a", "b"}, {"a", "b", "c", "b"}};
  for (const auto& hosts : layouts) {
    const std::string job = job_id("hier");
    run_ranks_ok(4, [&hosts, job](int rank) {
      ::setenv("DDP_CPP_HOST_ID", hosts[rank].c_str(), 1);
      init_shm(job, "auto");
      ASSERT_EQ(ddp::get_backend(), "hierarchical");
      // Between hosts the all-reduce needs one flat buffer: DDP keeps its buckets.
      ASSERT_FALSE(ddp::detail::reduces_lists_in_place(ddp::ProcessGroup(), torch::ones({1})));
      auto gloo = ddp::new_group({0, 1, 2, 3}, "gloo");
      ASSERT_FALSE(ddp::detail::reduces_lists_in_place(gloo, torch::ones({1})));
      for (int64_t numel : kCounts) {
        for (auto op : {ddp::ReduceOp::SUM, ddp::ReduceOp::MAX, ddp::ReduceOp::PRODUCT}) {
          auto ours = input_of(rank, numel, torch::kFloat, false);
          auto flat = ours.clone();
          ddp::all_reduce(ours, op);
          ddp::all_reduce(flat, op, gloo);
          ASSERT_TRUE(torch::equal(ours, flat)) << ddp::to_string(op) << " x" << numel;
        }
        for (int root = 0; root < 4; ++root) {
          auto ours = rank == root ? torch::arange(numel, torch::kLong)
                                   : torch::zeros({numel}, torch::kLong);
          ddp::broadcast(ours, root);
          ASSERT_TRUE(torch::equal(ours, torch::arange(numel, torch::kLong))) << "root " << root;
        }
        auto gathered = ddp::all_gather(torch::full({numel}, rank, torch::kInt));
        for (int r = 0; r < 4; ++r) ASSERT_EQ(gathered[r][numel - 1].item<int>(), r);
        std::vector<torch::Tensor> inputs;
        for (int dst = 0; dst < 4; ++dst) {
          inputs.push_back(torch::arange(numel, torch::kLong) * (rank + 1) + 10 * dst + rank);
        }
        for (auto op : {ddp::ReduceOp::SUM, ddp::ReduceOp::MAX}) {
          auto out = torch::full({numel}, -1, torch::kLong);
          auto flat = torch::full({numel}, -1, torch::kLong);
          ddp::reduce_scatter(out, inputs, op);
          ddp::reduce_scatter(flat, inputs, op, gloo);
          ASSERT_TRUE(torch::equal(out, flat)) << ddp::to_string(op) << " x" << numel;
        }
        ddp::barrier();
      }
      ddp::destroy_process_group();
    });
    EXPECT_TRUE(segments_of(job).empty());
  }
}

TEST(ShmBackend, AutoChoosesGlooWhenEveryRankIsOnItsOwnHost) {
  run_ranks_ok(2, [](int rank) {
    ::setenv("DDP_CPP_HOST_ID", rank == 0 ? "left" : "right", 1);
    init_shm(job_id("auto"), "auto");
    EXPECT_EQ(ddp::get_backend(), "gloo");
    auto t = torch::ones({3});
    ddp::all_reduce(t);
    EXPECT_EQ(t[0].item<float>(), 2.0f);
    ddp::destroy_process_group();
  });
}

TEST(ShmBackend, SubgroupsGetTheirOwnSegments) {
  const std::string job = job_id("sub");
  run_ranks_ok(4, [job](int rank) {
    init_shm(job);
    auto evens = ddp::new_group({0, 2});
    auto odds = ddp::new_group({1, 3});
    auto& mine = rank % 2 == 0 ? evens : odds;
    auto t = torch::full({100000}, float(rank));
    ddp::all_reduce(t, ddp::ReduceOp::SUM, mine);
    EXPECT_EQ(t[99999].item<float>(), rank % 2 == 0 ? 2.0f : 4.0f);
    auto w = torch::full({5}, float(rank));
    ddp::all_reduce(w);
    EXPECT_EQ(w[0].item<float>(), 6.0f);
    ddp::destroy_process_group();
  });
  EXPECT_TRUE(segments_of(job).empty());
}

// Failures --------------------------------------------------------------------------------------

namespace {

template <typename Action>
std::string error_of(Action&& action) {
  try {
    action();
  } catch (const ddp::DistributedError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

// A rank in its own container, in the one respect that matters here: a private /dev/shm (a new
// mount namespace with a fresh tmpfs over it). Needs CAP_SYS_ADMIN, as root has.
bool give_this_process_its_own_dev_shm() {
  return ::unshare(CLONE_NEWNS) == 0 &&
         ::mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0 &&
         ::mount("tmpfs", "/dev/shm", "tmpfs", 0, "size=64m") == 0;
}

bool can_give_a_process_its_own_dev_shm() {
  pid_t child = ::fork();
  if (child == 0) ::_exit(give_this_process_its_own_dev_shm() ? 0 : 1);
  int status = 0;
  ::waitpid(child, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

TEST(ShmBackend, ARankWithItsOwnDevShmIsAnotherHostUnderAuto) {
  // Containers that share the hostname (--network=host) but not /dev/shm: ranks 0 and 2 share
  // shared memory, rank 1 cannot reach it. "auto" must see two hosts and still add up right.
  if (!can_give_a_process_its_own_dev_shm()) GTEST_SKIP() << "needs CAP_SYS_ADMIN (root)";
  const std::string job = job_id("ownshm");
  run_ranks_ok(3, [job](int rank) {
    ::unsetenv("DDP_CPP_HOST_ID");
    if (rank == 1) {
      ASSERT_TRUE(give_this_process_its_own_dev_shm());
    }
    init_shm(job, "auto");
    EXPECT_EQ(ddp::get_backend(), "hierarchical");  // ranks 0 and 2 share a host, 1 is apart
    auto t = torch::full({100003}, float(rank + 1));
    ddp::all_reduce(t);
    EXPECT_EQ(t[100002].item<float>(), 6.0f);
    ddp::destroy_process_group();
  });
  EXPECT_TRUE(segments_of(job).empty());
}

TEST(ShmBackendFailure, ARankThatCannotOpenTheSegmentFailsItsHostAtOnce) {
  // The same ranks declared one host: the rank without the segment fails, and says so to the
  // segment's creator, which fails at once with the reason instead of after the timeout.
  if (!can_give_a_process_its_own_dev_shm()) GTEST_SKIP() << "needs CAP_SYS_ADMIN (root)";
  Launch launch;
  auto outcomes = run_ranks(launch, [](int rank) {
    ::setenv("DDP_CPP_HOST_ID", "declared-one-host", 1);
    if (rank == 1) {
      ASSERT_TRUE(give_this_process_its_own_dev_shm());
    }
    auto start = std::chrono::steady_clock::now();
    std::string error = error_of([&] { init_shm(job_id("noopen"), "shm"); });
    EXPECT_NE(error.find("cannot open the shared-memory segment"), std::string::npos) << error;
    if (rank == 0) {
      EXPECT_NE(error.find("rank 1"), std::string::npos) << error;
      EXPECT_LT(elapsed_ms(start), 15000) << "the group timeout is 30 s: the reason came late";
    }
  });
  for (const auto& outcome : outcomes) EXPECT_EQ(outcome.exit_code, 0) << outcome.describe();
}

TEST(ShmBackendFailure, RankKilledMidCollectiveFailsTheOthersQuickly) {
  const std::string job = job_id("kill");
  Launch launch;
  launch.world_size = 3;
  auto outcomes = run_ranks(launch, [job](int rank) {
    ::setenv("TORCHELASTIC_RUN_ID", job.c_str(), 1);
    ddp::init_process_group(ddp::InitOptions().backend("shm").timeout(std::chrono::seconds(60)));
    auto big = torch::ones({1 << 24});  // 64 MiB: many rounds, so the kill lands inside one
    if (rank == 1) {
      auto work = ddp::all_reduce_async(big);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));  // let it get going (not a sync)
      ::raise(SIGKILL);
    }
    auto start = std::chrono::steady_clock::now();
    std::string error = error_of([&] {
      for (int i = 0; i < 20; ++i) ddp::all_reduce(big);
    });
    EXPECT_NE(error.find("ddp::all_reduce"), std::string::npos) << error;
    EXPECT_NE(error.find("rank 1"), std::string::npos) << error;
    EXPECT_LT(elapsed_ms(start), 20000) << "detection should take milliseconds, not the timeout";
  });
  EXPECT_EQ(outcomes[0].exit_code, 0) << outcomes[0].describe();
  EXPECT_EQ(outcomes[1].signal, SIGKILL) << outcomes[1].describe();
  EXPECT_EQ(outcomes[2].exit_code, 0) << outcomes[2].describe();
  EXPECT_TRUE(segments_of(job).empty());
}

// A rank killed on one host fails the ranks of every other host at once, with its rank named:
// the failed host's leader closes its connections to the other leaders, and they break their own
// hosts' groups in turn. Without that, a host waiting in gloo for the failed one would only hear
// of it once that leader's process exited, or at the timeout.
TEST(ShmBackendFailure, ARankKilledOnOneHostFailsEveryHostAtOnce) {
  // Rank 3 dies on host "b", whose leader is rank 2, then rank 1. The others are one host of two
  // ranks, then two hosts of one rank each, which learn of it from host b or from each other.
  const std::vector<std::vector<std::string>> layouts = {{"a", "a", "b", "b"},
                                                         {"a", "b", "c", "b"}};
  for (const auto& hosts : layouts) {
    const std::string job = job_id("hostkill");
    const std::string meeting = ddp::testing::fresh_path("survivors");
    Launch launch;
    launch.world_size = 4;
    auto outcomes = run_ranks(launch, [&hosts, job, meeting](int rank) {
      ::setenv("DDP_CPP_HOST_ID", hosts[rank].c_str(), 1);
      ::setenv("TORCHELASTIC_RUN_ID", job.c_str(), 1);
      ddp::init_process_group(ddp::InitOptions().backend("shm").timeout(std::chrono::seconds(60)));
      auto big = torch::ones({1 << 22});  // 16 MiB: many rounds, so the kill lands inside one
      if (rank == 3) {
        auto work = ddp::all_reduce_async(big);
        std::this_thread::sleep_for(std::chrono::milliseconds(2));  // let it get going (not a sync)
        ::raise(SIGKILL);
      }
      std::string error = error_of([&] {
        for (int i = 0; i < 20; ++i) ddp::all_reduce(big);
      });
      EXPECT_NE(error.find("rank 3"), std::string::npos) << error;
      // Named as the user's call, also where it failed in one of its phases (a broadcast).
      EXPECT_EQ(error.rfind("[rank " + std::to_string(rank) + "] ddp::all_reduce", 0), 0u) << error;
      // The survivors stay alive until all three have raised: none of them can have learnt of
      // the failure from a peer's exit.
      c10d::FileStore survivors(meeting, 3);
      if (survivors.add("raised", 1) == 3) survivors.set("all raised", std::vector<uint8_t>{1});
      EXPECT_NO_THROW(survivors.wait({"all raised"}, std::chrono::seconds(20)))
          << "rank " << rank << " raised, but some other rank did not within 20 s";
    });
    for (int rank : {0, 1, 2}) {
      EXPECT_EQ(outcomes[rank].exit_code, 0) << outcomes[rank].describe();
    }
    EXPECT_EQ(outcomes[3].signal, SIGKILL) << outcomes[3].describe();
    EXPECT_TRUE(segments_of(job).empty());
  }
}

// The reduce-scatter between hosts is the leaders' sends and receives: a leader killed in the
// middle fails the other host's ranks at once, naming its host and rank, and its own host's rank
// through their shared memory.
TEST(ShmBackendFailure, ALeaderKilledDuringAReduceScatterAcrossHostsFailsEveryHost) {
  const std::string job = job_id("rskill");
  Launch launch;
  launch.world_size = 4;
  auto outcomes = run_ranks(launch, [job](int rank) {
    ::setenv("DDP_CPP_HOST_ID", rank < 2 ? "a" : "b", 1);
    ::setenv("TORCHELASTIC_RUN_ID", job.c_str(), 1);
    ddp::init_process_group(ddp::InitOptions().backend("auto").timeout(std::chrono::seconds(60)));
    ASSERT_EQ(ddp::get_backend(), "hierarchical");
    auto input = torch::ones({1 << 22});  // 16 MiB: the kill lands inside one
    auto output = torch::empty({1 << 20});
    if (rank == 2) {
      auto work = ddp::reduce_scatter_tensor_async(output, input);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));  // let it get going (not a sync)
      ::raise(SIGKILL);
    }
    auto start = std::chrono::steady_clock::now();
    try {
      for (int i = 0; i < 20; ++i) ddp::reduce_scatter_tensor(output, input);
      ADD_FAILURE() << "rank " << rank << ": no error";
    } catch (const ddp::PeerLostError& error) {
      const std::string what = error.what();
      EXPECT_EQ(error.lost_rank(), 2) << what;
      EXPECT_EQ(what.rfind("[rank " + std::to_string(rank) + "] ddp::reduce_scatter_tensor", 0), 0u)
          << what;
      // Host a hears it from the link, host b's other rank from its shared memory.
      EXPECT_NE(what.find(rank < 2 ? "lost host 1 (ranks 2, 3)" : "rank 2"), std::string::npos)
          << what;
    }
    EXPECT_LT(elapsed_ms(start), 20000) << "detection should take moments, not the timeout";
  });
  for (int rank : {0, 1, 3}) EXPECT_EQ(outcomes[rank].exit_code, 0) << outcomes[rank].describe();
  EXPECT_EQ(outcomes[2].signal, SIGKILL) << outcomes[2].describe();
  EXPECT_TRUE(segments_of(job).empty());
}

TEST(ShmBackendFailure, SlowPeerTimesOutAndMismatchedCallsAreNamed) {
  Launch launch;
  launch.timeout = std::chrono::seconds(40);
  auto outcomes = run_ranks(launch, [](int rank) {
    ::setenv("TORCHELASTIC_RUN_ID", job_id("slow").c_str(), 1);
    ddp::init_process_group(ddp::InitOptions().backend("shm").verify_collectives(false).timeout(
        std::chrono::seconds(3)));
    // Mismatched sizes, with the library's fingerprint off: the transport itself notices.
    auto t = torch::ones({rank == 0 ? 10 : 20});
    std::string mismatch = error_of([&] { ddp::all_reduce(t); });
    EXPECT_NE(mismatch.find("issued a different collective"), std::string::npos) << mismatch;
    // After a failure the group stays broken, with the reason.
    std::string after = error_of([&] { ddp::barrier(); });
    EXPECT_NE(after.find("aborted"), std::string::npos) << after;
  });
  for (const auto& outcome : outcomes) EXPECT_EQ(outcome.exit_code, 0) << outcome.describe();

  outcomes = run_ranks(launch, [](int rank) {
    ::setenv("TORCHELASTIC_RUN_ID", job_id("slow2").c_str(), 1);
    ddp::init_process_group(ddp::InitOptions().backend("shm").timeout(std::chrono::seconds(3)));
    if (rank == 1) {
      ::alarm(10);  // bounded: SIGALRM ends this rank
      ::pause();
    }
    auto start = std::chrono::steady_clock::now();
    auto t = torch::ones({16});
    std::string error = error_of([&] { ddp::all_reduce(t); });
    EXPECT_NE(error.find("timed out"), std::string::npos) << error;
    EXPECT_NE(error.find("rank 1"), std::string::npos) << error;
    EXPECT_LT(elapsed_ms(start), 9000);
  });
  EXPECT_EQ(outcomes[0].exit_code, 0) << outcomes[0].describe();
}

TEST(ShmBackendFailure, NoSegmentIsLeftAfterAnErrorExitOrAKill) {
  const std::string job = job_id("exit");
  Launch launch;
  launch.world_size = 2;
  auto outcomes = run_ranks(launch, [job](int rank) {
    ::setenv("TORCHELASTIC_RUN_ID", job.c_str(), 1);
    ddp::init_process_group(ddp::InitOptions().backend("shm").timeout(kTimeout));
    auto t = torch::ones({4});
    ddp::all_reduce(t);
    if (rank == 0) ::raise(SIGKILL);  // the segment's creator, without any cleanup
    ::_exit(1);                       // an error exit, without destroy_process_group
  });
  EXPECT_EQ(outcomes[0].signal, SIGKILL);
  EXPECT_EQ(outcomes[1].exit_code, 1);
  EXPECT_TRUE(segments_of(job).empty()) << segments_of(job)[0];
}
