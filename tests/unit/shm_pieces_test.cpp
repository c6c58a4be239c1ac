// The shared-memory backend's pieces that need no second rank: segment names and creation, the
// host identity.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

#include <gtest/gtest.h>

#include "process_group/shm/host_topology.h"
#include "process_group/shm/shm_segment.h"

namespace {

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

TEST(ShmSegmentTest, MoveAssignmentReleasesTheSegmentItReplaces) {
  const std::string a = ddp::detail::shm_segment_name("unit-test", 0, "0", 0, 1, getpid());
  const std::string b = ddp::detail::shm_segment_name("unit-test", 0, "0", 0, 2, getpid());
  ShmSegment segment = ShmSegment::create(a, 4096, "test");
  segment = ShmSegment::create(b, 4096, "test");
  EXPECT_NE(access(("/dev/shm" + a).c_str(), F_OK), 0) << "the replaced segment is still there";
  EXPECT_EQ(segment.name(), b);
  EXPECT_EQ(access(("/dev/shm" + b).c_str(), F_OK), 0);
}

TEST(HostIdentityTest, TellsApartWhatAHostnameCannot) {
  unsetenv("DDP_CPP_HOST_ID");
  const std::string id = ddp::detail::local_host_identity();
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

  setenv("DDP_CPP_HOST_ID", "declared", 1);
  EXPECT_EQ(ddp::detail::local_host_identity(), "declared");
  unsetenv("DDP_CPP_HOST_ID");
}

}  // namespace
