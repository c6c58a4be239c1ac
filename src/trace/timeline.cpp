#include "trace/timeline.h"

#include <c10/core/ScalarType.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <unistd.h>
#include <vector>

#include "common/error_context.h"
#include "common/json_text.h"
#include "ddp/timeline.h"
#include "trace/flight_recorder.h"

namespace ddp::detail {

std::atomic<bool> timeline_enabled{false};

namespace {

// Events are formatted when they are made (a few hundred nanoseconds: the timeline is opt-in) and
// written once this many bytes wait, so that a long run does not hold its whole trace in memory.
constexpr size_t kFlushBytes = 1 << 20;
// Bucket rows are numbered after the threads' (which count from 1).
constexpr int kFirstBucketRow = 100000;

std::atomic<int> next_thread_row{1};
thread_local int this_thread_row = 0;

int thread_row() {
  if (this_thread_row == 0) this_thread_row = next_thread_row.fetch_add(1);
  return this_thread_row;
}

class TimelineWriter {
 public:
  static TimelineWriter& instance() {
    static TimelineWriter* writer = new TimelineWriter();  // outlives the exit-time flush
    return *writer;
  }

  void open(const std::string& dir, int rank) {
    std::lock_guard<std::mutex> lock(mutex_);
    close_locked();
    const std::string path = dir + "/timeline_rank" + std::to_string(rank) + ".json";
    file_ = std::fopen(path.c_str(), "w");
    if (!file_) {
      fail<InvalidArgumentError>("init_process_group",
                                 "cannot write the timeline to '" + path +
                                     "': " + std::strerror(errno) +
                                     " (InitOptions().timeline_path or DDP_CPP_TIMELINE must "
                                     "name an existing folder this process may write in)");
    }
    rank_ = rank;
    owner_ = getpid();
    offset_us_ = 0;
    named_rows_.clear();
    pending_ = "[";
    first_ = true;
    add_metadata_locked("process_name", 0, "rank " + std::to_string(rank));
    add_line_locked(
        "{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":" + std::to_string(rank) +
        ",\"args\":{\"sort_index\":" + std::to_string(rank) + "}}");
    static const bool registered = [] {
      std::atexit([] { TimelineWriter::instance().stop(); });
      return true;
    }();
    (void)registered;
  }

  void start(int64_t clock_offset_us) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!file_) return;
    offset_us_ = clock_offset_us;
    timeline_enabled.store(true);
  }

  void stop() {
    std::lock_guard<std::mutex> lock(mutex_);
    close_locked();
  }

  int rank() const { return rank_; }

  // `event` without its closing brace: pid, tid and ts are added here.
  void add(int row, const char* row_name, std::string event, int64_t ts_us) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!file_) return;
    if (row_name && named_rows_.insert(row).second) {
      add_metadata_locked("thread_name", row, row_name);
    }
    event += ",\"pid\":" + std::to_string(rank_) + ",\"tid\":" + std::to_string(row) +
             ",\"ts\":" + std::to_string(ts_us + offset_us_) + "}";
    add_line_locked(event);
    if (pending_.size() >= kFlushBytes) flush_locked();
  }

 private:
  void add_metadata_locked(const char* kind, int row, const std::string& name) {
    std::string line = std::string("{\"ph\":\"M\",\"name\":\"") + kind +
                       "\",\"pid\":" + std::to_string(rank_) + ",\"tid\":" + std::to_string(row) +
                       ",\"args\":{\"name\":";
    append_json_string(line, name);
    add_line_locked(line + "}}");
  }

  void add_line_locked(const std::string& line) {
    pending_ += first_ ? "\n" : ",\n";
    first_ = false;
    pending_ += line;
  }

  void flush_locked() {
    if (!file_ || pending_.empty()) return;
    std::fwrite(pending_.data(), 1, pending_.size(), file_);
    std::fflush(file_);
    pending_.clear();
  }

  void close_locked() {
    timeline_enabled.store(false);
    if (!file_) return;
    if (getpid() != owner_) {  // a forked child: the file and what waits are its parent's
      file_ = nullptr;
      pending_.clear();
      return;
    }
    pending_ += "\n]\n";
    flush_locked();
    std::fclose(file_);
    file_ = nullptr;
  }

  std::mutex mutex_;
  std::FILE* file_ = nullptr;  // GUARDED_BY(mutex_)
  int rank_ = 0;
  pid_t owner_ = 0;  // the process that opened the file
  int64_t offset_us_ = 0;
  std::string pending_;       // GUARDED_BY(mutex_)
  bool first_ = true;         // GUARDED_BY(mutex_)
  std::set<int> named_rows_;  // GUARDED_BY(mutex_)
};

thread_local const char* this_thread_name = nullptr;

std::string complete_event(const std::string& name, const char* category, int64_t duration_us,
                           const std::string& args_json) {
  std::string event = "{\"ph\":\"X\",\"name\":";
  append_json_string(event, name);
  event += std::string(",\"cat\":\"") + category +
           "\",\"dur\":" + std::to_string(duration_us < 0 ? 0 : duration_us);
  if (!args_json.empty()) event += ",\"args\":{" + args_json + "}";
  return event;
}

std::string bucket_row_name(int bucket) { return "DDP bucket " + std::to_string(bucket); }

}  // namespace

void open_timeline(const std::string& dir, int rank) { TimelineWriter::instance().open(dir, rank); }

void start_timeline(int64_t clock_offset_us) {
  name_timeline_thread("main");  // the thread that made the process group
  TimelineWriter::instance().start(clock_offset_us);
}

void stop_timeline() { TimelineWriter::instance().stop(); }

void name_timeline_thread(const char* name) {
  if (!this_thread_name) this_thread_name = name;
}

void timeline_span(const std::string& name, const char* category, int64_t start_us, int64_t end_us,
                   const std::string& args_json) {
  TimelineWriter::instance().add(thread_row(), this_thread_name,
                                 complete_event(name, category, end_us - start_us, args_json),
                                 start_us);
}

void timeline_bucket_span(int bucket, const char* name, int64_t start_us, int64_t end_us,
                          const std::string& args_json) {
  const int row = kFirstBucketRow + bucket;
  TimelineWriter::instance().add(row, bucket_row_name(bucket).c_str(),
                                 complete_event(name, "ddp", end_us - start_us, args_json),
                                 start_us);
}

void timeline_instant(const std::string& name, const char* category, int64_t at_us, int bucket) {
  std::string event = "{\"ph\":\"i\",\"s\":\"t\",\"name\":";
  append_json_string(event, name);
  event += std::string(",\"cat\":\"") + category + "\"";
  if (bucket >= 0) {
    TimelineWriter::instance().add(kFirstBucketRow + bucket, bucket_row_name(bucket).c_str(),
                                   std::move(event), at_us);
  } else {
    TimelineWriter::instance().add(thread_row(), this_thread_name, std::move(event), at_us);
  }
}

void timeline_collective(const TraceEntry& entry, const std::string& group) {
  // Nestable async events: collectives of one group may overlap (buckets in flight together),
  // which a thread's row cannot show. Their id names the rank, group and sequence number.
  std::string id = "\"id\":";
  append_json_string(id, "r" + std::to_string(TimelineWriter::instance().rank()) + "g" + group +
                             "c" + std::to_string(entry.sequence));
  std::string name = entry.operation;
  // DDP's once-per-step fingerprint exchange is recorded under the step's name: say what it is,
  // so that it is not taken for the step itself.
  if (name.rfind("DistributedDataParallel ", 0) == 0) name += " (step check)";
  std::string args = "\"group\":";
  append_json_string(args, group);
  args += ",\"seq\":" + std::to_string(entry.sequence) + ",\"backend\":";
  append_json_string(args, entry.backend);
  if (entry.call) {
    args += ",\"call\":";
    append_json_string(args, entry.call);
  }
  if (entry.dtype >= 0) {
    args += ",\"dtype\":";
    append_json_string(args, c10::toString(static_cast<c10::ScalarType>(entry.dtype)));
    args += ",\"numel\":" + std::to_string(entry.numel);
  }
  args += ",\"state\":";
  append_json_string(args, to_string(entry.state));
  const int row = thread_row();
  auto async = [&](const char* phase, const std::string& event_name, bool with_args) {
    std::string event = std::string("{\"ph\":\"") + phase + "\",\"cat\":\"collective\",\"name\":";
    append_json_string(event, event_name);
    event += "," + id;
    if (with_args) event += ",\"args\":{" + args + "}";
    return event;
  };
  TimelineWriter& writer = TimelineWriter::instance();
  const int64_t started = entry.started_us ? entry.started_us : entry.finished_us;
  writer.add(row, this_thread_name, async("b", name, true), entry.queued_us);
  writer.add(row, this_thread_name, async("b", "running", false), started);
  writer.add(row, this_thread_name, async("e", "running", false), entry.finished_us);
  writer.add(row, this_thread_name, async("e", name, false), entry.finished_us);
}

int64_t measure_clock_offset(c10d::Store& store, int rank, int world_size) {
  constexpr int kRounds = 5;
  auto key = [](int other, int round, const char* what) {
    return "timeline_clock/" + std::to_string(other) + "/" + std::to_string(round) + "/" + what;
  };
  if (rank == 0) {
    for (int other = 1; other < world_size; ++other) {
      for (int round = 0; round < kRounds; ++round) {
        store.get(key(other, round, "ask"));
        const std::string now = std::to_string(timeline_now_us());
        store.set(key(other, round, "answer"), std::vector<uint8_t>(now.begin(), now.end()));
      }
    }
    return 0;
  }
  int64_t best_round_trip = -1;
  int64_t offset = 0;
  for (int round = 0; round < kRounds; ++round) {
    const int64_t asked = timeline_now_us();
    store.set(key(rank, round, "ask"), std::vector<uint8_t>{'1'});
    const std::vector<uint8_t> answer = store.get(key(rank, round, "answer"));
    const int64_t answered = timeline_now_us();
    const int64_t rank0_time =
        std::strtoll(std::string(answer.begin(), answer.end()).c_str(), nullptr, 10);
    const int64_t round_trip = answered - asked;
    if (best_round_trip < 0 || round_trip < best_round_trip) {
      best_round_trip = round_trip;
      offset = rank0_time - (asked + answered) / 2;
    }
  }
  return offset;
}

}  // namespace ddp::detail

namespace ddp::timeline {

bool enabled() { return detail::timeline_on(); }

void mark(const std::string& name) {
  if (detail::timeline_on()) detail::timeline_instant(name, "user", detail::timeline_now_us());
}

Range::Range(std::string name) : Range(std::move(name), "user") {}

Range::Range(std::string name, const char* category)
    : name_(std::move(name)),
      category_(category),
      start_us_(detail::timeline_on() ? detail::timeline_now_us() : -1) {}

Range::~Range() {
  if (start_us_ >= 0 && detail::timeline_on()) {
    detail::timeline_span(name_, category_, start_us_, detail::timeline_now_us());
  }
}

}  // namespace ddp::timeline
