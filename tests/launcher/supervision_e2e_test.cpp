// End to end: how ddprun supervises workers: failures, restarts, signals, orphan prevention.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <regex>

#include "launcher_harness.h"

namespace ddprun_test {
namespace {

void ExpectExitedWith(const LauncherRun& run, int code) {
  EXPECT_FALSE(run.timed_out) << "ddprun hung; stderr:\n" << run.err;
  EXPECT_EQ(run.exit_code, code) << "stdout:\n" << run.out << "stderr:\n" << run.err;
}

bool Contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

pid_t ReadPid(const std::string& path) { return static_cast<pid_t>(std::stol(ReadFile(path))); }

// Expects each /dev/shm/ddp-cpp... path that the workers printed to be gone; returns how many.
int ExpectSegmentsNamedInOutputAreGone(const std::string& out) {
  std::regex made("/dev/shm/ddp-cpp[^ \n]*");
  int checked = 0;
  for (std::sregex_iterator it(out.begin(), out.end(), made), end; it != end; ++it) {
    EXPECT_NE(access(it->str().c_str(), F_OK), 0) << it->str() << " is still there";
    ++checked;
  }
  return checked;
}

// Worker script prelude: publish this worker's pid atomically as $D/pid.$RANK.
constexpr const char* kPublishPid =
    "echo $$ > \"$D/tmp.$RANK\"; mv \"$D/tmp.$RANK\" \"$D/pid.$RANK\"; ";
// Rank 1 waits until rank 0 is known to run, then fails with exit code 3.
constexpr const char* kRankOneFails =
    "if [ $RANK = 1 ]; then while [ ! -f \"$D/pid.0\" ]; do sleep 0.01; done; "
    "echo boom >&2; exit 3; fi; ";

TEST(Supervision, FailingWorkerStopsTheOthersAndReportsRankCodeAndStderr) {
  ScratchDir dir;
  LauncherRun run = RunLauncher({"--nproc-per-node", "2", "--stop-grace", "2", "sh", "-c",
                                 std::string(kPublishPid) + kRankOneFails + "exec sleep 30"},
                                {{"D", dir.path()}});
  ExpectExitedWith(run, 3);
  EXPECT_LT(run.seconds, 5.0);
  EXPECT_TRUE(Contains(run.err, "[1]: boom\n")) << run.err;
  EXPECT_TRUE(Contains(run.err, "first failure: rank 1 (local rank 1, pid " +
                                    std::to_string(ReadPid(dir.File("pid.1"))) + "): exit code 3"))
      << run.err;
  EXPECT_TRUE(Contains(run.err, "exit code 3")) << run.err;
  EXPECT_TRUE(Contains(run.err, "ddprun:     boom\n")) << run.err;
  // ddprun has reaped rank 0: its pid no longer exists.
  EXPECT_FALSE(ProcessAlive(ReadPid(dir.File("pid.0"))));
}

TEST(Supervision, WorkerIgnoringSigtermIsKilledAfterTheGracePeriod) {
  ScratchDir dir;
  LauncherRun run =
      RunLauncher({"--nproc-per-node", "2", "--stop-grace=0.5", "sh", "-c",
                   std::string("trap '' TERM; ") + kPublishPid + kRankOneFails + "exec sleep 30"},
                  {{"D", dir.path()}});
  ExpectExitedWith(run, 3);
  EXPECT_GE(run.seconds, 0.5);
  EXPECT_LT(run.seconds, 5.0);
  EXPECT_FALSE(ProcessAlive(ReadPid(dir.File("pid.0"))));
}

TEST(Supervision, FailedWorkersLeftoverChildrenAreStopped) {
  LauncherRun run =
      RunLauncher({"--stop-grace", "1", "sh", "-c", "sleep 30 & echo child=$!; exit 4"});
  ExpectExitedWith(run, 4);
  EXPECT_LT(run.seconds, 5.0);
  std::smatch match;
  ASSERT_TRUE(std::regex_search(run.out, match, std::regex(R"(child=(\d+))"))) << run.out;
  EXPECT_TRUE(WaitProcessGone(static_cast<pid_t>(std::stol(match[1])), 5));
}

TEST(Supervision, WorkerKilledBySignalGives128PlusSignal) {
  LauncherRun run = RunLauncher({"sh", "-c", "kill -9 $$"});
  ExpectExitedWith(run, 137);
  EXPECT_TRUE(Contains(run.err, "signal 9 (SIGKILL)")) << run.err;
  EXPECT_TRUE(Contains(run.err, "wrote nothing to stderr")) << run.err;
}

// Regression: a worker stopped right after fork(), before it reset ddprun's signal handlers,
// used to report the SIGTERM through ddprun's self-pipe, as if ddprun itself had been stopped.
TEST(Supervision, StoppingJustForkedWorkersIsNotMistakenForASignalToDdprun) {
  for (int i = 0; i < 20; ++i) {
    LauncherRun run = RunLauncher({"--nproc-per-node", "6", "false"});
    ExpectExitedWith(run, 1);
    ASSERT_FALSE(Contains(run.err, "received SIGTERM")) << "iteration " << i << "\n" << run.err;
  }
}

TEST(Supervision, RestartsUntilTheWorkerSucceeds) {
  LauncherRun run = RunLauncher({"--max-restarts", "2", "--nproc-per-node", "2", "sh", "-c",
                                 "echo attempt=$TORCHELASTIC_RESTART_COUNT; "
                                 "[ \"$TORCHELASTIC_RESTART_COUNT\" = 2 ] || exit 4"});
  ExpectExitedWith(run, 0);
  // The worker that failed an attempt printed first; the others may have been stopped before.
  for (const char* attempt : {"]: attempt=0\n", "]: attempt=1\n"}) {
    EXPECT_GE(CountOccurrences(run.out, attempt), 1) << attempt << run.out;
  }
  EXPECT_EQ(CountOccurrences(run.out, "]: attempt=2\n"), 2) << run.out;
  EXPECT_TRUE(Contains(run.err, "exit code 4), restarting (attempt 1 of 2)\n")) << run.err;
  EXPECT_TRUE(Contains(run.err, "exit code 4), restarting (attempt 2 of 2)\n")) << run.err;
  EXPECT_FALSE(Contains(run.err, "ddprun: error")) << run.err;
}

TEST(Supervision, GivesUpAfterMaxRestartsPlusOneAttempts) {
  LauncherRun run = RunLauncher(
      {"--max-restarts", "1", "sh", "-c", "echo attempt=$TORCHELASTIC_RESTART_COUNT; exit 5"});
  ExpectExitedWith(run, 5);
  EXPECT_EQ(CountOccurrences(run.out, "[0]: attempt="), 2) << run.out;
  EXPECT_TRUE(Contains(run.out, "[0]: attempt=0\n[0]: attempt=1\n")) << run.out;
  EXPECT_EQ(CountOccurrences(run.err, "restarting"), 1) << run.err;
  EXPECT_TRUE(Contains(run.err, "worker group failed (2 attempts)")) << run.err;
}

TEST(Supervision, SigtermReachesEveryWorkerAndExits143) {
  ScratchDir dir;
  LauncherProcess ddprun(
      {"--nproc-per-node", "2", "--stop-grace", "3", "--max-restarts", "2", "sh", "-c",
       "trap 'echo term > \"$D/term.$RANK\"; exit 0' TERM; echo ready; "
       "sleep 30 & wait"},
      {{"D", dir.path()}});
  ASSERT_TRUE(ddprun.WaitForStdout("]: ready\n", 2, 5));
  ddprun.Signal(SIGTERM);
  LauncherRun run = ddprun.Wait(8);
  ExpectExitedWith(run, 143);
  EXPECT_TRUE(FileExists(dir.File("term.0")));
  EXPECT_TRUE(FileExists(dir.File("term.1")));
  EXPECT_FALSE(Contains(run.err, "restarting")) << run.err;
  EXPECT_TRUE(Contains(run.err, "received SIGTERM")) << run.err;
}

TEST(Supervision, SigintStopsWithoutRestartAndExits130) {
  ScratchDir dir;
  LauncherProcess ddprun({"--nproc-per-node", "2", "--max-restarts", "3", "sh", "-c",
                          std::string(kPublishPid) + "echo ready; exec sleep 30"},
                         {{"D", dir.path()}});
  ASSERT_TRUE(ddprun.WaitForStdout("]: ready\n", 2, 5));
  ddprun.Signal(SIGINT);
  LauncherRun run = ddprun.Wait(8);
  ExpectExitedWith(run, 130);
  EXPECT_FALSE(Contains(run.err, "restarting")) << run.err;
  EXPECT_FALSE(ProcessAlive(ReadPid(dir.File("pid.0"))));
  EXPECT_FALSE(ProcessAlive(ReadPid(dir.File("pid.1"))));
}

TEST(Supervision, SighupIsForwardedAndExits129) {
  LauncherProcess ddprun({"sh", "-c", "trap 'echo hup; exit 0' HUP; echo ready; sleep 30 & wait"});
  ASSERT_TRUE(ddprun.WaitForStdout("]: ready\n", 1, 5));
  ddprun.Signal(SIGHUP);
  LauncherRun run = ddprun.Wait(8);
  ExpectExitedWith(run, 129);
  EXPECT_TRUE(Contains(run.out, "[0]: hup\n")) << run.out;
}

TEST(Supervision, WorkersDieWhenDdprunIsKilled) {
  LauncherProcess ddprun({"--nproc-per-node", "2", "sh", "-c", "echo pid=$$; exec sleep 30"});
  ASSERT_TRUE(ddprun.WaitForStdout("]: pid=", 2, 5));
  ddprun.Signal(SIGKILL);
  LauncherRun run = ddprun.Wait(8);
  EXPECT_FALSE(run.timed_out);
  EXPECT_EQ(run.term_signal, SIGKILL);
  std::regex pid_line(R"(\]: pid=(\d+))");
  int checked = 0;
  for (auto it = std::sregex_iterator(run.out.begin(), run.out.end(), pid_line);
       it != std::sregex_iterator(); ++it, ++checked) {
    EXPECT_TRUE(WaitProcessGone(static_cast<pid_t>(std::stol((*it)[1])), 5));
  }
  EXPECT_EQ(checked, 2) << run.out;
}

TEST(Supervision, SegmentsOfAKilledWorkerAreRemovedFromDevShm) {
  // A worker killed between creating a shared-memory segment and unlinking it (the shm backend's
  // short window) leaves it in /dev/shm; ddprun removes it once it has reaped the worker. Another
  // process's segment is left alone.
  const std::string other = "/dev/shm/ddp-cpp.ddprun-test.0.g0.h0.r0000cafe.p1";
  { std::ofstream(other.c_str()) << "x"; }
  LauncherRun run = RunLauncher({"--nproc-per-node", "2", "--max-restarts", "0", "sh", "-c",
                                 "f=/dev/shm/ddp-cpp.ddprun-test.0.g0.h$RANK.r0000cafe.p$$; echo x "
                                 "> $f; echo $f; kill -9 $$"});
  EXPECT_FALSE(run.timed_out);
  EXPECT_NE(run.exit_code, 0);
  EXPECT_GE(ExpectSegmentsNamedInOutputAreGone(run.out), 1) << run.out;
  EXPECT_EQ(access(other.c_str(), F_OK), 0);
  unlink(other.c_str());
}

TEST(Supervision, SegmentsOfARankUnderAWrapperAreRemovedOnceItsCreatorIsGone) {
  // A rank that runs under a wrapper (a script, `sh -c ./train`) is not a worker: killed between
  // creating its segment and unlinking it, it is reaped by its wrapper, and ddprun never sees its
  // pid. After the attempt ddprun removes the attempt's segments whose creator is gone. One of
  // the same job whose creator still runs (this test), and a dead creator's of another job, stay.
  // The wrappers exit 0, so that ddprun stops neither before its rank has made its segment.
  const pid_t dead = fork();
  if (dead == 0) _exit(0);
  ASSERT_GT(dead, 0);
  ASSERT_EQ(waitpid(dead, nullptr, 0), dead);
  const std::string live =
      "/dev/shm/ddp-cpp.wrapped-test.0.g0.h9.r0000beef.p" + std::to_string(getpid());
  const std::string other_job =
      "/dev/shm/ddp-cpp.other-test.0.g0.h0.r0000beef.p" + std::to_string(dead);
  for (const std::string& path : {live, other_job}) std::ofstream(path.c_str()) << "x";
  LauncherRun run = RunLauncher(
      {"--nproc-per-node", "2", "--max-restarts", "0", "--run-id", "wrapped-test", "sh", "-c",
       "sh -c 'f=/dev/shm/ddp-cpp.wrapped-test.0.g0.h$RANK.r0000cafe.p$$; echo x > $f; echo $f; "
       "kill -9 $$'; exit 0"});
  ExpectExitedWith(run, 0);
  EXPECT_EQ(ExpectSegmentsNamedInOutputAreGone(run.out), 2) << run.out;
  EXPECT_EQ(access(live.c_str(), F_OK), 0) << "a live creator's segment was removed";
  EXPECT_EQ(access(other_job.c_str(), F_OK), 0) << "another job's segment was removed";
  unlink(live.c_str());
  unlink(other_job.c_str());
}

}  // namespace
}  // namespace ddprun_test
