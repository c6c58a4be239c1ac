// Wait statuses in words, exit codes, and the failure messages built from them.
#include "exit_status.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include "launcher.h"

namespace ddprun {
namespace {

// Builds wait statuses the way the kernel encodes them (W_EXITCODE is not in POSIX).
int Exited(int code) { return code << 8; }
int Signaled(int signal_number) { return signal_number; }

TEST(ExitStatus, DescribesExitCodesAndSignals) {
  ASSERT_TRUE(WIFEXITED(Exited(3)));
  ASSERT_TRUE(WIFSIGNALED(Signaled(SIGKILL)));
  EXPECT_EQ(DescribeWaitStatus(Exited(3)), "exit code 3");
  EXPECT_EQ(DescribeWaitStatus(Signaled(SIGKILL)), "signal 9 (SIGKILL)");
  EXPECT_EQ(DescribeWaitStatus(Signaled(SIGSEGV)), "signal 11 (SIGSEGV)");
  EXPECT_EQ(DescribeSignal(60), "signal 60");
}

TEST(ExitStatus, ExitCodeIsTheWorkersOr128PlusSignal) {
  EXPECT_EQ(ExitCodeForWaitStatus(Exited(0)), 0);
  EXPECT_EQ(ExitCodeForWaitStatus(Exited(3)), 3);
  EXPECT_EQ(ExitCodeForWaitStatus(Signaled(SIGKILL)), 137);
  EXPECT_EQ(ExitCodeForWaitStatus(Signaled(SIGTERM)), 143);
  EXPECT_TRUE(IsSuccess(Exited(0)));
  EXPECT_FALSE(IsSuccess(Exited(1)));
  EXPECT_FALSE(IsSuccess(Signaled(SIGINT)));
}

GroupResult Failure() {
  GroupResult result;
  result.kind = GroupResult::Kind::kWorkerFailed;
  result.has_failure = true;
  result.failed_rank = 5;
  result.failed_local_rank = 1;
  result.failed_pid = 4242;
  result.failed_status = Exited(3);
  result.failed_stderr_tail = {"Traceback", "boom"};
  return result;
}

TEST(LauncherMessages, RestartMessageNamesRankStatusAndAttempt) {
  EXPECT_EQ(RestartMessage(Failure(), 1, 2),
            "ddprun: worker group failed (rank 5: exit code 3), restarting (attempt 1 of 2)\n");
}

TEST(LauncherMessages, SummaryNamesRankStatusPidAndStderrTail) {
  std::string summary = FailureSummary(Failure(), 2);
  EXPECT_NE(summary.find("2 attempts"), std::string::npos) << summary;
  EXPECT_NE(summary.find("rank 5 (local rank 1, pid 4242): exit code 3"), std::string::npos)
      << summary;
  EXPECT_NE(summary.find("ddprun:     Traceback\nddprun:     boom\n"), std::string::npos)
      << summary;
}

TEST(LauncherMessages, SummarySaysWhenThereWasNoStderr) {
  GroupResult result = Failure();
  result.failed_stderr_tail.clear();
  result.failed_status = Signaled(SIGKILL);
  std::string summary = FailureSummary(result, 1);
  EXPECT_NE(summary.find("signal 9 (SIGKILL)"), std::string::npos) << summary;
  EXPECT_NE(summary.find("wrote nothing to stderr"), std::string::npos) << summary;
}

}  // namespace
}  // namespace ddprun
