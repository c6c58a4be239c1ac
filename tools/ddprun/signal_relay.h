// SignalRelay turns SIGINT, SIGTERM, SIGHUP and SIGCHLD into bytes on a non-blocking self-pipe,
// so the supervisor's poll() loop wakes for them and handles them outside signal context (the
// handler only write()s one byte). There can be one instance per process, created before any
// worker is forked and used from the main thread only; its destructor restores the previous
// dispositions.
#pragma once

#include <signal.h>

#include <vector>

namespace ddprun {

class SignalRelay {
 public:
  SignalRelay();
  ~SignalRelay();
  SignalRelay(const SignalRelay&) = delete;
  SignalRelay& operator=(const SignalRelay&) = delete;

  // Becomes readable when a signal has arrived; poll it for POLLIN.
  int fd() const { return read_fd_; }

  // The signals received since the last call, in arrival order (SIGCHLD included: it only
  // means "reap now").
  std::vector<int> Drain();

  // True for the signals that ask ddprun to stop (and that it forwards to the workers).
  static bool IsInterrupt(int signal_number);

  // For a freshly forked child: default dispositions for the relayed signals and SIGPIPE, and
  // an empty signal mask, so the program starts as if ddprun were not there.
  static void ResetInChild();

 private:
  int read_fd_ = -1;
  int write_fd_ = -1;
  struct sigaction previous_[4];
};

}  // namespace ddprun
