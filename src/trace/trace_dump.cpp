#include "trace/trace_dump.h"

#include <c10/core/ScalarType.h>
#include <semaphore.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <iostream>
#include <mutex>
#include <thread>

#include "common/atomic_file.h"
#include "common/json_text.h"
#include "trace/system_clock.h"

namespace ddp::detail {
namespace {

std::mutex settings_mutex;
TraceSettings settings;                                // GUARDED_BY(settings_mutex)
std::vector<std::weak_ptr<FlightRecorder>> recorders;  // GUARDED_BY(settings_mutex)
std::mutex dump_mutex;                                 // one dump at a time

// SIGUSR1: the handler posts the semaphore (async-signal-safe), the thread writes the dump. The
// thread is started once per process (a forked child starts its own: threads do not survive it).
sem_t signal_semaphore;
std::atomic<pid_t> signal_thread_pid{0};

void on_sigusr1(int) {
  const int saved = errno;
  sem_post(&signal_semaphore);
  errno = saved;
}

[[noreturn]] void dump_on_signal_forever() {
  for (;;) {
    while (sem_wait(&signal_semaphore) != 0) {
    }
    dump_flight_records("SIGUSR1");
  }
}

bool is_ours(const struct sigaction& action) {
  return !(action.sa_flags & SA_SIGINFO) && action.sa_handler == &on_sigusr1;
}

// Only where the program left SIGUSR1 at its default (which would kill the process): a program
// that handles or ignores it keeps its own meaning.
void install_sigusr1_handler() {
  struct sigaction current {};
  if (sigaction(SIGUSR1, nullptr, &current) != 0) return;
  const bool ours = is_ours(current);
  if (!ours && (current.sa_handler != SIG_DFL || (current.sa_flags & SA_SIGINFO))) return;
  if (signal_thread_pid.load() != getpid()) {
    sem_init(&signal_semaphore, 0, 0);
    std::thread(dump_on_signal_forever).detach();
    signal_thread_pid = getpid();
  }
  if (!ours) {
    struct sigaction action {};
    action.sa_handler = &on_sigusr1;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &action, nullptr);
  }
}

void restore_sigusr1_default() {
  struct sigaction current {};
  if (sigaction(SIGUSR1, nullptr, &current) == 0 && is_ours(current)) {
    std::signal(SIGUSR1, SIG_DFL);
  }
}

void append_ints(std::string& out, const int64_t* values, int count) {
  out += '[';
  for (int i = 0; i < count; ++i) {
    if (i) out += ',';
    out += std::to_string(values[i]);
  }
  out += ']';
}

void append_entry(std::string& out, const TraceEntry& entry) {
  out += "{\"seq\":" + std::to_string(entry.sequence) + ",\"op\":";
  append_json_string(out, entry.operation);
  out += ",\"call\":";
  append_json_string(out, entry.call ? entry.call : entry.operation);
  out += ",\"backend\":";
  append_json_string(out, entry.backend);
  out += ",\"dtype\":";
  append_json_string(
      out, entry.dtype < 0 ? "" : c10::toString(static_cast<c10::ScalarType>(entry.dtype)));
  out += ",\"numel\":" + std::to_string(entry.numel) + ",\"shape\":";
  append_ints(out, entry.sizes, entry.dims);
  out += ",\"state\":";
  append_json_string(out, to_string(entry.state));
  if (entry.failure != TraceFailure::kNone) {
    out += ",\"error\":";
    append_json_string(out, to_string(entry.failure));
  }
  out += ",\"queued_us\":" + std::to_string(entry.queued_us) +
         ",\"started_us\":" + std::to_string(entry.started_us) +
         ",\"finished_us\":" + std::to_string(entry.finished_us) + "}";
}

std::vector<std::shared_ptr<FlightRecorder>> live_recorders(TraceSettings* in_force) {
  std::lock_guard<std::mutex> lock(settings_mutex);
  std::vector<std::shared_ptr<FlightRecorder>> live;
  for (const auto& weak : recorders) {
    if (auto recorder = weak.lock()) live.push_back(std::move(recorder));
  }
  *in_force = settings;
  return live;
}

bool make_folder(const std::string& dir) {
  // Each missing parent in turn, as mkdir -p.
  for (size_t slash = dir.find('/', 1); slash != std::string::npos;
       slash = dir.find('/', slash + 1)) {
    ::mkdir(dir.substr(0, slash).c_str(), 0755);
  }
  return ::mkdir(dir.c_str(), 0755) == 0 || errno == EEXIST;
}

}  // namespace

void start_flight_recording(const TraceSettings& wanted) {
  {
    std::lock_guard<std::mutex> lock(settings_mutex);
    settings = wanted;
    recorders.clear();
  }
  if (wanted.buffer > 0 && !wanted.dir.empty()) install_sigusr1_handler();
}

void stop_flight_recording() {
  std::lock_guard<std::mutex> lock(settings_mutex);
  settings = TraceSettings();
  recorders.clear();
  restore_sigusr1_default();
}

TraceSettings flight_recording_settings() {
  std::lock_guard<std::mutex> lock(settings_mutex);
  return settings;
}

std::shared_ptr<FlightRecorder> make_flight_recorder(const std::string& group_name,
                                                     const std::vector<int>& global_ranks,
                                                     int global_rank) {
  std::lock_guard<std::mutex> lock(settings_mutex);
  if (settings.buffer == 0) return nullptr;
  auto recorder =
      std::make_shared<FlightRecorder>(settings.buffer, group_name, global_ranks, global_rank);
  recorders.push_back(recorder);
  return recorder;
}

std::string flight_records_json(const std::vector<std::shared_ptr<FlightRecorder>>& groups,
                                const TraceSettings& in_force, const std::string& reason) {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const int64_t now = system_clock_us();
  std::string out = "{\"version\":1,\"rank\":" + std::to_string(in_force.rank) +
                    ",\"world_size\":" + std::to_string(in_force.world_size) +
                    ",\"pid\":" + std::to_string(::getpid()) + ",\"host\":";
  append_json_string(out, host);
  out += ",\"reason\":";
  append_json_string(out, reason.c_str());
  out += ",\"dumped_us\":" + std::to_string(now) +
         ",\"trace_buffer\":" + std::to_string(in_force.buffer) + ",\"groups\":[";
  for (size_t g = 0; g < groups.size(); ++g) {
    const FlightRecorder& recorder = *groups[g];
    if (g) out += ',';
    out += "\n{\"group\":";
    append_json_string(out, recorder.group_name().c_str());
    out += ",\"ranks\":[";
    for (size_t i = 0; i < recorder.global_ranks().size(); ++i) {
      // Two appends: one, of a temporary built from a literal, makes GCC 12 warn (-Wrestrict, a
      // false positive).
      out += i ? "," : "";
      out += std::to_string(recorder.global_ranks()[i]);
    }
    out += "],\"entries\":[";
    const std::vector<TraceEntry> entries = recorder.entries();
    for (size_t i = 0; i < entries.size(); ++i) {
      out += i ? ",\n" : "\n";
      append_entry(out, entries[i]);
    }
    out += "]}";
  }
  out += "]}\n";
  return out;
}

std::string dump_flight_records(const std::string& reason) {
  std::lock_guard<std::mutex> dumping(dump_mutex);
  TraceSettings in_force;
  const auto groups = live_recorders(&in_force);
  if (in_force.dir.empty() || groups.empty()) return "";
  const std::string path = in_force.dir + "/rank" + std::to_string(in_force.rank) + ".json";
  try {
    const std::string text = flight_records_json(groups, in_force, reason);
    if (!make_folder(in_force.dir)) throw std::runtime_error(std::strerror(errno));
    const AtomicWriteResult written = write_file_atomically(path, text);
    if (!written.ok()) throw std::runtime_error(std::strerror(written.error));
    return path;
  } catch (const std::exception& error) {
    std::cerr << "[rank " << in_force.rank << "] ddp flight recorder: cannot write " << path << ": "
              << error.what() << std::endl;
    return "";
  }
}

TraceFailure failure_kind(const DistributedError& error) {
  if (dynamic_cast<const UnevenInputsError*>(&error)) return TraceFailure::kOther;
  if (dynamic_cast<const TimeoutError*>(&error)) return TraceFailure::kTimeout;
  if (dynamic_cast<const PeerLostError*>(&error)) return TraceFailure::kPeerLost;
  if (dynamic_cast<const MismatchError*>(&error)) return TraceFailure::kMismatch;
  return TraceFailure::kOther;
}

void note_failure(const DistributedError& error) {
  const TraceFailure kind = failure_kind(error);
  if (kind == TraceFailure::kOther) return;
  if (TraceSlot* slot = ActiveTraceScope::current(); slot && *slot) {
    // A failure raised inside a backend is raised again, for the user's call, by the collective:
    // one dump for both.
    if (slot->recorder->failure_of(slot->sequence) == kind) return;
    slot->recorder->mark_failed(*slot, kind);
  }
  dump_flight_records(std::string(to_string(kind)) + ": " + error.what());
}

}  // namespace ddp::detail
