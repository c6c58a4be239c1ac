// Test harness that runs the real ddprun binary (DDPRUN_PATH) as a child process with a
// controlled environment, captures its stdout and stderr, and bounds every wait with a deadline
// so that a hanging launcher fails the test instead of blocking it. Also a scratch directory
// helper and process-liveness checks. Single-threaded test helpers: not thread-safe.
#pragma once

#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

namespace ddprun_test {

using EnvOverrides = std::vector<std::pair<std::string, std::string>>;

struct LauncherRun {
  bool timed_out = false;
  int exit_code = -1;   // When ddprun exited normally.
  int term_signal = 0;  // When ddprun itself died by a signal.
  double seconds = 0;   // From start to exit.
  std::string out;
  std::string err;
};

// A fresh directory under /tmp, removed with its contents on destruction.
class ScratchDir {
 public:
  ScratchDir();
  ~ScratchDir();
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

class LauncherProcess {
 public:
  // Starts `ddprun args...`. The environment is the test's own minus OMP_NUM_THREADS, PET_* and
  // TORCHELASTIC_* (so results do not depend on the caller's shell), plus `env`, plus a TMPDIR
  // of its own unless `env` names one: the trace folders that ddprun keeps after a failed
  // attempt go there, and are removed with it.
  explicit LauncherProcess(const std::vector<std::string>& args, const EnvOverrides& env = {});
  // Kills ddprun (SIGKILL) if it still runs, and reaps it.
  ~LauncherProcess();
  LauncherProcess(const LauncherProcess&) = delete;
  LauncherProcess& operator=(const LauncherProcess&) = delete;

  pid_t pid() const { return pid_; }

  // Reads output until stdout contains `needle` at least `count` times; false on timeout or
  // when ddprun's output ends first.
  bool WaitForStdout(const std::string& needle, int count, double timeout_s);

  void Signal(int signal_number);

  // Collects output until ddprun exits and its pipes close, or until the timeout, in which
  // case ddprun is killed and `timed_out` is set.
  LauncherRun Wait(double timeout_s);

 private:
  bool PumpOnce(int timeout_ms);  // False once both pipes are closed.
  void TryReap();

  ScratchDir tmp_;  // its TMPDIR; destroyed after ddprun is reaped
  pid_t pid_ = -1;
  int out_fd_ = -1;
  int err_fd_ = -1;
  bool reaped_ = false;
  int status_ = 0;
  double start_ = 0;
  double end_ = 0;
  std::string out_;
  std::string err_;
};

// Runs ddprun to completion (bounded by `timeout_s`).
LauncherRun RunLauncher(const std::vector<std::string>& args, const EnvOverrides& env = {},
                        double timeout_s = 10);

bool FileExists(const std::string& path);
std::string ReadFile(const std::string& path);

// True while `pid` exists and is not a zombie (a zombie is dead, merely not reaped yet, which
// happens to orphans in containers whose init does not reap).
bool ProcessAlive(pid_t pid);

// Waits, up to `timeout_s`, for `pid` to be gone; true when it is.
bool WaitProcessGone(pid_t pid, double timeout_s);

// The lines of `text` (without their newlines).
std::vector<std::string> Lines(const std::string& text);

// How often `needle` occurs in `text`.
int CountOccurrences(const std::string& text, const std::string& needle);

}  // namespace ddprun_test
