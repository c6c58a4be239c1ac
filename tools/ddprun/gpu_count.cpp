#include "gpu_count.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>

#include "exit_status.h"
#include "fd_io.h"

namespace ddprun {
namespace {

// The driver API entry points used, with cuda.h's signatures (CUresult is an int enum), declared
// here so that building ddprun needs nothing from CUDA.
using CuInit = int (*)(unsigned int flags);
using CuDeviceGetCount = int (*)(int* count);
using CuGetErrorName = int (*)(int error, const char** name);
constexpr int kCudaSuccess = 0;

GpuCount NoGpu(std::string why) {
  GpuCount result;
  result.why_none = std::move(why);
  return result;
}

// "code 100 (CUDA_ERROR_NO_DEVICE)"; the name only when the driver can give it.
std::string DescribeCudaError(CuGetErrorName get_name, int code) {
  std::string text = "code " + std::to_string(code);
  const char* name = nullptr;
  if (get_name != nullptr && get_name(code, &name) == kCudaSuccess && name != nullptr) {
    text += std::string(" (") + name + ")";
  }
  return text;
}

// Runs in the child. The library is never closed: the child exits right after.
GpuCount AskDriver(const std::string& library) {
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    // dlerror() names the library: "libcuda.so.1: cannot open shared object file: ...".
    const char* error = dlerror();
    std::string why = error ? std::string(error) : library + ": dlopen failed";
    return NoGpu("the CUDA driver library could not be loaded (" + why + ")");
  }
  auto init = reinterpret_cast<CuInit>(dlsym(handle, "cuInit"));
  auto get_count = reinterpret_cast<CuDeviceGetCount>(dlsym(handle, "cuDeviceGetCount"));
  // Optional: it only names the error codes.
  auto get_name = reinterpret_cast<CuGetErrorName>(dlsym(handle, "cuGetErrorName"));
  if (init == nullptr || get_count == nullptr) {
    return NoGpu(library + " has no " + (init == nullptr ? "cuInit" : "cuDeviceGetCount") +
                 " (not a CUDA driver library?)");
  }
  int code = init(0);
  if (code != kCudaSuccess) return NoGpu("cuInit failed with " + DescribeCudaError(get_name, code));
  int count = 0;
  code = get_count(&count);
  if (code != kCudaSuccess) {
    return NoGpu("cuDeviceGetCount failed with " + DescribeCudaError(get_name, code));
  }
  if (count <= 0) return NoGpu("the CUDA driver reports no device");
  GpuCount result;
  result.count = count;
  return result;
}

// The child's whole life: ask the driver, write "COUNT\nWHY" to `reply_fd`, exit.
[[noreturn]] void AnswerFromChild(int reply_fd, pid_t parent, const std::string& library) {
  // A driver that hangs must not outlive a ddprun killed meanwhile. Armed only now, so if ddprun
  // died before this line the death signal will never come: getppid() tells.
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) _exit(1);
  GpuCount answer = AskDriver(library);
  WriteAll(reply_fd, std::to_string(answer.count) + "\n" + answer.why_none);
  // _exit, not exit: the parent's atexit handlers and stdio buffers are not the child's to run.
  _exit(0);
}

// Reads `fd` until end of file (true), or false when `deadline` passes first (or, never seen,
// when poll or read fail).
bool ReadUntilEndOfFile(int fd, std::chrono::steady_clock::time_point deadline, std::string* data) {
  char buffer[4096];
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd entry{fd, POLLIN, 0};
    int ready = poll(&entry, 1, static_cast<int>(std::min<long long>(left.count(), 1000)));
    if (ready < 0 && errno != EINTR) return false;
    if (ready <= 0) continue;
    ssize_t got = read(fd, buffer, sizeof(buffer));
    if (got == 0) return true;
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return false;
    }
    data->append(buffer, static_cast<size_t>(got));
  }
}

// True when `reply` is the child's "COUNT\nWHY", which is then stored in `out`.
bool ParseReply(const std::string& reply, GpuCount* out) {
  auto newline = reply.find('\n');
  if (newline == std::string::npos) return false;
  int count = 0;
  auto [end, error] = std::from_chars(reply.data(), reply.data() + newline, count);
  if (error != std::errc() || end != reply.data() + newline || count < 0) return false;
  out->count = count;
  out->why_none = reply.substr(newline + 1);
  return true;
}

std::string FormatSeconds(double seconds) {
  std::string text = std::to_string(seconds);
  text.erase(text.find_last_not_of('0') + 1);  // std::to_string always has a decimal point.
  if (text.back() == '.') text.pop_back();
  return text;
}

}  // namespace

GpuCount CountVisibleGpus(const std::string& driver_library, double timeout_s) {
  int pipe_fds[2];
  // Close-on-exec, so that a helper the driver may exec (nvidia-modprobe) does not hold the
  // write end and delay the end of file.
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) {
    return NoGpu(std::string("GPUs not counted: pipe failed: ") + std::strerror(errno));
  }
  const pid_t parent = getpid();
  const pid_t child = fork();
  if (child < 0) {
    int error = errno;
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    return NoGpu(std::string("GPUs not counted: fork failed: ") + std::strerror(error));
  }
  if (child == 0) {
    close(pipe_fds[0]);
    AnswerFromChild(pipe_fds[1], parent, driver_library);
  }
  close(pipe_fds[1]);

  auto deadline = std::chrono::steady_clock::now() +
                  std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                      std::chrono::duration<double>(std::max(0.0, timeout_s)));
  std::string reply;
  bool answered = ReadUntilEndOfFile(pipe_fds[0], deadline, &reply);
  close(pipe_fds[0]);
  if (!answered) kill(child, SIGKILL);
  int status = 0;
  while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  if (!answered) {
    return NoGpu("no answer within " + FormatSeconds(timeout_s) + " s from the process asking " +
                 driver_library + " for its devices (cuInit hung?), so it was killed");
  }
  GpuCount result;
  if (!ParseReply(reply, &result)) {
    return NoGpu("the process that asked " + driver_library + " for its devices ended with " +
                 DescribeWaitStatus(status) + " before answering");
  }
  return result;
}

}  // namespace ddprun
