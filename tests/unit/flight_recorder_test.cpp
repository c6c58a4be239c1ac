// The flight recorder's pieces in one process (trace/): the ring, the settings' precedence, the
// JSON it writes, and ddprun's reading of records whose rings wrapped or that are missing.
#include "trace/flight_recorder.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>

#include "ddp/errors.h"
#include "support/multiprocess.h"
// ddprun's reader, by path: see tools/ddprun/CMakeLists.txt.
#include "../../tools/ddprun/json_value.h"
#include "../../tools/ddprun/trace_analysis.h"
#include "trace/trace_dump.h"

namespace {

using ddp::detail::FlightRecorder;
using ddp::detail::TraceFailure;
using ddp::detail::TraceState;

// A slot for entry `sequence` of `recorder`, as a collective holds it.
ddp::detail::TraceSlot slot_of(const std::shared_ptr<FlightRecorder>& recorder, uint64_t sequence) {
  ddp::detail::TraceSlot slot;
  slot.recorder = recorder.get();
  slot.sequence = sequence;
  return slot;
}

TEST(FlightRecorderUnit, TheRingKeepsTheLastEntriesInOrderAfterItWraps) {
  auto recorder = std::make_shared<FlightRecorder>(3, "0", std::vector<int>{0, 1}, 0);
  for (int i = 0; i < 5; ++i) recorder->open(i % 2 ? "broadcast" : "all_reduce", nullptr);
  auto fifth = slot_of(recorder, 5);
  recorder->mark_started(fifth);
  recorder->mark_completed(slot_of(recorder, 4));
  recorder->mark_failed(slot_of(recorder, 2), TraceFailure::kTimeout);  // overwritten: no-op
  const auto entries = recorder->entries();
  ASSERT_EQ(entries.size(), 3u);
  EXPECT_EQ(entries[0].sequence, 3u);
  EXPECT_EQ(entries[1].sequence, 4u);
  EXPECT_EQ(entries[2].sequence, 5u);
  EXPECT_STREQ(entries[1].operation, "broadcast");
  EXPECT_EQ(entries[0].state, TraceState::kQueued);
  EXPECT_EQ(entries[1].state, TraceState::kCompleted);
  EXPECT_EQ(entries[2].state, TraceState::kStarted);
  // Times come out as microseconds since the epoch, whatever clock the ring keeps them in.
  const int64_t now_us = std::chrono::duration_cast<std::chrono::microseconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
  EXPECT_NEAR(static_cast<double>(entries[2].started_us), static_cast<double>(now_us), 2e6);
  EXPECT_LE(entries[2].queued_us, entries[2].started_us);
  EXPECT_LE(entries[1].queued_us, entries[1].finished_us);
  EXPECT_EQ(entries[2].finished_us, 0);
  EXPECT_EQ(recorder->failure_of(2), TraceFailure::kNone);
  // Seven more: the ring holds 10, 11, 12.
  for (int i = 0; i < 7; ++i) recorder->open("barrier", nullptr);
  EXPECT_EQ(recorder->entries().front().sequence, 10u);
  EXPECT_EQ(recorder->entries().back().sequence, 12u);
}

TEST(FlightRecorderUnit, AKnownFailureKindReplacesAnUnknownOneButNotTheOtherWayRound) {
  auto recorder = std::make_shared<FlightRecorder>(4, "0", std::vector<int>{0, 1}, 1);
  recorder->open("all_reduce", nullptr);
  const auto first = slot_of(recorder, 1);
  recorder->mark_failed(first, TraceFailure::kOther);
  recorder->mark_failed(first, TraceFailure::kPeerLost);
  recorder->mark_failed(first, TraceFailure::kOther);
  recorder->mark_completed(first);  // a failure stays one
  EXPECT_EQ(recorder->failure_of(1), TraceFailure::kPeerLost);
  EXPECT_EQ(recorder->entries()[0].state, TraceState::kFailed);
}

TEST(FlightRecorderUnit, TheInnermostLabelNamesTheCallAndLongNamesAreCut) {
  FlightRecorder recorder(4, "0", {0}, 0);
  {
    ddp::detail::TraceLabel outer("save_checkpoint");
    {
      ddp::detail::TraceLabel inner("DistributedDataParallel gradient bucket");
      recorder.open("all_reduce", ddp::detail::TraceLabel::current());
    }
    recorder.open("barrier", ddp::detail::TraceLabel::current());
  }
  recorder.open(std::string(100, 'x'), ddp::detail::TraceLabel::current());
  const auto entries = recorder.entries();
  EXPECT_STREQ(entries[0].call, "DistributedDataParallel gradient bucket");
  EXPECT_STREQ(entries[1].call, "save_checkpoint");
  EXPECT_EQ(entries[2].call, nullptr);
  EXPECT_EQ(std::string(entries[2].operation),
            std::string(ddp::detail::TraceEntry::kNameLength - 1, 'x'));
}

TEST(FlightRecorderUnit, AnOptionGivenWinsOverTheEnvironmentWhichWinsOverTheDefault) {
  using ddp::detail::resolve_trace_buffer;
  using ddp::detail::resolve_trace_dir;
  EXPECT_EQ(resolve_trace_buffer(-1, nullptr), 2000u);
  EXPECT_EQ(resolve_trace_buffer(-1, ""), 2000u);
  EXPECT_EQ(resolve_trace_buffer(-1, "17"), 17u);
  EXPECT_EQ(resolve_trace_buffer(-1, "0"), 0u);  // off
  EXPECT_EQ(resolve_trace_buffer(5, "17"), 5u);
  EXPECT_EQ(resolve_trace_buffer(0, "17"), 0u);
  EXPECT_EQ(resolve_trace_buffer(64, nullptr), 64u);
  EXPECT_THROW(resolve_trace_buffer(-1, "many"), ddp::InvalidArgumentError);
  EXPECT_THROW(resolve_trace_buffer(-1, "-3"), ddp::InvalidArgumentError);
  EXPECT_THROW(resolve_trace_buffer(-2, nullptr), ddp::InvalidArgumentError);
  EXPECT_EQ(resolve_trace_dir("/a", "/b"), "/a");
  EXPECT_EQ(resolve_trace_dir("", "/b"), "/b");
  EXPECT_EQ(resolve_trace_dir("", nullptr), "");
}

TEST(FlightRecorderUnit, ABackendsNameIsKeptOnceAndOutlivesTheStringItCameFrom) {
  using ddp::detail::lasting_backend_name;
  EXPECT_STREQ(lasting_backend_name("shm"), "shm");
  EXPECT_EQ(lasting_backend_name(std::string("nccl")), lasting_backend_name("nccl"));
  const char* other = nullptr;
  {
    std::string made_here = "a backend added later";
    other = lasting_backend_name(made_here);
    made_here.assign(made_here.size(), 'x');
  }
  EXPECT_STREQ(other, "a backend added later");
  EXPECT_EQ(lasting_backend_name("a backend added later"), other);
}

TEST(FlightRecorderUnit, TheDumpIsJsonThatDdprunReadsBack) {
  auto recorder = std::make_shared<FlightRecorder>(8, "3", std::vector<int>{1, 2}, 2);
  recorder->open("all_reduce", "a \"quoted\"\nlabel");
  ddp::detail::TraceTensor tensor;
  tensor.dtype = 6;  // Float
  tensor.numel = 12;
  tensor.dims = 2;
  tensor.sizes[0] = 3;
  tensor.sizes[1] = 4;
  auto slot = slot_of(recorder, 1);
  slot.tensor = tensor;
  slot.backend = ddp::detail::lasting_backend_name("gloo");
  slot.changed = true;
  recorder->mark_failed(slot, TraceFailure::kMismatch);
  ddp::detail::TraceSettings settings;
  settings.rank = 2;
  settings.world_size = 3;
  settings.buffer = 8;
  const std::string text = ddp::detail::flight_records_json({recorder}, settings, "why\tnot");
  std::string error;
  auto json = ddprun::ParseJson(text, &error);
  ASSERT_TRUE(json.has_value()) << error << "\n" << text;
  EXPECT_EQ((*json)["rank"].as_int(), 2);
  EXPECT_EQ((*json)["reason"].as_string(), "why\tnot");
  const auto& group = (*json)["groups"].items.at(0);
  EXPECT_EQ(group["group"].as_string(), "3");
  EXPECT_EQ(group["ranks"].items.at(1).as_int(), 2);
  const auto& entry = group["entries"].items.at(0);
  EXPECT_EQ(entry["seq"].as_int(), 1);
  EXPECT_EQ(entry["call"].as_string(), "a \"quoted\"\nlabel");
  EXPECT_EQ(entry["dtype"].as_string(), "Float");
  EXPECT_EQ(entry["numel"].as_int(), 12);
  EXPECT_EQ(entry["shape"].items.at(1).as_int(), 4);
  EXPECT_EQ(entry["backend"].as_string(), "gloo");
  EXPECT_EQ(entry["state"].as_string(), "failed");
  EXPECT_EQ(entry["error"].as_string(), "MismatchError");
}

// Records as the library writes them, for ranks whose rings kept different windows.
void write_record(const std::string& dir, int rank, int64_t first, int64_t last,
                  int64_t completed_up_to, const char* last_op = "all_reduce") {
  std::ofstream out(dir + "/rank" + std::to_string(rank) + ".json");
  out << "{\"rank\":" << rank
      << ",\"reason\":\"test\",\"groups\":[{\"group\":\"0\",\"ranks\":[0,1,2],"
      << "\"entries\":[";
  for (int64_t seq = first; seq <= last; ++seq) {
    out << (seq > first ? "," : "") << "{\"seq\":" << seq << ",\"op\":\""
        << (seq == last ? last_op : "all_reduce")
        << "\",\"call\":\"all_reduce\",\"dtype\":\"Float\",\"numel\":4,\"state\":\""
        << (seq <= completed_up_to ? "completed" : "started") << "\"}";
  }
  out << "]}]}";
}

TEST(FlightRecorderUnit, DdprunComparesOnlyTheNumbersEveryRingStillHoldsAndNamesMissingRanks) {
  const std::string dir = ddp::testing::fresh_path("records");
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  write_record(dir, 0, 2001, 4000, 3999);               // wrapped: holds 2001..4000
  write_record(dir, 1, 1990, 3989, 3989);               // wrapped earlier, never entered 3990
  const auto diagnosis = ddprun::AnalyzeTraceDir(dir);  // rank 2: no file
  ASSERT_EQ(diagnosis.groups.size(), 1u);
  const auto& group = diagnosis.groups[0];
  EXPECT_EQ(group.first_difference, 3990);
  EXPECT_EQ(group.never_entered, std::vector<int>{1});
  EXPECT_EQ(group.entered_expected, std::vector<int>{0});
  EXPECT_EQ(group.without_record, std::vector<int>{2});
  EXPECT_EQ(group.members[0].last_completed, 3999);
  EXPECT_EQ(group.members[0].current.seq, 4000);
  EXPECT_FALSE(group.members[1].has_current);
  EXPECT_NE(diagnosis.Summary().find("rank 2 left no record"), std::string::npos)
      << diagnosis.Summary();
}

}  // namespace
