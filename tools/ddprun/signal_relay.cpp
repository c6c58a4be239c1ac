#include "signal_relay.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <stdexcept>
#include <string>

namespace ddprun {
namespace {

constexpr int kRelayedSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGCHLD};

// The handler reaches the pipe through this global: a signal handler has no other state.
volatile sig_atomic_t g_write_fd = -1;

void OnSignal(int signal_number) {
  int saved_errno = errno;
  unsigned char byte = static_cast<unsigned char>(signal_number);
  // A full pipe drops the byte; the reader has enough pending wake-ups already.
  ssize_t ignored = write(g_write_fd, &byte, 1);
  (void)ignored;
  errno = saved_errno;
}

}  // namespace

SignalRelay::SignalRelay() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    throw std::runtime_error(std::string("pipe2: ") + std::strerror(errno));
  }
  read_fd_ = fds[0];
  write_fd_ = fds[1];
  g_write_fd = write_fd_;
  struct sigaction action {};
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  // SA_RESTART keeps blocking writes to ddprun's stdout/stderr from failing with EINTR;
  // SA_NOCLDSTOP because only exits matter.
  action.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  for (size_t i = 0; i < std::size(kRelayedSignals); ++i) {
    sigaction(kRelayedSignals[i], &action, &previous_[i]);
  }
}

SignalRelay::~SignalRelay() {
  for (size_t i = 0; i < std::size(kRelayedSignals); ++i) {
    sigaction(kRelayedSignals[i], &previous_[i], nullptr);
  }
  g_write_fd = -1;
  close(read_fd_);
  close(write_fd_);
}

std::vector<int> SignalRelay::Drain() {
  std::vector<int> signals;
  unsigned char buffer[64];
  for (;;) {
    ssize_t n = read(read_fd_, buffer, sizeof(buffer));
    if (n > 0) {
      signals.insert(signals.end(), buffer, buffer + n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      break;  // EAGAIN: drained.
    }
  }
  return signals;
}

bool SignalRelay::IsInterrupt(int signal_number) {
  return signal_number == SIGINT || signal_number == SIGTERM || signal_number == SIGHUP;
}

void SignalRelay::ResetInChild() {
  for (int signal_number : kRelayedSignals) signal(signal_number, SIG_DFL);
  // ddprun ignores SIGPIPE, and ignored dispositions survive exec.
  signal(SIGPIPE, SIG_DFL);
  sigset_t empty;
  sigemptyset(&empty);
  sigprocmask(SIG_SETMASK, &empty, nullptr);
}

}  // namespace ddprun
