// The shared-memory backend's pieces that need no second rank: segment names and creation, the
// host identity, the view of several tensors as one run of bytes.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <tuple>
#include <vector>

#include "process_group/shm/host_topology.h"
#include "process_group/shm/scattered_bytes.h"
#include "process_group/shm/segment_ownership.h"
#include "process_group/shm/shm_segment.h"

namespace {

using ddp::detail::ScatteredBytes;
using ddp::detail::ShmSegment;

TEST(ShmSegmentTest, ATakenNameIsReportedAndLeftAlone) {
  // Another job's live segment may carry the same name (pids repeat across containers): creating
  // over it must neither fail the job nor unlink the other one.
  const std::string name = ddp::detail::shm_segment_name("unit-test", 0, "0", 0, 0xabcdu, getpid());
  ShmSegment first = ShmSegment::create(name, 4096, "test");
  ASSERT_NE(first.data(), nullptr);
  ShmSegment second = ShmSegment::create(name, 4096, "test");
  EXPECT_EQ(second.data(), nullptr);
  ShmSegment opened = ShmSegment::open(name, 4096, "test");
  EXPECT_NE(opened.data(), nullptr) << "the first segment's name was removed";
}

TEST(ShmSegmentTest, NameCarriesTheTokenAndEndsWithTheCreatorPid) {
  // ddprun finds a killed worker's segments by the ".p<pid>" suffix.
  EXPECT_EQ(ddp::detail::shm_segment_name("my job!", 2, "1", 3, 0x1fu, 4242),
            "/ddp-cpp.my_job_.2.g1.h3.r0000001f.p4242");
}

TEST(ShmSegmentTest, PrefixAndCreatorAreReadBackFromAName) {
  // ddprun removes a dead creator's segments of a job's attempt by these two.
  const std::string name = ddp::detail::shm_segment_name("my job!", 2, "1", 3, 0x1fu, 4242);
  // (Not "/" + prefix: GCC 12 warns wrongly about it at -O3 in C++20, -Wrestrict.)
  EXPECT_EQ(name.substr(0, 1), "/") << name;
  EXPECT_EQ(name.rfind(ddp::detail::shm_segment_prefix("my job!", 2), 1), 1u) << name;
  EXPECT_NE(name.rfind(ddp::detail::shm_segment_prefix("my job!", 1), 1), 1u) << name;
  EXPECT_EQ(ddp::detail::shm_segment_creator(name.substr(1)), 4242);
  EXPECT_EQ(ddp::detail::shm_segment_creator("ddp-cpp.job.0.g0.h0.r00000000.px1"), -1);
  EXPECT_EQ(ddp::detail::shm_segment_creator("ddp-cpp.job.0.g0.h0.r00000000"), -1);
  EXPECT_EQ(ddp::detail::shm_segment_creator("ddp-cpp.job.0.g0.h0.r00000000.p99999999999"), -1);
  EXPECT_FALSE(ddp::detail::process_is_alive(-1));
  EXPECT_TRUE(ddp::detail::process_is_alive(getpid()));
}

TEST(ShmSegmentTest, MoveAssignmentReleasesTheSegmentItReplaces) {
  const std::string a = ddp::detail::shm_segment_name("unit-test", 0, "0", 0, 1, getpid());
  const std::string b = ddp::detail::shm_segment_name("unit-test", 0, "0", 0, 2, getpid());
  ShmSegment segment = ShmSegment::create(a, 4096, "test");
  segment = ShmSegment::create(b, 4096, "test");
  EXPECT_NE(access(("/dev/shm" + a).c_str(), F_OK), 0) << "the replaced segment is still there";
  EXPECT_EQ(segment.name(), b);
  EXPECT_EQ(access(("/dev/shm" + b).c_str(), F_OK), 0);
}

TEST(ScatteredBytesTest, RangesSplitAtPieceBoundariesAndAdjacentPiecesMerge) {
  char memory[64];
  char* a = memory;       // a[0..10)
  char* b = memory + 16;  // b[0..20), apart from a
  char* c = memory + 40;  // c[0..8)
  ScatteredBytes run;
  run.add(a, 4);
  run.add(a + 4, 6);  // follows a[0..4): one piece
  run.add(b, 0);      // empty: ignored
  run.add(b, 20);
  EXPECT_EQ(run.size(), 30u);
  EXPECT_EQ(run.pieces(), 2u);

  std::vector<std::tuple<char*, size_t, size_t>> parts;
  auto record = [&](char* at, size_t offset, size_t length) {
    parts.emplace_back(at, offset, length);
  };
  run.for_each_part(7, 10, record);  // a[7..10) then b[0..7)
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0], std::make_tuple(a + 7, size_t(0), size_t(3)));
  EXPECT_EQ(parts[1], std::make_tuple(b, size_t(3), size_t(7)));

  parts.clear();
  run.for_each_part(10, 20, record);  // starts exactly at the second piece
  ASSERT_EQ(parts.size(), 1u);
  EXPECT_EQ(parts[0], std::make_tuple(b, size_t(0), size_t(20)));

  parts.clear();
  run.for_each_part(30, 0, record);  // an empty range at the end touches nothing
  EXPECT_TRUE(parts.empty());

  run.add(c, 8);
  parts.clear();
  run.for_each_part(2, 36, record);  // across all three pieces, ending where the last ends
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0], std::make_tuple(a + 2, size_t(0), size_t(8)));
  EXPECT_EQ(parts[1], std::make_tuple(b, size_t(8), size_t(20)));
  EXPECT_EQ(parts[2], std::make_tuple(c, size_t(28), size_t(8)));

  parts.clear();
  run.for_each_part(0, 10, record);  // ending exactly at a boundary stops there
  ASSERT_EQ(parts.size(), 1u);
  EXPECT_EQ(parts[0], std::make_tuple(a, size_t(0), size_t(10)));
}

TEST(HostIdentityTest, TellsApartWhatAHostnameCannot) {
  const std::string id = ddp::detail::local_host_identity("");
  char name[256] = {0};
  gethostname(name, sizeof(name) - 1);
  EXPECT_EQ(id.rfind(name, 0), 0u) << id;
  struct stat shm {};
  ASSERT_EQ(stat("/dev/shm", &shm), 0);
  EXPECT_NE(id.find("/shm:" + std::to_string(shm.st_dev)), std::string::npos) << id;
  struct stat pids {};
  ASSERT_EQ(stat("/proc/self/ns/pid", &pids), 0);
  EXPECT_NE(id.find("/pidns:" + std::to_string(pids.st_ino)), std::string::npos) << id;
  EXPECT_NE(id.find("/boot:"), std::string::npos) << id;

  EXPECT_EQ(ddp::detail::local_host_identity("declared"), "declared");
}

}  // namespace
