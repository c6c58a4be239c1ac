// DistributedSampler gives torch.utils.data.DistributedSampler's indices (checked against
// Debian's python3-torch over a grid of cases) and plugs into libtorch's data loader.
#include "ddp/distributed_sampler.h"

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdio>
#include <sstream>

#include "ddp/errors.h"
#include "support/multiprocess.h"

namespace {

// One line per case: "size replicas rank shuffle seed drop_last epoch : i i i ..."
constexpr const char* kGrid = R"(
from torch.utils.data import DistributedSampler
for size in (1, 7, 10, 13, 64):
  for replicas in (1, 2, 3, 4):
    for drop_last in (False, True):
      if drop_last and size < replicas: continue
      for shuffle in (False, True):
        for seed in (0, 42):
          for epoch in (0, 3):
            for rank in range(replicas):
              s = DistributedSampler(list(range(size)), num_replicas=replicas, rank=rank,
                                     shuffle=shuffle, seed=seed, drop_last=drop_last)
              s.set_epoch(epoch)
              print(size, replicas, rank, int(shuffle), seed, int(drop_last), epoch, ":",
                    " ".join(map(str, s)))
)";

std::string python_output(const char* program) {
  std::string command = ddp::testing::torch_python() + " -c '" + program + "'";
  FILE* pipe = ::popen(command.c_str(), "r");
  std::string output;
  char chunk[4096];
  size_t n;
  while ((n = std::fread(chunk, 1, sizeof(chunk), pipe)) > 0) output.append(chunk, n);
  EXPECT_EQ(::pclose(pipe), 0) << "python failed";
  return output;
}

}  // namespace

TEST(DistributedSampler, MatchesPyTorchOverAGridOfCases) {
  if (ddp::testing::torch_python().empty()) {
    GTEST_SKIP() << "no Python with torch (python3-torch, or DDP_TEST_PYTHON)";
  }
  std::istringstream lines(python_output(kGrid));
  std::string line;
  int cases = 0;
  while (std::getline(lines, line)) {
    std::istringstream in(line);
    int64_t size, replicas, rank, shuffle, seed, drop_last, epoch;
    std::string colon;
    in >> size >> replicas >> rank >> shuffle >> seed >> drop_last >> epoch >> colon;
    std::vector<int64_t> expected;
    for (int64_t index; in >> index;) expected.push_back(index);
    ddp::DistributedSampler sampler(size, ddp::SamplerOptions()
                                              .num_replicas(replicas)
                                              .rank(rank)
                                              .shuffle(shuffle != 0)
                                              .seed(static_cast<uint64_t>(seed))
                                              .drop_last(drop_last != 0));
    sampler.set_epoch(epoch);
    EXPECT_EQ(sampler.indices(), expected) << line;
    EXPECT_EQ(sampler.num_samples(), static_cast<int64_t>(expected.size())) << line;
    ++cases;
  }
  EXPECT_EQ(cases, 728);  // every case of the grid was compared
}

TEST(DistributedSampler, KnownValuesOfTheReference) {
  // From torch.utils.data.DistributedSampler, N=10, 3 replicas, seed 0, epoch 0.
  auto indices = [](int64_t rank, bool shuffle, bool drop_last) {
    return ddp::DistributedSampler(
               10, ddp::SamplerOptions().num_replicas(3).rank(rank).shuffle(shuffle).drop_last(
                       drop_last))
        .indices();
  };
  EXPECT_EQ(indices(0, true, false), (std::vector<int64_t>{4, 5, 0, 2}));
  EXPECT_EQ(indices(2, true, false), (std::vector<int64_t>{7, 9, 6, 1}));
  EXPECT_EQ(indices(1, false, false), (std::vector<int64_t>{1, 4, 7, 0}));
  EXPECT_EQ(indices(2, false, true), (std::vector<int64_t>{2, 5, 8}));
}

TEST(DistributedSampler, BadArgumentsAreClearErrors) {
  auto error_of = [](int64_t size, ddp::SamplerOptions options) -> std::string {
    try {
      ddp::DistributedSampler sampler(size, options);
    } catch (const ddp::DistributedError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(error_of(10, ddp::SamplerOptions().num_replicas(2).rank(2)).find("invalid rank 2"),
            std::string::npos);
  EXPECT_NE(error_of(10, ddp::SamplerOptions().num_replicas(0).rank(0)).find("at least 1"),
            std::string::npos);
  EXPECT_NE(error_of(2, ddp::SamplerOptions().num_replicas(3).rank(0).drop_last(true))
                .find("drop_last with 2 samples and 3 replicas"),
            std::string::npos);
  // Without a process group, -1 cannot be resolved.
  EXPECT_NE(error_of(10, ddp::SamplerOptions()).find("init_process_group"), std::string::npos);
}

TEST(DistributedSampler, DataLoaderCopyFollowsSetEpochOnTheCallersCopy) {
  auto dataset = torch::data::datasets::TensorDataset(torch::arange(20).unsqueeze(1))
                     .map(torch::data::transforms::Stack<torch::data::TensorExample>());
  ddp::DistributedSampler sampler(20, ddp::SamplerOptions().num_replicas(2).rank(1).seed(7));
  auto loader = torch::data::make_data_loader(std::move(dataset), sampler,
                                              torch::data::DataLoaderOptions().batch_size(4));
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    sampler.set_epoch(epoch);
    std::vector<int64_t> seen;
    for (auto& batch : *loader) {
      for (int64_t i = 0; i < batch.data.size(0); ++i)
        seen.push_back(batch.data[i][0].item<int64_t>());
    }
    EXPECT_EQ(seen, sampler.indices()) << "epoch " << epoch;
  }
  sampler.set_epoch(0);
  auto first = sampler.indices();
  sampler.set_epoch(1);
  EXPECT_NE(first, sampler.indices());
}
