// The flight recorder across ranks: three jobs of 3 ranks fail at their 4th all_reduce, on shm,
// gloo and hierarchical (ranks posing as two hosts), and each rank's record, read back by
// `ddprun --analyze-trace`, says exactly what each rank last completed, what it is in now, and
// where the ranks first differ; a healthy job writes nothing.
//   - rank 2 never enters its 4th all_reduce: ranks 0 and 1 time out in it; rank 2, which waits
//     elsewhere, is asked for its record with SIGUSR1;
//   - rank 1 calls broadcast instead: every rank raises a MismatchError;
//   - rank 1 is killed in its 4th: it writes its record on SIGUSR1 while inside it, then dies; the
//     others enter it afterwards and lose their peer.
#include "trace/flight_recorder.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <torch/torch.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include "ddp/ddp.h"
#include "process_group/group_state.h"
#include "support/multiprocess.h"
// ddprun's reader, by path: see tools/ddprun/CMakeLists.txt.
#include "../../tools/ddprun/json_value.h"
#include "../../tools/ddprun/trace_analysis.h"

using ddp::testing::fresh_path;
using ddp::testing::Launch;
using ddp::testing::run_ranks;

namespace {

constexpr auto kShortTimeout = std::chrono::seconds(4);
constexpr auto kBound = std::chrono::seconds(30);  // for waits on another rank's progress

const char* const kBackends[] = {"shm", "gloo", "hierarchical"};

// Flags the forked ranks share (made before the fork): 0 until set.
std::atomic<int>* shared_flags(int count) {
  void* memory = ::mmap(nullptr, count * sizeof(std::atomic<int>), PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (memory == MAP_FAILED) return nullptr;
  auto* flags = static_cast<std::atomic<int>*>(memory);
  for (int i = 0; i < count; ++i) new (&flags[i]) std::atomic<int>(0);
  return flags;
}

bool exists(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0;
}

// Waits, up to kBound, for `done`; false when it never came.
template <typename Condition>
bool wait_for(Condition done) {
  const auto deadline = std::chrono::steady_clock::now() + kBound;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // polling a condition
  }
  return true;
}

// True once `pid` has exited (gone, or a zombie that its parent has not reaped yet).
bool has_exited(int pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;
  const auto close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] == 'Z';
}

void init(const std::string& backend, int rank, const std::string& trace_dir) {
  auto options = ddp::InitOptions().timeout(kShortTimeout).trace_dir(trace_dir);
  if (backend == "hierarchical") {
    ::setenv("DDP_CPP_HOST_ID", rank % 2 == 0 ? "a" : "b", 1);  // ranks 0, 2 | rank 1
  } else {
    options.backend(backend);
  }
  ddp::init_process_group(options);
  ASSERT_EQ(ddp::get_backend(), backend);
}

// The three all_reduces every job completes first.
torch::Tensor three_all_reduces() {
  auto t = torch::ones({4});
  for (int i = 0; i < 3; ++i) ddp::all_reduce(t);
  return t;
}

// The world group's entry `sequence` on this rank, once it is recorded (null before).
bool recorded(uint64_t sequence) {
  auto recorder = ddp::ProcessGroup().state()->recorder;
  if (!recorder) return false;
  for (const auto& entry : recorder->entries()) {
    if (entry.sequence == sequence) return true;
  }
  return false;
}

struct Analysis {
  std::string summary;     // what ddprun printed
  ddprun::JsonValue json;  // diagnosis.json
};

// What `ddprun --analyze-trace DIR` prints and writes (its command line: tests/launcher).
Analysis analyze(const std::string& dir) {
  Analysis analysis;
  EXPECT_TRUE(ddprun::WriteDiagnosis(dir, &analysis.summary)) << analysis.summary;
  std::ifstream file(dir + "/diagnosis.json");
  std::stringstream text;
  text << file.rdbuf();
  std::string error;
  auto json = ddprun::ParseJson(text.str(), &error);
  EXPECT_TRUE(json.has_value()) << error << "\n" << text.str();
  if (json) analysis.json = *json;
  return analysis;
}

const ddprun::JsonValue& member(const Analysis& analysis, int rank) {
  return analysis.json["groups"].items.at(0)["members"].items.at(rank);
}

void expect_contains(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "missing '" << part << "' in:\n" << text;
}

}  // namespace

TEST(FlightRecorder, ARankThatNeverEntersItsFourthAllReduceIsNamedAsNeverHavingEnteredIt) {
  for (std::string backend : kBackends) {
    SCOPED_TRACE(backend);
    const std::string dir = fresh_path("trace");
    auto* dumped = shared_flags(3);
    ASSERT_NE(dumped, nullptr);
    Launch launch;
    launch.world_size = 3;
    auto outcomes = run_ranks(launch, [&](int rank) {
      init(backend, rank, dir);
      torch::Tensor t = three_all_reduces();
      if (rank == 2) {
        // Elsewhere until the others have given up; then asked for its record.
        ASSERT_TRUE(wait_for([&] { return dumped[0].load() && dumped[1].load(); }));
        ::kill(::getpid(), SIGUSR1);
        ASSERT_TRUE(wait_for([&] { return exists(dir + "/rank2.json"); }));
        return;
      }
      try {
        ddp::all_reduce(t);
        ADD_FAILURE() << "the all_reduce that rank 2 never entered completed";
      } catch (const ddp::TimeoutError&) {
        dumped[rank].store(1);
      } catch (const ddp::PeerLostError& error) {
        // Across hosts, rank 1 may learn that host 0's leader gave up first (hierarchical).
        EXPECT_TRUE(backend == "hierarchical" && rank == 1) << error.what();
        dumped[rank].store(2);
      }
      EXPECT_TRUE(exists(dir + "/rank" + std::to_string(rank) + ".json"));  // before the catch
    });
    for (const auto& outcome : outcomes) EXPECT_EQ(outcome.exit_code, 0) << outcome.describe();

    const Analysis analysis = analyze(dir);
    const auto& group = analysis.json["groups"].items.at(0);
    EXPECT_EQ(group["group"].as_string(), "0");
    for (int rank = 0; rank < 3; ++rank) {
      EXPECT_EQ(member(analysis, rank)["last_completed"].as_int(), 3) << rank;
    }
    for (int rank : {0, 1}) {
      const auto& current = member(analysis, rank)["current"];
      EXPECT_EQ(current["seq"].as_int(), 4);
      EXPECT_EQ(current["op"].as_string(), "all_reduce");
      EXPECT_EQ(current["state"].as_string(), "failed");
      EXPECT_EQ(current["error"].as_string(),
                dumped[rank].load() == 1 ? "TimeoutError" : "PeerLostError");
      EXPECT_EQ(current["backend"].as_string(), backend);
    }
    EXPECT_EQ(member(analysis, 2)["current"].kind, ddprun::JsonValue::Kind::kNull);
    EXPECT_EQ(group["first_difference"].as_int(), 4);
    ASSERT_EQ(group["never_entered"].items.size(), 1u);
    EXPECT_EQ(group["never_entered"].items[0].as_int(), 2);
    EXPECT_EQ(group["entered_expected"].items.size(), 2u);
    EXPECT_TRUE(group["entered_other"].items.empty());
    expect_contains(analysis.summary,
                    "rank 2 never entered all_reduce #4 (Float, 4 elements); ranks 0, 1 entered "
                    "all_reduce #4");
    expect_contains(analysis.summary,
                    "rank 0: last completed #3; current all_reduce #4 (Float, 4 elements), "
                    "failed (TimeoutError)");
    std::fprintf(stderr, "%s", analysis.summary.c_str());
    expect_contains(analysis.summary, "rank 2: last completed #3; no collective in progress");
  }
}

TEST(FlightRecorder, ARankThatCallsBroadcastInsteadOfItsFourthAllReduceIsNamedWithBothCalls) {
  for (std::string backend : kBackends) {
    SCOPED_TRACE(backend);
    const std::string dir = fresh_path("trace");
    Launch launch;
    launch.world_size = 3;
    auto outcomes = run_ranks(launch, [&](int rank) {
      init(backend, rank, dir);
      torch::Tensor t = three_all_reduces();
      if (rank == 1) {
        EXPECT_THROW(ddp::broadcast(t, 0), ddp::MismatchError);
      } else {
        EXPECT_THROW(ddp::all_reduce(t), ddp::MismatchError);
      }
      EXPECT_TRUE(exists(dir + "/rank" + std::to_string(rank) + ".json"));
    });
    for (const auto& outcome : outcomes) EXPECT_EQ(outcome.exit_code, 0) << outcome.describe();

    const Analysis analysis = analyze(dir);
    const auto& group = analysis.json["groups"].items.at(0);
    for (int rank = 0; rank < 3; ++rank) {
      const auto& current = member(analysis, rank)["current"];
      EXPECT_EQ(member(analysis, rank)["last_completed"].as_int(), 3) << rank;
      EXPECT_EQ(current["seq"].as_int(), 4) << rank;
      EXPECT_EQ(current["op"].as_string(), rank == 1 ? "broadcast" : "all_reduce") << rank;
      EXPECT_EQ(current["state"].as_string(), "failed") << rank;
      EXPECT_EQ(current["error"].as_string(), "MismatchError") << rank;
    }
    EXPECT_EQ(group["first_difference"].as_int(), 4);
    EXPECT_TRUE(group["never_entered"].items.empty());
    ASSERT_EQ(group["entered_other"].items.size(), 1u);
    EXPECT_EQ(group["entered_other"].items[0]["rank"].as_int(), 1);
    EXPECT_EQ(group["entered_other"].items[0]["call"]["op"].as_string(), "broadcast");
    EXPECT_EQ(group["expected"]["op"].as_string(), "all_reduce");
    expect_contains(analysis.summary,
                    "the ranks first differ at #4: rank 1 entered broadcast #4 (Float, 4 elements) "
                    "instead; ranks 0, 2 entered all_reduce #4 (Float, 4 elements).");
  }
}

TEST(FlightRecorder, ARankKilledInItsFourthAllReduceIsInItInItsRecordAndTheOthersLostIt) {
  for (std::string backend : kBackends) {
    SCOPED_TRACE(backend);
    const std::string dir = fresh_path("trace");
    auto* killed_pid = shared_flags(1);
    ASSERT_NE(killed_pid, nullptr);
    Launch launch;
    launch.world_size = 3;
    auto outcomes = run_ranks(launch, [&](int rank) {
      init(backend, rank, dir);
      torch::Tensor t = three_all_reduces();
      if (rank == 1) {
        // Once inside its 4th all_reduce (where it waits for the others), it writes its record
        // on SIGUSR1 and dies.
        std::thread killer([&] {
          if (wait_for([] { return recorded(4); })) {
            ::kill(::getpid(), SIGUSR1);
            wait_for([&] { return exists(dir + "/rank1.json"); });
          }
          killed_pid->store(::getpid());
          ::raise(SIGKILL);
        });
        ddp::all_reduce(t);
        killer.join();
        ADD_FAILURE() << "rank 1 completed an all_reduce that the others had not entered";
        return;
      }
      ASSERT_TRUE(
          wait_for([&] { return killed_pid->load() != 0 && has_exited(killed_pid->load()); }));
      EXPECT_THROW(ddp::all_reduce(t), ddp::PeerLostError);
      EXPECT_TRUE(exists(dir + "/rank" + std::to_string(rank) + ".json"));
    });
    EXPECT_EQ(outcomes[0].exit_code, 0) << outcomes[0].describe();
    EXPECT_EQ(outcomes[1].signal, SIGKILL) << outcomes[1].describe();
    EXPECT_EQ(outcomes[2].exit_code, 0) << outcomes[2].describe();

    const Analysis analysis = analyze(dir);
    const auto& group = analysis.json["groups"].items.at(0);
    for (int rank = 0; rank < 3; ++rank) {
      const auto& current = member(analysis, rank)["current"];
      EXPECT_EQ(member(analysis, rank)["last_completed"].as_int(), 3) << rank;
      EXPECT_EQ(current["seq"].as_int(), 4) << rank;
      EXPECT_EQ(current["op"].as_string(), "all_reduce") << rank;
      if (rank == 1) {
        EXPECT_EQ(current["state"].as_string(), "queued");
        expect_contains(member(analysis, rank)["reason"].as_string(), "SIGUSR1");
      } else {
        EXPECT_EQ(current["state"].as_string(), "failed") << rank;
        EXPECT_EQ(current["error"].as_string(), "PeerLostError") << rank;
      }
    }
    EXPECT_EQ(group["first_difference"].kind, ddprun::JsonValue::Kind::kNull);
    expect_contains(analysis.summary, "the ranks with records agree on every collective");
    expect_contains(analysis.summary,
                    "rank 1: last completed #3; current all_reduce #4 (Float, 4 elements), queued");
  }
}

TEST(FlightRecorder, AHealthyJobWritesNoRecord) {
  const std::string dir = fresh_path("trace");
  ddp::testing::run_ranks_ok(3, [&](int rank) {
    init("shm", rank, dir);
    auto sub = ddp::new_group({0, 1});
    torch::Tensor t = three_all_reduces();
    ddp::broadcast(t, 0);
    ddp::barrier();
    if (rank < 2) ddp::all_reduce(t, ddp::ReduceOp::SUM, sub);
    auto recorder = ddp::ProcessGroup().state()->recorder;
    ASSERT_NE(recorder, nullptr);
    const auto entries = recorder->entries();
    ASSERT_EQ(entries.size(), 5u);
    for (const auto& entry : entries) {
      EXPECT_EQ(entry.state, ddp::detail::TraceState::kCompleted) << entry.operation;
      EXPECT_GE(entry.finished_us, entry.queued_us);
    }
    EXPECT_STREQ(entries[3].operation, "broadcast");
    EXPECT_STREQ(entries[4].operation, "barrier");
    EXPECT_STREQ(entries[0].backend, "shm");
    if (rank < 2) {
      EXPECT_EQ(sub.state()->recorder->entries().size(), 1u);
    }
    ddp::destroy_process_group();
  });
  EXPECT_FALSE(exists(dir)) << dir << " was written by a healthy job";
}
