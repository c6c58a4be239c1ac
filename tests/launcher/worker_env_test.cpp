// The environment ddprun computes for each worker.
#include "worker_env.h"

#include <gtest/gtest.h>

#include <map>

namespace ddprun {
namespace {

std::map<std::string, std::string> AsMap(const EnvVars& vars) {
  std::map<std::string, std::string> map;
  for (const auto& [name, value] : vars) {
    EXPECT_TRUE(map.emplace(name, value).second) << "duplicate " << name;
  }
  return map;
}

TEST(WorkerEnv, MultiNodeRanksAndSizes) {
  LauncherOptions o;
  o.nnodes = 3;
  o.node_rank = 2;
  o.nproc_per_node = 4;
  o.master_addr = "10.0.0.9";
  o.master_port = 4321;
  o.max_restarts = 3;
  o.run_id = "job";
  o.role = "trainer";
  auto env = AsMap(WorkerVariables(o, /*local_rank=*/1, /*restart_count=*/2, /*online_cores=*/16,
                                   UserSettings{}));
  EXPECT_EQ(env["RANK"], "9");
  EXPECT_EQ(env["LOCAL_RANK"], "1");
  EXPECT_EQ(env["WORLD_SIZE"], "12");
  EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "4");
  EXPECT_EQ(env["GROUP_RANK"], "2");
  EXPECT_EQ(env["GROUP_WORLD_SIZE"], "3");
  EXPECT_EQ(env["ROLE_RANK"], "9");
  EXPECT_EQ(env["ROLE_WORLD_SIZE"], "12");
  EXPECT_EQ(env["ROLE_NAME"], "trainer");
  EXPECT_EQ(env["MASTER_ADDR"], "10.0.0.9");
  EXPECT_EQ(env["MASTER_PORT"], "4321");
  EXPECT_EQ(env["TORCHELASTIC_RESTART_COUNT"], "2");
  EXPECT_EQ(env["TORCHELASTIC_MAX_RESTARTS"], "3");
  EXPECT_EQ(env["TORCHELASTIC_RUN_ID"], "job");
  EXPECT_EQ(env["OMP_NUM_THREADS"], "4");
  EXPECT_EQ(env.count("TORCHELASTIC_USE_AGENT_STORE"), 0u);
  EXPECT_EQ(GlobalRank(o, 3), 11);
}

TEST(WorkerEnv, DefaultsGiveSingleWorkerWorld) {
  auto env = AsMap(WorkerVariables(LauncherOptions{}, 0, 0, 2, UserSettings{}));
  EXPECT_EQ(env["RANK"], "0");
  EXPECT_EQ(env["WORLD_SIZE"], "1");
  EXPECT_EQ(env["MASTER_ADDR"], "127.0.0.1");
  EXPECT_EQ(env["MASTER_PORT"], "29500");
  EXPECT_EQ(env["TORCHELASTIC_RUN_ID"], "none");
  EXPECT_EQ(env["ROLE_NAME"], "default");
  EXPECT_EQ(env["OMP_NUM_THREADS"], "2");
}

TEST(WorkerEnv, OmpNumThreadsDividesCoresAndIsAtLeastOne) {
  LauncherOptions o;
  o.nproc_per_node = 3;
  EXPECT_EQ(AsMap(WorkerVariables(o, 0, 0, 8, UserSettings{}))["OMP_NUM_THREADS"], "2");
  o.nproc_per_node = 16;
  EXPECT_EQ(AsMap(WorkerVariables(o, 0, 0, 8, UserSettings{}))["OMP_NUM_THREADS"], "1");
}

TEST(WorkerEnv, OmpNumThreadsAlreadySetIsLeftAlone) {
  UserSettings user;
  user.omp_num_threads = true;
  auto env = AsMap(WorkerVariables(LauncherOptions{}, 0, 0, 8, user));
  EXPECT_EQ(env.count("OMP_NUM_THREADS"), 0u);
  EXPECT_EQ(env["GLIBC_TUNABLES"], kWorkerGlibcTunables);
}

TEST(WorkerEnv, MallocTuningIsAddedUnlessTheUserTunesMalloc) {
  const char* plain[] = {"PATH=/bin", "MALLOCX=1", nullptr};
  EXPECT_FALSE(UserSettingsFrom(plain).malloc_tuning);
  EXPECT_FALSE(UserSettingsFrom(plain).omp_num_threads);
  EXPECT_EQ(
      AsMap(WorkerVariables(LauncherOptions{}, 0, 0, 2, UserSettingsFrom(plain)))["GLIBC_TUNABLES"],
      "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=268435456");
  for (const char* mine : {"GLIBC_TUNABLES=glibc.malloc.arena_max=2", "MALLOC_ARENA_MAX=2",
                           "MALLOC_TRIM_THRESHOLD_=0"}) {
    const char* tuned[] = {"PATH=/bin", mine, "OMP_NUM_THREADS=3", nullptr};
    UserSettings user = UserSettingsFrom(tuned);
    EXPECT_TRUE(user.malloc_tuning) << mine;
    EXPECT_TRUE(user.omp_num_threads);
    EXPECT_EQ(AsMap(WorkerVariables(LauncherOptions{}, 0, 0, 2, user)).count("GLIBC_TUNABLES"), 0u)
        << mine;
  }
}

TEST(WorkerEnv, MergeOverridesAndAddsWithoutDuplicates) {
  const char* base[] = {"PATH=/bin", "RANK=7", "RANKX=1", "EMPTY=", nullptr};
  std::vector<std::string> merged = MergeEnvironment(base, {{"RANK", "0"}, {"NEW", "v"}});
  EXPECT_EQ(merged,
            (std::vector<std::string>{"PATH=/bin", "RANKX=1", "EMPTY=", "RANK=0", "NEW=v"}));
}

}  // namespace
}  // namespace ddprun
