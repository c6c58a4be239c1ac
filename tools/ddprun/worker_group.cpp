#include "worker_group.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>

#include "exit_status.h"
#include "fd_io.h"
#include "line_prefixer.h"
#include "shm_cleanup.h"
#include "terminal_status.h"

namespace ddprun {
namespace {

using Clock = std::chrono::steady_clock;

// Reads per pipe per wake-up: enough to empty a pipe buffer, bounded so that one chatty worker
// cannot starve the others (or the signal pipe) of attention.
constexpr int kMaxReadsPerPump = 16;
constexpr size_t kReadChunk = 64 * 1024;

// Exit code of a child that could not become a proper worker (parent already gone).
constexpr int kChildSetupFailed = 125;

struct Stream {
  int fd = -1;
  int sink_fd = -1;
  size_t slot = 0;  // its line in the terminal's status area
  std::unique_ptr<LinePrefixer> lines;
};

// Whether `pid` has a handler for `signal_number` (its SigCgt mask in /proc); false when unknown.
bool CatchesSignal(pid_t pid, int signal_number) {
  std::FILE* status = std::fopen(("/proc/" + std::to_string(pid) + "/status").c_str(), "r");
  if (!status) return false;
  char line[256];
  unsigned long long caught = 0;
  bool found = false;
  while (!found && std::fgets(line, sizeof line, status)) {
    found = std::sscanf(line, "SigCgt: %llx", &caught) == 1;
  }
  std::fclose(status);
  return found && (caught >> (signal_number - 1)) & 1ULL;
}

struct Worker {
  const WorkerLaunch* launch = nullptr;
  pid_t pid = -1;
  bool running = false;  // Forked and not reaped yet.
  int status = 0;
  bool asked_for_record = false;  // sent SIGUSR1 after another worker failed
  Stream out;
  Stream err;
};

size_t TerminalColumns(int fd) {
  winsize size{};
  if (ioctl(fd, TIOCGWINSZ, &size) == 0 && size.ws_col > 0) return size.ws_col;
  return 80;
}

// Everything here runs between fork() and exec(). ddprun is single-threaded, so the child may
// use the C library freely, but it only touches memory prepared before the fork.
[[noreturn]] void RunChild(char* const* argv, char* const* envp, int out_fd, int err_fd,
                           pid_t parent) {
  SignalRelay::ResetInChild();
  setpgid(0, 0);
  // The death signal is armed only from now on: if ddprun died before this line, it will never
  // fire, and the re-parented child would run unsupervised. getppid() tells.
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) _exit(kChildSetupFailed);
  dup2(out_fd, STDOUT_FILENO);
  dup2(err_fd, STDERR_FILENO);
  execvpe(argv[0], argv, envp);
  int error = errno;
  char message[1024];
  int length = std::snprintf(message, sizeof(message), "ddprun: cannot run '%s': %s\n", argv[0],
                             std::strerror(error));
  if (length > 0) {
    ssize_t ignored =
        write(STDERR_FILENO, message, std::min(static_cast<size_t>(length), sizeof(message) - 1));
    (void)ignored;
  }
  // The shell's codes: 127 "not found", 126 "found but cannot be run".
  _exit(error == ENOENT ? 127 : 126);
}

std::string StartError(const Worker& worker, const char* call, int error) {
  return "cannot start rank " + std::to_string(worker.launch->rank) + ": " + call + ": " +
         std::strerror(error);
}

std::vector<char*> CStrings(const std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  pointers.reserve(strings.size() + 1);
  for (const std::string& s : strings) pointers.push_back(const_cast<char*>(s.c_str()));
  pointers.push_back(nullptr);
  return pointers;
}

class Supervisor {
 public:
  Supervisor(const GroupSettings& settings, const std::vector<WorkerLaunch>& launches,
             SignalRelay& relay)
      : settings_(settings), relay_(relay), workers_(launches.size()) {
    for (size_t i = 0; i < launches.size(); ++i) {
      Worker& worker = workers_[i];
      worker.launch = &launches[i];
      std::string prefix = "[" + std::to_string(launches[i].rank) + "]: ";
      worker.out.sink_fd = settings.stdout_fd;
      worker.out.lines = std::make_unique<LinePrefixer>(prefix);
      worker.err.sink_fd = settings.stderr_fd;
      worker.err.lines = std::make_unique<LinePrefixer>(prefix, settings.stderr_tail_lines);
      worker.out.slot = 2 * i;
      worker.err.slot = 2 * i + 1;
    }
    if (settings.terminal) status_ = std::make_unique<TerminalStatus>(2 * launches.size());
  }

  GroupResult Run() {
    // A stop signal that arrived between attempts must not start a new group.
    HandleSignals();
    if (interrupted_) return Result();
    for (Worker& worker : workers_) {
      if (!Spawn(worker)) {
        BeginStop(SIGTERM);
        break;
      }
    }
    while (AnyRunning()) {
      std::vector<pollfd> fds;
      std::vector<Stream*> streams;
      fds.push_back({relay_.fd(), POLLIN, 0});
      for (Worker& worker : workers_) {
        for (Stream* stream : {&worker.out, &worker.err}) {
          if (stream->fd < 0) continue;
          fds.push_back({stream->fd, POLLIN, 0});
          streams.push_back(stream);
        }
      }
      int ready = poll(fds.data(), fds.size(), PollTimeoutMs());
      if (ready < 0 && errno != EINTR) {
        // Cannot happen with valid descriptors; if it does, leave no worker behind.
        launcher_error_ = std::string("poll: ") + std::strerror(errno);
        SignalRunning(SIGKILL);
        for (Worker& worker : workers_) {
          if (worker.running) waitpid(worker.pid, &worker.status, 0);
          if (worker.running) RemoveSegmentsOfWorker(worker.pid);
          worker.running = false;
        }
        break;
      }
      if (ready > 0) {
        if (fds[0].revents != 0) HandleSignals();
        for (size_t i = 1; i < fds.size(); ++i) {
          if (fds[i].revents != 0) Pump(*streams[i - 1]);
        }
      }
      Reap();
      if (asking_ && (Clock::now() >= record_deadline_ || !AnyRecordAwaited())) {
        asking_ = false;
        BeginStop(SIGTERM);
      }
      if (stopping_ && !escalated_ && Clock::now() >= kill_deadline_) {
        escalated_ = true;
        SignalRunning(SIGKILL);
      }
    }
    // Whatever the workers wrote before exiting is still in the pipes; a pipe still held open
    // by a worker's descendant is not waited for.
    for (Worker& worker : workers_) {
      for (Stream* stream : {&worker.out, &worker.err}) Close(*stream);
    }
    return Result();
  }

 private:
  bool Spawn(Worker& worker) {
    int out[2];
    int err[2];
    if (pipe2(out, O_CLOEXEC) != 0) {
      launcher_error_ = StartError(worker, "pipe2", errno);
      return false;
    }
    if (pipe2(err, O_CLOEXEC) != 0) {
      launcher_error_ = StartError(worker, "pipe2", errno);
      close(out[0]);
      close(out[1]);
      return false;
    }
    std::vector<char*> argv = CStrings(settings_.command);
    std::vector<char*> envp = CStrings(worker.launch->env);
    pid_t parent = getpid();
    // Until the child has reset its dispositions it runs ddprun's handler, which writes to the
    // self-pipe it shares with us: a SIGTERM meant for the worker would read as one for ddprun.
    // So signals stay blocked across fork(); the child unblocks them after the reset, and one
    // that arrived meanwhile then takes its default action in the child.
    sigset_t all;
    sigset_t previous;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, &previous);
    pid_t pid = fork();
    int fork_error = errno;
    if (pid == 0) RunChild(argv.data(), envp.data(), out[1], err[1], parent);
    sigprocmask(SIG_SETMASK, &previous, nullptr);
    close(out[1]);
    close(err[1]);
    if (pid < 0) {
      launcher_error_ = StartError(worker, "fork", fork_error);
      close(out[0]);
      close(err[0]);
      return false;
    }
    // Also done by the child: whichever runs first, the group exists before we may signal it.
    setpgid(pid, pid);
    SetNonBlocking(out[0]);
    SetNonBlocking(err[0]);
    worker.pid = pid;
    worker.running = true;
    worker.out.fd = out[0];
    worker.err.fd = err[0];
    return true;
  }

  // Reads what is available and relays complete lines; closes the stream at end of file.
  void Pump(Stream& stream) {
    char buffer[kReadChunk];
    for (int reads = 0; stream.fd >= 0 && reads < kMaxReadsPerPump; ++reads) {
      ssize_t n = read(stream.fd, buffer, sizeof(buffer));
      if (n > 0) {
        Relay(stream, stream.lines->Feed(std::string_view(buffer, static_cast<size_t>(n))));
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        return;
      } else {
        Finish(stream);  // End of file, or a read error that would repeat forever.
      }
    }
  }

  // Relays what is still readable, then ends the stream.
  void Close(Stream& stream) {
    Pump(stream);
    Finish(stream);
  }

  // Flushes an unterminated last line (adding the newline) and closes the pipe.
  void Finish(Stream& stream) {
    if (stream.fd < 0) return;
    std::string last = stream.lines->Finish();
    Relay(stream, last.empty() ? std::vector<std::string>{} : std::vector<std::string>{last});
    close(stream.fd);
    stream.fd = -1;
  }

  // Writes complete lines to the stream's sink. On a terminal, the status area with the live
  // lines is erased first and drawn again after them, so that the lines scroll above it.
  void Relay(Stream& stream, const std::vector<std::string>& lines) {
    if (!status_) {
      for (const std::string& line : lines) WriteAll(stream.sink_fd, line);
      return;
    }
    std::string_view live = stream.lines->live_line();
    const bool changed =
        status_->Set(stream.slot, live.empty() ? "" : stream.lines->prefix() + std::string(live));
    if (lines.empty() && !changed) return;
    if (!lines.empty()) WriteAll(settings_.stdout_fd, status_->Erase());
    for (const std::string& line : lines) WriteAll(stream.sink_fd, line);
    WriteAll(settings_.stdout_fd, status_->Draw(TerminalColumns(settings_.stdout_fd)));
  }

  void Reap() {
    for (Worker& worker : workers_) {
      if (!worker.running) continue;
      int status = 0;
      pid_t reaped;
      do {
        reaped = waitpid(worker.pid, &status, WNOHANG);
      } while (reaped < 0 && errno == EINTR);
      if (reaped == 0) continue;
      if (reaped < 0) status = 1 << 8;  // ECHILD: lost track of it; count it as exit code 1.
      worker.running = false;
      worker.status = status;
      RemoveSegmentsOfWorker(worker.pid);
      // Take in its last words now, so that the failure summary is complete.
      Pump(worker.out);
      Pump(worker.err);
      if (!IsSuccess(status) && failed_ == nullptr && !interrupted_) {
        failed_ = &worker;
        AskForRecordsThenStop();
      }
      // Descendants the worker left in its process group are stopped with the others.
      if (stopping_) killpg(worker.pid, escalated_ ? SIGKILL : stop_signal_);
    }
  }

  void HandleSignals() {
    for (int signal_number : relay_.Drain()) {
      if (!SignalRelay::IsInterrupt(signal_number)) continue;  // SIGCHLD: Reap() follows.
      if (!interrupted_) {
        interrupted_ = true;
        interrupt_signal_ = signal_number;
      }
      if (!stopping_) {
        BeginStop(signal_number);
      } else {
        SignalRunning(signal_number);  // Forward a repeated Ctrl-C too.
      }
    }
  }

  // After a worker failed: the running workers without a flight record are asked for one
  // (SIGUSR1: the library writes it from a thread of its own) before they are stopped.
  void AskForRecordsThenStop() {
    if (!settings_.trace_dir.empty()) {
      for (Worker& worker : workers_) {
        // Only a worker that catches SIGUSR1 (the library's handler, where it records): for
        // any other, its default action would end it at once, without its SIGTERM handling.
        if (!worker.running || HasRecord(worker) || !CatchesSignal(worker.pid, SIGUSR1)) continue;
        worker.asked_for_record = true;
        kill(worker.pid, SIGUSR1);
      }
      if (AnyRecordAwaited()) {
        asking_ = true;
        auto wait = std::chrono::duration<double>(std::max(0.0, settings_.record_wait_s));
        record_deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(wait);
        return;
      }
    }
    BeginStop(SIGTERM);
  }

  bool HasRecord(const Worker& worker) const {
    struct stat info {};
    const std::string path =
        settings_.trace_dir + "/rank" + std::to_string(worker.launch->rank) + ".json";
    return stat(path.c_str(), &info) == 0;
  }

  bool AnyRecordAwaited() const {
    return std::any_of(workers_.begin(), workers_.end(), [this](const Worker& worker) {
      return worker.running && worker.asked_for_record && !HasRecord(worker);
    });
  }

  void BeginStop(int signal_number) {
    asking_ = false;
    stopping_ = true;
    stop_signal_ = signal_number;
    auto grace = std::chrono::duration<double>(std::max(0.0, settings_.stop_grace_s));
    kill_deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(grace);
    SignalRunning(signal_number);
  }

  void SignalRunning(int signal_number) {
    for (const Worker& worker : workers_) {
      if (worker.running) killpg(worker.pid, signal_number);
    }
  }

  bool AnyRunning() const {
    return std::any_of(workers_.begin(), workers_.end(),
                       [](const Worker& worker) { return worker.running; });
  }

  // SIGCHLD and the signal pipe wake the loop promptly; the timeout is the monitor interval
  // (a safety net), shortened to meet the SIGKILL deadline while stopping.
  int PollTimeoutMs() const {
    double timeout_ms = settings_.monitor_interval_s * 1000.0;
    // A record appears as a file, which no descriptor announces: looked for every 10 ms.
    if (asking_) timeout_ms = std::min(timeout_ms, 10.0);
    if (stopping_ && !escalated_) {
      double left_ms =
          std::chrono::duration<double, std::milli>(kill_deadline_ - Clock::now()).count();
      timeout_ms = std::min(timeout_ms, std::max(0.0, left_ms));
    }
    return static_cast<int>(std::clamp(std::ceil(timeout_ms), 1.0, 60000.0));
  }

  GroupResult Result() const {
    GroupResult result;
    if (failed_ != nullptr) {
      result.has_failure = true;
      result.failed_rank = failed_->launch->rank;
      result.failed_local_rank = failed_->launch->local_rank;
      result.failed_pid = failed_->pid;
      result.failed_status = failed_->status;
      const auto& tail = failed_->err.lines->tail();
      result.failed_stderr_tail.assign(tail.begin(), tail.end());
    }
    result.interrupt_signal = interrupt_signal_;
    result.launcher_error = launcher_error_;
    if (interrupted_) {
      result.kind = GroupResult::Kind::kInterrupted;
    } else if (!launcher_error_.empty()) {
      result.kind = GroupResult::Kind::kLauncherError;
    } else if (failed_ != nullptr) {
      result.kind = GroupResult::Kind::kWorkerFailed;
    }
    return result;
  }

  const GroupSettings& settings_;
  std::unique_ptr<TerminalStatus> status_;  // only when stdout is a terminal
  SignalRelay& relay_;
  std::vector<Worker> workers_;
  const Worker* failed_ = nullptr;
  bool interrupted_ = false;
  int interrupt_signal_ = 0;
  std::string launcher_error_;
  bool asking_ = false;  // waiting for the flight records asked for (AskForRecordsThenStop)
  Clock::time_point record_deadline_;
  bool stopping_ = false;
  bool escalated_ = false;
  int stop_signal_ = SIGTERM;
  Clock::time_point kill_deadline_;
};

}  // namespace

GroupResult RunWorkerGroup(const GroupSettings& settings, const std::vector<WorkerLaunch>& workers,
                           SignalRelay& relay) {
  return Supervisor(settings, workers, relay).Run();
}

}  // namespace ddprun
