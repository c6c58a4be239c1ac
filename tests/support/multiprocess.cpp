#include "support/multiprocess.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <torch/cuda.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>

namespace ddp::testing {

std::string RankOutcome::describe() const {
  if (timed_out) return "rank " + std::to_string(rank) + " timed out";
  if (signal) return "rank " + std::to_string(rank) + " killed by signal " + std::to_string(signal);
  return "rank " + std::to_string(rank) + " exited with code " + std::to_string(exit_code);
}

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    throw std::runtime_error("free_port: bind failed");
  }
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

namespace {

// One temporary folder per test process, made by the process that runs the test (run_ranks makes
// it before it forks, so that the ranks' folders land in it too) and removed when that process
// exits; ranks leave through _exit and never remove it.
class TestFolder {
 public:
  TestFolder() : owner_(::getpid()) {
    char pattern[] = "/tmp/ddp_test_XXXXXX";
    if (::mkdtemp(pattern) == nullptr) throw std::runtime_error("TestFolder: mkdtemp failed");
    path_ = pattern;
  }
  ~TestFolder() {
    std::error_code ignored;
    if (::getpid() == owner_) std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  pid_t owner_;
  std::string path_;
};

const TestFolder& test_folder() {
  static const TestFolder folder;
  return folder;
}

}  // namespace

std::string fresh_path(const std::string& name) {
  std::string pattern = test_folder().path() + "/XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("fresh_path: mkdtemp failed");
  return pattern + "/" + name;
}

const std::string& torch_python() {
  static const std::string python = [] {
    const char* chosen = std::getenv("DDP_TEST_PYTHON");
    std::string path = chosen && *chosen ? chosen : "/usr/bin/python3";
    if (::access(path.c_str(), X_OK) != 0) return std::string();
    const std::string probe = "'" + path + "' -c 'import torch' >/dev/null 2>&1";
    return std::system(probe.c_str()) == 0 ? path : std::string();
  }();
  return python;
}

void exec_python(const char* program) {
  const std::string& python = torch_python();
  ::setenv("USE_LIBUV", "0", 1);
  ::execl(python.c_str(), python.c_str(), "-c", program, static_cast<char*>(nullptr));
  ::_exit(127);
}

int cuda_devices() {
  static const int count = [] {
    int pipe_fds[2];
    if (::pipe(pipe_fds) != 0) return 0;
    std::fflush(stdout);
    std::fflush(stderr);
    pid_t pid = ::fork();
    if (pid == 0) {
      ::close(pipe_fds[0]);
      int devices = static_cast<int>(torch::cuda::device_count());
      ssize_t written = ::write(pipe_fds[1], &devices, sizeof(devices));
      ::_exit(written == sizeof(devices) ? 0 : 1);
    }
    ::close(pipe_fds[1]);
    int devices = 0;
    if (pid < 0 || ::read(pipe_fds[0], &devices, sizeof(devices)) != sizeof(devices)) devices = 0;
    ::close(pipe_fds[0]);
    if (pid > 0) ::waitpid(pid, nullptr, 0);
    return devices;
  }();
  return count;
}

double elapsed_ms(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

namespace {

[[noreturn]] void run_child(int rank, const Launch& launch, int port,
                            const std::function<void(int)>& body) {
  if (launch.set_rendezvous_env) {
    ::setenv("MASTER_ADDR", "127.0.0.1", 1);
    ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
    ::setenv("RANK", std::to_string(rank).c_str(), 1);
    ::setenv("WORLD_SIZE", std::to_string(launch.world_size).c_str(), 1);
  }
  int code = 0;
  try {
    body(rank);
    code = ::testing::Test::HasFailure() ? 1 : 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "[rank %d] uncaught exception: %s\n", rank, error.what());
    code = 3;
  }
  std::fflush(stdout);
  std::fflush(stderr);
  ::_exit(code);
}

int pidfd_open(pid_t pid) { return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)); }

}  // namespace

std::vector<RankOutcome> run_ranks(const Launch& launch, const std::function<void(int)>& body) {
  test_folder();  // before the ranks exist: see TestFolder
  const int port = free_port();
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> pids;
  std::vector<int> pidfds;
  for (int rank = 0; rank < launch.world_size; ++rank) {
    pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("run_ranks: fork failed");
    if (pid == 0) run_child(rank, launch, port, body);
    pids.push_back(pid);
    pidfds.push_back(pidfd_open(pid));
  }
  std::vector<RankOutcome> outcomes(launch.world_size);
  const auto deadline = std::chrono::steady_clock::now() + launch.timeout;
  int running = launch.world_size;
  while (running > 0) {
    std::vector<pollfd> fds;
    std::vector<int> ranks;
    for (int rank = 0; rank < launch.world_size; ++rank) {
      if (outcomes[rank].rank >= 0) continue;
      fds.push_back({pidfds[rank], POLLIN, 0});
      ranks.push_back(rank);
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    deadline - std::chrono::steady_clock::now())
                    .count();
    int ready = left > 0 ? ::poll(fds.data(), fds.size(), static_cast<int>(left)) : 0;
    if (ready <= 0) break;  // the deadline passed
    for (size_t i = 0; i < fds.size(); ++i) {
      if (!(fds[i].revents & POLLIN)) continue;
      int rank = ranks[i];
      int status = 0;
      ::waitpid(pids[rank], &status, 0);
      outcomes[rank].rank = rank;
      if (WIFSIGNALED(status)) outcomes[rank].signal = WTERMSIG(status);
      if (WIFEXITED(status)) outcomes[rank].exit_code = WEXITSTATUS(status);
      --running;
    }
  }
  for (int rank = 0; rank < launch.world_size; ++rank) {
    if (outcomes[rank].rank < 0) {
      ::kill(pids[rank], SIGKILL);
      ::waitpid(pids[rank], nullptr, 0);
      outcomes[rank].rank = rank;
      outcomes[rank].timed_out = true;
    }
    ::close(pidfds[rank]);
  }
  return outcomes;
}

void run_ranks_ok(int world_size, const std::function<void(int)>& body,
                  std::chrono::milliseconds timeout) {
  Launch launch;
  launch.world_size = world_size;
  launch.timeout = timeout;
  for (const auto& outcome : run_ranks(launch, body)) {
    EXPECT_TRUE(outcome.exit_code == 0 && outcome.signal == 0 && !outcome.timed_out)
        << outcome.describe();
  }
}

}  // namespace ddp::testing
