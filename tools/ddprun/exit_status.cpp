#include "exit_status.h"

#include <signal.h>
#include <sys/wait.h>

namespace ddprun {

std::string SignalName(int signal_number) {
  // A fixed table rather than sigabbrev_np(): that needs glibc 2.32, and these are the signals
  // that realistically end a worker.
  switch (signal_number) {
    case SIGHUP:
      return "SIGHUP";
    case SIGINT:
      return "SIGINT";
    case SIGQUIT:
      return "SIGQUIT";
    case SIGILL:
      return "SIGILL";
    case SIGTRAP:
      return "SIGTRAP";
    case SIGABRT:
      return "SIGABRT";
    case SIGBUS:
      return "SIGBUS";
    case SIGFPE:
      return "SIGFPE";
    case SIGKILL:
      return "SIGKILL";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGSEGV:
      return "SIGSEGV";
    case SIGUSR2:
      return "SIGUSR2";
    case SIGPIPE:
      return "SIGPIPE";
    case SIGALRM:
      return "SIGALRM";
    case SIGTERM:
      return "SIGTERM";
    case SIGXCPU:
      return "SIGXCPU";
    case SIGXFSZ:
      return "SIGXFSZ";
    case SIGSYS:
      return "SIGSYS";
    default:
      return "";
  }
}

std::string DescribeSignal(int signal_number) {
  std::string text = "signal " + std::to_string(signal_number);
  std::string name = SignalName(signal_number);
  if (!name.empty()) text += " (" + name + ")";
  return text;
}

std::string DescribeWaitStatus(int status) {
  if (WIFEXITED(status)) return "exit code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return DescribeSignal(WTERMSIG(status));
  return "wait status " + std::to_string(status);
}

int ExitCodeForWaitStatus(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

bool IsSuccess(int status) { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }

}  // namespace ddprun
