#include "launcher_harness.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

extern char** environ;

namespace ddprun_test {
namespace {

double Now() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

bool Starts(const char* text, const char* prefix) {
  return std::strncmp(text, prefix, std::strlen(prefix)) == 0;
}

std::vector<std::string> ChildEnvironment(const EnvOverrides& overrides) {
  std::vector<std::string> env;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    if (Starts(*entry, "OMP_NUM_THREADS=") || Starts(*entry, "PET_") ||
        Starts(*entry, "TORCHELASTIC_")) {
      continue;
    }
    bool overridden = false;
    for (const auto& [name, value] : overrides) {
      overridden |= Starts(*entry, (name + "=").c_str());
    }
    if (!overridden) env.emplace_back(*entry);
  }
  for (const auto& [name, value] : overrides) env.push_back(name + "=" + value);
  return env;
}

std::vector<char*> CStrings(std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  for (std::string& s : strings) pointers.push_back(s.data());
  pointers.push_back(nullptr);
  return pointers;
}

}  // namespace

LauncherProcess::LauncherProcess(const std::vector<std::string>& args, const EnvOverrides& env) {
  std::vector<std::string> argv_strings = {DDPRUN_PATH};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  EnvOverrides with_tmp = env;
  bool names_tmpdir = false;
  for (const auto& [name, value] : env) names_tmpdir |= name == "TMPDIR";
  if (!names_tmpdir) with_tmp.emplace_back("TMPDIR", tmp_.path());
  std::vector<std::string> env_strings = ChildEnvironment(with_tmp);
  std::vector<char*> argv = CStrings(argv_strings);
  std::vector<char*> envp = CStrings(env_strings);
  int out[2];
  int err[2];
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
    throw std::runtime_error("pipe2 failed");
  }
  start_ = Now();
  pid_ = fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    int null_fd = open("/dev/null", O_RDONLY);
    dup2(null_fd, STDIN_FILENO);
    dup2(out[1], STDOUT_FILENO);
    dup2(err[1], STDERR_FILENO);
    execve(argv[0], argv.data(), envp.data());
    _exit(99);
  }
  close(out[1]);
  close(err[1]);
  out_fd_ = out[0];
  err_fd_ = err[0];
}

LauncherProcess::~LauncherProcess() {
  if (!reaped_ && pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, &status_, 0);
  }
  if (out_fd_ >= 0) close(out_fd_);
  if (err_fd_ >= 0) close(err_fd_);
}

bool LauncherProcess::PumpOnce(int timeout_ms) {
  pollfd fds[2] = {{out_fd_, POLLIN, 0}, {err_fd_, POLLIN, 0}};
  if (out_fd_ < 0 && err_fd_ < 0) return false;
  int ready = poll(fds, 2, timeout_ms);  // Negative descriptors are skipped by poll().
  if (ready <= 0) return true;
  for (int i = 0; i < 2; ++i) {
    if (fds[i].revents == 0) continue;
    int& fd = i == 0 ? out_fd_ : err_fd_;
    std::string& sink = i == 0 ? out_ : err_;
    char buffer[4096];
    ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n > 0) {
      sink.append(buffer, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      close(fd);
      fd = -1;
    }
  }
  return out_fd_ >= 0 || err_fd_ >= 0;
}

void LauncherProcess::TryReap() {
  if (reaped_) return;
  if (waitpid(pid_, &status_, WNOHANG) == pid_) {
    reaped_ = true;
    end_ = Now();
  }
}

bool LauncherProcess::WaitForStdout(const std::string& needle, int count, double timeout_s) {
  double deadline = Now() + timeout_s;
  while (CountOccurrences(out_, needle) < count) {
    if (Now() >= deadline) return false;
    if (!PumpOnce(20)) return CountOccurrences(out_, needle) >= count;
  }
  return true;
}

void LauncherProcess::Signal(int signal_number) { kill(pid_, signal_number); }

LauncherRun LauncherProcess::Wait(double timeout_s) {
  LauncherRun run;
  double deadline = Now() + timeout_s;
  // The pipes may close before ddprun exits, and ddprun is reaped by polling waitpid.
  for (;;) {
    bool open = PumpOnce(20);
    TryReap();
    if (reaped_ && !open) break;
    if (!open) poll(nullptr, 0, 5);  // Output is over; ddprun is about to exit.
    if (Now() >= deadline) {
      run.timed_out = true;
      if (!reaped_) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &status_, 0);
        reaped_ = true;
        end_ = Now();
      }
      break;
    }
  }
  if (WIFEXITED(status_)) run.exit_code = WEXITSTATUS(status_);
  if (WIFSIGNALED(status_)) run.term_signal = WTERMSIG(status_);
  run.seconds = end_ - start_;
  run.out = out_;
  run.err = err_;
  return run;
}

LauncherRun RunLauncher(const std::vector<std::string>& args, const EnvOverrides& env,
                        double timeout_s) {
  LauncherProcess process(args, env);
  return process.Wait(timeout_s);
}

ScratchDir::ScratchDir() {
  char pattern[] = "/tmp/ddprun_test_XXXXXX";
  if (mkdtemp(pattern) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = pattern;
}

ScratchDir::~ScratchDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

bool FileExists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

bool ProcessAlive(pid_t pid) {
  if (kill(pid, 0) != 0) return false;
  std::string stat = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  // Format: "pid (comm) S ...": the state follows the last ')'.
  auto paren = stat.rfind(')');
  return !(paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'Z');
}

bool WaitProcessGone(pid_t pid, double timeout_s) {
  double deadline = Now() + timeout_s;
  // A pidfd becomes readable when the process terminates: no sleeping needed where it exists.
  int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  while (ProcessAlive(pid)) {
    double left_ms = (deadline - Now()) * 1000;
    if (left_ms <= 0) break;
    if (pidfd >= 0) {
      pollfd pfd{pidfd, POLLIN, 0};
      poll(&pfd, 1, static_cast<int>(left_ms) + 1);
    } else {
      poll(nullptr, 0, 10);
    }
  }
  if (pidfd >= 0) close(pidfd);
  return !ProcessAlive(pid);
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

int CountOccurrences(const std::string& text, const std::string& needle) {
  int count = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) {
    ++count;
  }
  return count;
}

}  // namespace ddprun_test
