// all_gather_into_tensor and reduce_scatter_tensor on every backend: shm (one host), gloo, and
// hierarchical (ranks posing as two hosts through DDP_CPP_HOST_ID).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <string>

#include "collectives/unverified.h"
#include "ddp/ddp.h"
#include "process_group/group_state.h"
#include "process_group/hierarchical/hierarchical_backend.h"
#include "support/multiprocess.h"

using ddp::testing::run_ranks_ok;

namespace {

const auto kFlatTimeout = std::chrono::seconds(30);

// "shm" and "gloo" on one host; "hierarchical": ranks alternate between hosts "a" and "b".
void init_backend(const std::string& backend, int rank) {
  if (backend == "hierarchical") {
    ::setenv("DDP_CPP_HOST_ID", rank % 2 == 0 ? "a" : "b", 1);
    ddp::init_process_group(ddp::InitOptions().timeout(kFlatTimeout));
    ASSERT_EQ(ddp::get_backend(), "hierarchical");
  } else {
    ddp::init_process_group(ddp::InitOptions().backend(backend).timeout(kFlatTimeout));
    ASSERT_EQ(ddp::get_backend(), backend);
  }
}

// Values that tell rank, position and sign apart (sums of them are exact in float).
torch::Tensor part_of(int rank, int64_t numel) {
  return torch::arange(numel, torch::kFloat) * 0.5 + 100.0 * (rank + 1) - 3;
}

void all_gather_into_tensor_gathers_every_rank(const std::string& backend, int world) {
  run_ranks_ok(world, [&](int rank) {
    init_backend(backend, rank);
    for (int64_t numel : {int64_t(1), int64_t(7), int64_t(100003)}) {
      torch::Tensor expected = torch::cat([&] {
        std::vector<torch::Tensor> parts;
        for (int r = 0; r < world; ++r) parts.push_back(part_of(r, numel));
        return parts;
      }());
      // Concatenated along dim 0.
      torch::Tensor flat = torch::full({world * numel}, -1.0);
      ddp::all_gather_into_tensor(flat, part_of(rank, numel));
      EXPECT_TRUE(torch::equal(flat, expected)) << backend << " x" << numel;
      // Stacked, and asynchronous.
      torch::Tensor stacked = torch::full({world, numel}, -1.0);
      ddp::all_gather_into_tensor_async(stacked, part_of(rank, numel)).wait();
      EXPECT_TRUE(torch::equal(stacked.reshape(-1), expected)) << backend << " x" << numel;
      // A strided output is written where it is.
      torch::Tensor wide = torch::full({numel, world}, -1.0);
      torch::Tensor transposed = wide.t();
      ddp::all_gather_into_tensor(transposed, part_of(rank, numel));
      EXPECT_TRUE(torch::equal(wide.t().reshape(-1), expected)) << backend << " x" << numel;
    }
    ddp::destroy_process_group();
  });
}

// 300007 elements: across hosts, the leaders' blocks cross in several 1 MiB pieces, the last one
// shorter.
void reduce_scatter_tensor_reduces_each_ranks_run(const std::string& backend, int world) {
  run_ranks_ok(world, [&](int rank) {
    init_backend(backend, rank);
    for (int64_t numel : {int64_t(1), int64_t(5), int64_t(70001), int64_t(300007)}) {
      torch::Tensor input = part_of(rank, world * numel);
      const torch::Tensor before = input.clone();
      torch::Tensor sum = torch::zeros({world * numel});
      for (int r = 0; r < world; ++r) sum += part_of(r, world * numel);
      torch::Tensor mine = sum.narrow(0, rank * numel, numel);

      torch::Tensor output = torch::full({numel}, -1.0);
      ddp::reduce_scatter_tensor(output, input);
      EXPECT_TRUE(torch::equal(output, mine)) << backend << " x" << numel;
      EXPECT_TRUE(torch::equal(input, before)) << "the input must be left as it was";

      torch::Tensor average = torch::full({numel}, -1.0);
      ddp::reduce_scatter_tensor_async(average, input.view({world, numel}), ddp::ReduceOp::AVG)
          .wait();
      EXPECT_TRUE(torch::allclose(average, mine / world)) << backend << " x" << numel;

      torch::Tensor largest = torch::full({numel}, -1.0);
      ddp::reduce_scatter_tensor(largest, input, ddp::ReduceOp::MAX);
      EXPECT_TRUE(
          torch::equal(largest, part_of(world - 1, world * numel).narrow(0, rank * numel, numel)));
    }
    // Integers too.
    torch::Tensor counts = torch::arange(world * 3, torch::kLong) + rank;
    torch::Tensor out = torch::empty({3}, torch::kLong);
    ddp::reduce_scatter_tensor(out, counts);
    torch::Tensor expected = torch::arange(world * 3, torch::kLong).narrow(0, rank * 3, 3) * world +
                             world * (world - 1) / 2;
    EXPECT_TRUE(torch::equal(out, expected));
    ddp::destroy_process_group();
  });
}

template <typename Error>
std::string message_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& error) {
    return error.what();
  }
  ADD_FAILURE() << "no error was thrown";
  return "";
}

}  // namespace

TEST(FlatCollectives, AllGatherIntoTensorOnShmGathersEveryRankInRankOrder) {
  all_gather_into_tensor_gathers_every_rank("shm", 3);
}

TEST(FlatCollectives, AllGatherIntoTensorOnGlooGathersEveryRankInRankOrder) {
  all_gather_into_tensor_gathers_every_rank("gloo", 3);
}

TEST(FlatCollectives, AllGatherIntoTensorAcrossTwoHostsGathersEveryRankInRankOrder) {
  all_gather_into_tensor_gathers_every_rank("hierarchical", 4);
}

TEST(FlatCollectives, ReduceScatterTensorOnShmReducesEachRanksRun) {
  reduce_scatter_tensor_reduces_each_ranks_run("shm", 3);
}

TEST(FlatCollectives, ReduceScatterTensorOnGlooReducesEachRanksRun) {
  reduce_scatter_tensor_reduces_each_ranks_run("gloo", 3);
}

TEST(FlatCollectives, ReduceScatterTensorAcrossTwoHostsReducesEachRanksRun) {
  reduce_scatter_tensor_reduces_each_ranks_run("hierarchical", 4);
}

TEST(FlatCollectives, ReduceScatterTensorAcrossUnevenHostsReducesEachRanksRun) {
  // Hosts "a" (ranks 0, 2) and "b" (rank 1): host b's block is padded to two ranks.
  reduce_scatter_tensor_reduces_each_ranks_run("hierarchical", 3);
}

TEST(FlatCollectives, ReduceScatterAcrossHostsSendsEachLeaderOnlyTheOtherHostsParts) {
  // Two hosts of two ranks: a leader hands the link the other host's half of the input, once,
  // where an all-reduce of the input (gloo's way, and this backend's before) hands it all of it
  // (and a ring all-reduce sends about twice its payload).
  const int world = 4;
  run_ranks_ok(world, [&](int rank) {
    init_backend("hierarchical", rank);
    auto* hierarchy = dynamic_cast<ddp::detail::HierarchicalBackend*>(
        ddp::ProcessGroup().state()->backends.front().get());
    ASSERT_NE(hierarchy, nullptr);
    const int64_t numel = 1000;
    torch::Tensor input = part_of(rank, world * numel);
    torch::Tensor output = torch::empty({numel});
    const uint64_t before = hierarchy->bytes_handed_between_hosts();
    ddp::detail::reduce_scatter_tensor_async(output, input, ddp::ReduceOp::SUM, ddp::ProcessGroup(),
                                             /*verify=*/false, ddp::detail::Launch::kWaitNow)
        .wait();
    const uint64_t handed = hierarchy->bytes_handed_between_hosts() - before;
    const bool leader = rank < 2;  // ranks 0 ("a") and 1 ("b") lead their hosts
    EXPECT_EQ(handed, leader ? input.nbytes() / 2 : 0) << "rank " << rank;
    torch::Tensor sum = torch::zeros({world * numel});
    for (int r = 0; r < world; ++r) sum += part_of(r, world * numel);
    EXPECT_TRUE(torch::equal(output, sum.narrow(0, rank * numel, numel)));
    ddp::destroy_process_group();
  });
}

TEST(FlatCollectives, WrongSizesAreRefusedNamingTheTensorAndTheSizeItNeeds) {
  for (const std::string backend : {"shm", "gloo"}) {
    run_ranks_ok(3, [&](int rank) {
      init_backend(backend, rank);
      torch::Tensor input = torch::ones({7});
      torch::Tensor short_output = torch::zeros({20});
      std::string error = message_of<ddp::InvalidArgumentError>(
          [&] { ddp::all_gather_into_tensor(short_output, input); });
      EXPECT_NE(error.find("all_gather_into_tensor"), std::string::npos) << error;
      EXPECT_NE(error.find("output has 20 elements"), std::string::npos) << error;
      EXPECT_NE(error.find("21"), std::string::npos) << error;

      torch::Tensor uneven_input = torch::ones({10});
      torch::Tensor output = torch::zeros({3});
      error = message_of<ddp::InvalidArgumentError>(
          [&] { ddp::reduce_scatter_tensor(output, uneven_input); });
      EXPECT_NE(error.find("reduce_scatter_tensor"), std::string::npos) << error;
      EXPECT_NE(error.find("input has 10 elements"), std::string::npos) << error;
      EXPECT_NE(error.find("Pad"), std::string::npos) << error;

      torch::Tensor doubles = torch::zeros({21}, torch::kDouble);
      error = message_of<ddp::InvalidArgumentError>(
          [&] { ddp::all_gather_into_tensor(doubles, input); });
      EXPECT_NE(error.find("dtype"), std::string::npos) << error;

      // The refused calls sent nothing: the group still works.
      torch::Tensor flat = torch::zeros({21});
      ddp::all_gather_into_tensor(flat, input);
      EXPECT_TRUE(torch::equal(flat, torch::ones({21})));
      ddp::destroy_process_group();
    });
  }
}

TEST(FlatCollectives, RanksGivingDifferentSizesFailTogetherNamingTheCall) {
  run_ranks_ok(2, [](int rank) {
    init_backend("shm", rank);
    const int64_t numel = rank == 0 ? 4 : 5;  // each consistent with itself, not with the other
    torch::Tensor output = torch::zeros({2 * numel});
    std::string error = message_of<ddp::MismatchError>(
        [&] { ddp::all_gather_into_tensor(output, torch::ones({numel})); });
    EXPECT_NE(error.find("all_gather_into_tensor of 4 Float elements"), std::string::npos) << error;
    EXPECT_NE(error.find("all_gather_into_tensor of 5 Float elements"), std::string::npos) << error;
    ddp::destroy_process_group();
  });
}
