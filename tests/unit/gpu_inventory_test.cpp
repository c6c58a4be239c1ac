// Which GPU each rank uses decides whether "auto" gives CUDA tensors to NCCL and whether
// backend("nccl") accepts a group (process_group/gpu_inventory.h); and the device set_device takes.
// The inventory is given here, as the ranks would publish it, so this runs without a GPU.
#include "process_group/gpu_inventory.h"

#include <gtest/gtest.h>

#include "ddp/ddp.h"

namespace {

using ddp::detail::why_members_lack_own_gpu;

TEST(GpuInventory, MembersWithAGpuEachUnderAnyIndexMayUseNccl) {
  // Each rank sees only its own GPU (CUDA_VISIBLE_DEVICES per rank): all are cuda:0 to themselves.
  EXPECT_EQ(why_members_lack_own_gpu({"aa11@cuda:0", "bb22@cuda:0", "cc33@cuda:0"}), "");
  // Each rank sees every GPU and takes cuda:LOCAL_RANK.
  EXPECT_EQ(why_members_lack_own_gpu({"aa11@cuda:0", "bb22@cuda:1"}), "");
  EXPECT_EQ(why_members_lack_own_gpu({"aa11@cuda:0"}), "");
}

TEST(GpuInventory, TwoMembersOnOneGpuAreNamedWithTheirIndices) {
  EXPECT_EQ(why_members_lack_own_gpu({"aa11@cuda:0", "bb22@cuda:1", "aa11@cuda:0"}),
            "group ranks 0 and 2 both use the same GPU (cuda:0 and cuda:0 in their processes)");
  // The same GPU seen under two indices (different CUDA_VISIBLE_DEVICES orders) is still shared.
  EXPECT_EQ(why_members_lack_own_gpu({"aa11@cuda:1", "aa11@cuda:0"}),
            "group ranks 0 and 1 both use the same GPU (cuda:1 and cuda:0 in their processes)");
}

TEST(GpuInventory, MembersWithoutAGpuAreNamed) {
  EXPECT_EQ(why_members_lack_own_gpu({"aa11@cuda:0", "", ""}), "group ranks 1, 2 see no GPU");
  EXPECT_EQ(why_members_lack_own_gpu({"", "bb22@cuda:0"}), "group rank 0 sees no GPU");
}

TEST(SetDevice, OneVisibleGpuIsCuda0WhateverTheLocalRank) {
  EXPECT_EQ(ddp::cuda_device_index_for(0, 1), 0);
  EXPECT_EQ(ddp::cuda_device_index_for(3, 1), 0);
}

TEST(SetDevice, SeveralVisibleGpusAreTakenByLocalRank) {
  EXPECT_EQ(ddp::cuda_device_index_for(0, 4), 0);
  EXPECT_EQ(ddp::cuda_device_index_for(3, 4), 3);
}

TEST(SetDevice, NoGpuIsTheCpuAndTooFewGpusIsAnErrorNamingTheFix) {
  EXPECT_EQ(ddp::cuda_device_index_for(2, 0), -1);
  try {
    ddp::cuda_device_index_for(2, 2);
    FAIL() << "local rank 2 of a process that sees 2 GPUs was given a GPU";
  } catch (const ddp::DistributedError& error) {
    EXPECT_NE(std::string(error.what()).find("local rank 2 has no GPU"), std::string::npos)
        << error.what();
    EXPECT_NE(std::string(error.what()).find("--nproc-per-node 2"), std::string::npos)
        << error.what();
  }
}

}  // namespace
