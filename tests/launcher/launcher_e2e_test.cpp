// End to end: the real ddprun binary with `sh -c` workers; environment, output relaying, help
// and command line errors.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <regex>

#include "launcher_harness.h"
#include "worker_env.h"

extern char** environ;

namespace ddprun_test {
namespace {

int OnlineCores() { return static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)); }

void ExpectExitedWith(const LauncherRun& run, int code) {
  EXPECT_FALSE(run.timed_out) << "ddprun hung; stderr:\n" << run.err;
  EXPECT_EQ(run.exit_code, code) << "stdout:\n" << run.out << "stderr:\n" << run.err;
}

bool Contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

constexpr const char* kPrintEnv =
    "echo \"R=$RANK L=$LOCAL_RANK W=$WORLD_SIZE LW=$LOCAL_WORLD_SIZE GR=$GROUP_RANK"
    " GW=$GROUP_WORLD_SIZE RR=$ROLE_RANK RW=$ROLE_WORLD_SIZE RN=$ROLE_NAME MA=$MASTER_ADDR"
    " MP=$MASTER_PORT RC=$TORCHELASTIC_RESTART_COUNT MR=$TORCHELASTIC_MAX_RESTARTS"
    " RID=$TORCHELASTIC_RUN_ID OMP=$OMP_NUM_THREADS AS=${TORCHELASTIC_USE_AGENT_STORE-unset}"
    " FP=$FROM_PARENT\"";

TEST(LauncherEndToEnd, EveryWorkerGetsItsRankEnvironmentAndPrefixedOutput) {
  LauncherRun run =
      RunLauncher({"--nproc-per-node", "3", "--master_port=29511", "--max-restarts", "1",
                   "--run-id", "abc", "--role", "trainer", "sh", "-c", kPrintEnv},
                  {{"FROM_PARENT", "yes"}});
  ExpectExitedWith(run, 0);
  const std::string omp = std::to_string(std::max(1, OnlineCores() / 3));
  for (int r = 0; r < 3; ++r) {
    std::string rank = std::to_string(r);
    std::string expected = "[" + rank + "]: R=" + rank + " L=" + rank +
                           " W=3 LW=3 GR=0 GW=1 RR=" + rank +
                           " RW=3 RN=trainer MA=127.0.0.1 MP=29511 RC=0 MR=1 RID=abc OMP=" + omp +
                           " AS=unset FP=yes\n";
    EXPECT_TRUE(Contains(run.out, expected)) << expected << "not in:\n" << run.out;
  }
  EXPECT_EQ(Lines(run.out).size(), 3u) << run.out;
}

TEST(LauncherEndToEnd, SecondNodeGetsGlobalRanksAndGroupRank) {
  LauncherRun run = RunLauncher({"--nnodes=2", "--node_rank", "1", "--nproc_per_node=2",
                                 "--master_addr", "10.0.0.1", "sh", "-c", kPrintEnv});
  ExpectExitedWith(run, 0);
  EXPECT_TRUE(Contains(run.out,
                       "[2]: R=2 L=0 W=4 LW=2 GR=1 GW=2 RR=2 RW=4 RN=default "
                       "MA=10.0.0.1 MP=29500 RC=0 MR=0 RID=none"))
      << run.out;
  EXPECT_TRUE(Contains(run.out, "[3]: R=3 L=1 W=4 LW=2 GR=1 GW=2 RR=3")) << run.out;
}

TEST(LauncherEndToEnd, OmpNumThreadsAlreadySetIsPassedUnchanged) {
  LauncherRun run = RunLauncher({"--nproc-per-node", "2", "sh", "-c", "echo OMP=$OMP_NUM_THREADS"},
                                {{"OMP_NUM_THREADS", "7"}});
  ExpectExitedWith(run, 0);
  EXPECT_TRUE(Contains(run.out, "[0]: OMP=7\n")) << run.out;
  EXPECT_TRUE(Contains(run.out, "[1]: OMP=7\n")) << run.out;
}

TEST(LauncherEndToEnd, WorkersGetMallocTuningUnlessTheUserTunesMalloc) {
  const char* script = "echo \"GT=${GLIBC_TUNABLES-unset}\"";
  if (ddprun::UserSettingsFrom(environ).malloc_tuning)
    GTEST_SKIP() << "this test's environment tunes malloc";
  LauncherRun plain = RunLauncher({"--nproc-per-node", "2", "sh", "-c", script});
  ExpectExitedWith(plain, 0);
  EXPECT_TRUE(Contains(plain.out, std::string("[1]: GT=") + ddprun::kWorkerGlibcTunables + "\n"))
      << plain.out;
  LauncherRun tuned =
      RunLauncher({"--nproc-per-node", "2", "sh", "-c", script}, {{"MALLOC_ARENA_MAX", "2"}});
  ExpectExitedWith(tuned, 0);
  EXPECT_TRUE(Contains(tuned.out, "[1]: GT=unset\n")) << tuned.out;
}

TEST(LauncherEndToEnd, PetEnvironmentFallbackIsUsed) {
  LauncherRun run = RunLauncher({"sh", "-c", "echo $WORLD_SIZE $MASTER_PORT"},
                                {{"PET_NPROC_PER_NODE", "2"}, {"PET_MASTER_PORT", "4100"}});
  ExpectExitedWith(run, 0);
  EXPECT_TRUE(Contains(run.out, "[1]: 2 4100\n")) << run.out;
}

// CUDA_VISIBLE_DEVICES='' hides any GPU, so that `auto` means cores on every host.
TEST(LauncherEndToEnd, AutoWithoutGpusStartsOneWorkerPerOnlineCore) {
  LauncherRun run = RunLauncher({"--nproc-per-node", "auto", "sh", "-c", "echo $WORLD_SIZE"},
                                {{"CUDA_VISIBLE_DEVICES", ""}});
  ExpectExitedWith(run, 0);
  EXPECT_EQ(static_cast<int>(Lines(run.out).size()), OnlineCores()) << run.out;
}

TEST(LauncherEndToEnd, GpuWithoutGpusExitsTwoSayingWhyAndWhatToUse) {
  LauncherRun run = RunLauncher({"--nproc-per-node", "gpu", "sh", "-c", "echo started"},
                                {{"CUDA_VISIBLE_DEVICES", ""}});
  ExpectExitedWith(run, 2);
  EXPECT_TRUE(Contains(run.err,
                       "ddprun: error: argument --nproc-per-node: invalid value 'gpu' (no GPU "
                       "visible: "))
      << run.err;
  EXPECT_TRUE(Contains(run.err, "CUDA_VISIBLE_DEVICES is ''")) << run.err;
  EXPECT_TRUE(Contains(run.err, "use 'cpu'")) << run.err;
  EXPECT_EQ(run.out, "");
}

TEST(LauncherEndToEnd, ProgramArgumentsThatLookLikeFlagsPassThrough) {
  LauncherRun run =
      RunLauncher({"sh", "-c", "echo \"$0|$1|$2|$3\"", "zero", "--nproc-per-node=9", "-h", "--"});
  ExpectExitedWith(run, 0);
  EXPECT_EQ(run.out, "[0]: zero|--nproc-per-node=9|-h|--\n");
}

TEST(LauncherEndToEnd, StdoutAndStderrAreRelayedSeparatelyAndLastLineGetsNewline) {
  LauncherRun run = RunLauncher(
      {"--nproc-per-node", "2", "sh", "-c", "echo out-$RANK; echo err-$RANK >&2; printf end"});
  ExpectExitedWith(run, 0);
  for (const char* rank : {"0", "1"}) {
    std::string prefix = std::string("[") + rank + "]: ";
    EXPECT_TRUE(Contains(run.out, prefix + "out-" + rank + "\n")) << run.out;
    EXPECT_TRUE(Contains(run.out, prefix + "end\n")) << run.out;
    EXPECT_TRUE(Contains(run.err, prefix + "err-" + rank + "\n")) << run.err;
  }
  EXPECT_FALSE(Contains(run.out, "err-")) << run.out;
  EXPECT_FALSE(Contains(run.err, "out-")) << run.err;
}

TEST(LauncherEndToEnd, LinesOfConcurrentWorkersNeverMix) {
  constexpr int kWorkers = 4;
  constexpr int kLinesEach = 300;
  LauncherRun run = RunLauncher(
      {"--nproc-per-node", std::to_string(kWorkers), "sh", "-c",
       "i=0; while [ $i -lt " + std::to_string(kLinesEach) +
           " ]; do echo \"line-$RANK-$i-abcdefghijklmnopqrstuvwxyz0123456789\"; i=$((i+1)); done"});
  ExpectExitedWith(run, 0);
  std::vector<std::string> lines = Lines(run.out);
  ASSERT_EQ(lines.size(), static_cast<size_t>(kWorkers * kLinesEach));
  const std::regex well_formed(R"(\[(\d)\]: line-\1-(\d+)-abcdefghijklmnopqrstuvwxyz0123456789)");
  std::vector<int> next(kWorkers, 0);
  for (const std::string& line : lines) {
    std::smatch match;
    ASSERT_TRUE(std::regex_match(line, match, well_formed)) << line;
    int rank = std::stoi(match[1]);
    EXPECT_EQ(std::stoi(match[2]), next[rank]++) << "lines of rank " << rank << " out of order";
  }
}

TEST(LauncherEndToEnd, StandaloneExportsAFreeLoopbackPort) {
  LauncherRun run =
      RunLauncher({"--standalone", "sh", "-c", "echo port=$MASTER_PORT addr=$MASTER_ADDR"});
  ExpectExitedWith(run, 0);
  std::smatch match;
  ASSERT_TRUE(std::regex_search(run.out, match, std::regex(R"(\[0\]: port=(\d+) addr=(\S+))")))
      << run.out;
  int port = std::stoi(match[1]);
  EXPECT_GE(port, 1);
  EXPECT_LE(port, 65535);
  EXPECT_EQ(match[2], "127.0.0.1");
  // Nothing took it meanwhile, so it can still be bound: it was a free port.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(port));
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  close(fd);
}

TEST(LauncherEndToEnd, HelpExitsZeroAndMentionsEveryFlag) {
  for (const char* flag : {"--help", "-h"}) {
    LauncherRun run = RunLauncher({flag});
    ExpectExitedWith(run, 0);
    for (const char* word :
         {"--nproc-per-node", "--nnodes", "--node-rank", "--master-addr", "--master-port",
          "--standalone", "--max-restarts", "--monitor-interval", "--run-id", "--role",
          "--stop-grace", "--help", "PET_", "RANK", "OMP_NUM_THREADS"}) {
      EXPECT_TRUE(Contains(run.out, word)) << word;
    }
  }
}

TEST(LauncherEndToEnd, BadFlagValueExitsTwoNamingFlagAndValue) {
  LauncherRun run = RunLauncher({"--nproc-per-node", "zero", "true"});
  ExpectExitedWith(run, 2);
  EXPECT_TRUE(Contains(run.err, "ddprun: error: argument --nproc-per-node: invalid value 'zero'"))
      << run.err;
  EXPECT_TRUE(Contains(run.err, "'auto'")) << run.err;
  EXPECT_EQ(run.out, "");
}

TEST(LauncherEndToEnd, UnknownFlagAndMissingProgramExitTwo) {
  LauncherRun unknown = RunLauncher({"--rdzv-backend=c10d", "true"});
  ExpectExitedWith(unknown, 2);
  EXPECT_TRUE(Contains(unknown.err, "ddprun: error: unrecognized option '--rdzv-backend'"))
      << unknown.err;
  LauncherRun missing = RunLauncher({"--nproc-per-node", "2"});
  ExpectExitedWith(missing, 2);
  EXPECT_TRUE(Contains(missing.err, "ddprun: error: missing PROGRAM")) << missing.err;
}

TEST(LauncherEndToEnd, ProgramNotFoundExits127WithMessage) {
  LauncherRun run = RunLauncher({"--nproc-per-node", "2", "ddprun-no-such-program-xyz", "arg"});
  ExpectExitedWith(run, 127);
  EXPECT_TRUE(Contains(
      run.err, "ddprun: cannot run 'ddprun-no-such-program-xyz': No such file or directory"))
      << run.err;
  EXPECT_TRUE(Contains(run.err, "exit code 127")) << run.err;
}

// --analyze-trace reads the records ranks left (tests/distributed/flight_recorder_test.cpp checks
// the analysis against what real ranks write): the diagnosis on stdout and in diagnosis.json.
TEST(LauncherEndToEnd, AnalyzeTracePrintsTheDiagnosisAndWritesItBesideTheRecords) {
  ScratchDir dir;
  auto record = [&](int rank, int last) {
    std::string entries;
    for (int seq = 1; seq <= last; ++seq) {
      entries += std::string(seq > 1 ? "," : "") + "{\"seq\":" + std::to_string(seq) +
                 ",\"op\":\"all_reduce\",\"call\":\"all_reduce\",\"dtype\":\"Float\","
                 "\"numel\":4,\"state\":\"" +
                 (seq < 4 ? "completed" : "failed") + "\",\"error\":\"TimeoutError\"}";
    }
    std::ofstream(dir.File("rank" + std::to_string(rank) + ".json"))
        << "{\"rank\":" << rank << ",\"groups\":[{\"group\":\"0\",\"ranks\":[0,1],"
        << "\"entries\":[" << entries << "]}]}";
  };
  record(0, 4);
  record(1, 3);
  for (const char* flag : {"--analyze-trace", "--analyze_trace"}) {
    LauncherRun run = RunLauncher({flag, dir.path()});
    ExpectExitedWith(run, 0);
    EXPECT_TRUE(Contains(run.out, "rank 1 never entered all_reduce #4 (Float, 4 elements)"))
        << run.out;
    EXPECT_TRUE(Contains(ReadFile(dir.File("diagnosis.json")), "\"first_difference\":4"));
  }
  ScratchDir empty;
  LauncherRun none = RunLauncher({"--analyze-trace=" + empty.path()});
  ExpectExitedWith(none, 1);
  EXPECT_TRUE(Contains(none.out, "no flight records")) << none.out;
  EXPECT_FALSE(FileExists(empty.File("diagnosis.json")));
}

// Each attempt's flight records: a fresh DDP_CPP_TRACE_DIR under --log-dir, kept and diagnosed
// when the attempt fails, removed when it succeeds; a folder the user set is left to the user.
TEST(LauncherEndToEnd, EachAttemptGetsATraceFolderKeptAndDiagnosedOnlyWhenItFails) {
  ScratchDir logs;
  // Rank 0 records two all_reduces and fails in the second; rank 1 completed only the first. Each
  // exits once both records are there (ddprun stops the other rank when one fails).
  const std::string failing =
      "r=$RANK; e='{\"seq\":1,\"op\":\"all_reduce\",\"state\":\"completed\"}';"
      " [ $r = 0 ] && e=\"$e\",'{\"seq\":2,\"op\":\"all_reduce\",\"state\":\"failed\"}';"
      " printf '{\"rank\":%s,\"groups\":[{\"group\":\"0\",\"ranks\":[0,1],\"entries\":[%s]}]}'"
      " $r \"$e\" > \"$DDP_CPP_TRACE_DIR/rank$r.json\";"
      " until [ -e \"$DDP_CPP_TRACE_DIR/rank$((1 - r)).json\" ]; do sleep 0.01; done; exit 1";
  LauncherRun failed = RunLauncher({"--nproc-per-node", "2", "--master-port=29517", "--log-dir",
                                    logs.path(), "--run-id", "job9", "sh", "-c", failing});
  ExpectExitedWith(failed, 1);
  EXPECT_TRUE(Contains(failed.err,
                       "ddprun: the ranks' flight records are kept in " + logs.path() + "/job9_"))
      << failed.err;
  EXPECT_TRUE(Contains(failed.err, "rank 1 never entered all_reduce #2")) << failed.err;
  const std::string kept = failed.err.substr(failed.err.find(logs.path() + "/job9_"));
  const std::string attempt = kept.substr(0, kept.find('\n'));
  EXPECT_TRUE(FileExists(attempt + "/diagnosis.json")) << attempt;
  EXPECT_TRUE(FileExists(attempt + "/rank1.json")) << attempt;

  ScratchDir healthy_logs;
  LauncherRun healthy =
      RunLauncher({"--nproc-per-node", "2", "--master-port=29518", "--log-dir", healthy_logs.path(),
                   "sh", "-c", "test -d \"$DDP_CPP_TRACE_DIR\""});
  ExpectExitedWith(healthy, 0);
  EXPECT_FALSE(Contains(healthy.err, "flight record")) << healthy.err;
  EXPECT_EQ(std::system(("rmdir " + healthy_logs.path()).c_str()), 0)
      << "a healthy run left something in its --log-dir";
  ::mkdir(healthy_logs.path().c_str(), 0755);  // for ScratchDir's own clean-up

  LauncherRun users = RunLauncher({"--nproc-per-node", "1", "--master-port=29519", "sh", "-c",
                                   "test \"$DDP_CPP_TRACE_DIR\" = /users/own"},
                                  {{"DDP_CPP_TRACE_DIR", "/users/own"}});
  ExpectExitedWith(users, 0);
}

// When a rank fails, ddprun asks the ranks still running for their flight records (SIGUSR1, which
// the library answers by writing rank<R>.json) before it stops them, so that the diagnosis knows
// what they were doing. Rank 1 stands for a library rank: it writes its record on SIGUSR1.
TEST(LauncherEndToEnd, RanksStillRunningAfterAFailureAreAskedForTheirRecordsBeforeBeingStopped) {
  ScratchDir logs;
  const std::string script = R"sh(d="$DDP_CPP_TRACE_DIR"
entry() { printf '{"seq":%s,"op":"%s","dtype":"Float","numel":4,"state":"%s"}' "$1" "$2" "$3"; }
record() { printf '{"rank":%s,"groups":[{"group":"0","ranks":[0,1],"entries":[%s,%s]}]}' "$1" "$2" "$3"; }
if [ "$RANK" = 1 ]; then
  record 1 "$(entry 1 all_reduce completed)" "$(entry 2 broadcast started)" > "$d/pending1"
  trap 'mv "$d/pending1" "$d/rank1.json"; exit 0' USR1
  touch "$d/ready"
  while :; do sleep 0.01; done
fi
until [ -e "$d/ready" ]; do sleep 0.01; done
record 0 "$(entry 1 all_reduce completed)" "$(entry 2 all_reduce failed)" > "$d/rank0.json"
exit 1)sh";
  LauncherRun run = RunLauncher({"--nproc-per-node", "2", "--master-port=29521", "--log-dir",
                                 logs.path(), "sh", "-c", script});
  ExpectExitedWith(run, 1);
  EXPECT_TRUE(Contains(run.err, "rank 1: last completed #1; current broadcast #2")) << run.err;
  EXPECT_FALSE(Contains(run.err, "received SIGTERM")) << run.err;
}

// DDP_CPP_TIMELINE in ddprun's environment: the workers inherit it and, after the attempt, ddprun
// merges their timeline_rank<R>.json into timeline.json there (tests/distributed/timeline_test.cpp
// checks the merge of what real ranks write); --merge-timeline does it alone.
TEST(LauncherEndToEnd, WithDdpCppTimelineSetDdprunMergesTheRanksTimelinesAfterTheAttempt) {
  ScratchDir dir;
  const std::string writing =
      "printf '[\n{\"ph\":\"X\",\"name\":\"work\",\"pid\":%s,\"tid\":1,"
      "\"ts\":1,\"dur\":2}\n]\n' $RANK > \"$DDP_CPP_TIMELINE/timeline_rank$RANK.json\"";
  LauncherRun run =
      RunLauncher({"--nproc-per-node", "2", "--master-port=29520", "sh", "-c", writing},
                  {{"DDP_CPP_TIMELINE", dir.path()}});
  ExpectExitedWith(run, 0);
  EXPECT_TRUE(Contains(
      run.err, "ddprun: timeline of 2 ranks (2 events) merged into " + dir.File("timeline.json")))
      << run.err;
  const std::string merged = ReadFile(dir.File("timeline.json"));
  EXPECT_TRUE(Contains(merged, "\"pid\":0") && Contains(merged, "\"pid\":1")) << merged;

  std::remove(dir.File("timeline.json").c_str());
  for (const char* flag : {"--merge-timeline", "--merge_timeline"}) {
    LauncherRun alone = RunLauncher({flag, dir.path()});
    ExpectExitedWith(alone, 0);
    EXPECT_TRUE(FileExists(dir.File("timeline.json")));
  }
  ScratchDir empty;
  ExpectExitedWith(RunLauncher({"--merge-timeline=" + empty.path()}), 1);
}

}  // namespace
}  // namespace ddprun_test
