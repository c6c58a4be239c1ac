// The timeline (trace/timeline.h) of a 2-rank DDP run, merged as ddprun merges it: one process
// per rank, exactly K x B bucket all-reduces per rank for K steps of B buckets, each inside its
// backward, events nested and in time order on every row, the collectives the buckets issued,
// the user's marks and a checkpoint save; a rank whose file was cut short still merges.
#include "trace/timeline.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <torch/torch.h>

#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "ddp/ddp.h"
#include "support/multiprocess.h"
// ddprun's merge and reader, by path: see tools/ddprun/CMakeLists.txt.
#include "../../tools/ddprun/json_value.h"
#include "../../tools/ddprun/timeline_merge.h"

using ddp::testing::fresh_path;
using ddp::testing::run_ranks_ok;
using ddprun::JsonValue;

namespace {

constexpr int kSteps = 4;
constexpr int kLayers = 3;
constexpr int kBuckets = 2 * kLayers;  // a bucket per parameter: caps below any parameter's size

std::string fresh_folder() {
  const std::string dir = fresh_path("timeline");
  EXPECT_EQ(::mkdir(dir.c_str(), 0700), 0);
  return dir;
}

// K steps of DDP on 2 ranks with a bucket per parameter, a mark per step and a checkpoint save.
void train(const std::string& backend, const std::string& dir, int rank) {
  // Across hosts: each rank poses as a host of its own, so that the buckets cross between leaders.
  if (backend == "hierarchical") ::setenv("DDP_CPP_HOST_ID", rank == 0 ? "a" : "b", 1);
  ddp::init_process_group(ddp::InitOptions().backend(backend).timeline_path(dir));
  torch::manual_seed(0);
  auto net = torch::nn::Sequential();
  for (int i = 0; i < kLayers; ++i) net->push_back(torch::nn::Linear(16, 16));
  ddp::DistributedDataParallel model(
      net, ddp::DDPOptions().bucket_cap_mb(1e-6).first_bucket_cap_mb(1e-6));
  torch::optim::SGD optimizer(net->parameters(), 0.1);
  for (int step = 0; step < kSteps; ++step) {
    ddp::timeline::mark("step");
    optimizer.zero_grad();
    model(torch::randn({8, 16}) + rank).sum().backward();
    optimizer.step();
  }
  ddp::save_checkpoint(dir + "/checkpoint.pt", *net);
  ddp::destroy_process_group();
}

JsonValue merged_events(const std::string& dir) {
  const ddprun::MergedTimeline merged = ddprun::MergeTimeline(dir);
  EXPECT_EQ(merged.path, dir + "/timeline.json") << merged.Summary();
  EXPECT_TRUE(merged.problems.empty()) << merged.Summary();
  std::ifstream file(dir + "/timeline.json");
  std::stringstream text;
  text << file.rdbuf();
  std::string error;
  auto json = ddprun::ParseJson(text.str(), &error);
  EXPECT_TRUE(json.has_value()) << error;
  return json ? (*json)["traceEvents"] : JsonValue();
}

struct Span {
  int64_t start = 0;
  int64_t end = 0;
};

void expect_nested_and_ordered(const std::vector<const JsonValue*>& row, const std::string& what) {
  std::vector<int64_t> open_ends;
  int64_t previous = INT64_MIN;
  for (const JsonValue* event : row) {
    const int64_t start = (*event)["ts"].as_int();
    const int64_t end = start + (*event)["dur"].as_int();
    EXPECT_GE(start, previous) << what << ": " << (*event)["name"].as_string() << " out of order";
    previous = start;
    while (!open_ends.empty() && open_ends.back() <= start) open_ends.pop_back();
    if (!open_ends.empty()) {
      EXPECT_LE(end, open_ends.back())
          << what << ": " << (*event)["name"].as_string() << " overlaps the event around it";
    }
    open_ends.push_back(end);
  }
}

void check_two_rank_timeline(const std::string& backend) {
  SCOPED_TRACE(backend);
  const std::string dir = fresh_folder();
  run_ranks_ok(2, [&](int rank) { train(backend, dir, rank); });
  const JsonValue events = merged_events(dir);
  ASSERT_FALSE(events.items.empty());

  std::map<int64_t, std::string> process_names;
  std::map<std::pair<int64_t, int64_t>, std::vector<const JsonValue*>> rows;  // X events
  std::map<int64_t, std::vector<Span>> backwards;
  std::map<int64_t, std::vector<Span>> bucket_reductions;
  std::map<int64_t, std::set<int64_t>> bucket_rows;
  std::map<int64_t, int> forwards, marks, saves, bucket_collectives;
  for (const JsonValue& event : events.items) {
    const std::string phase = event["ph"].as_string();
    const std::string name = event["name"].as_string();
    const int64_t pid = event["pid"].as_int(-1);
    if (phase == "M" && name == "process_name") process_names[pid] = event["args"]["name"].text;
    if (phase == "i" && name == "step") ++marks[pid];
    if (phase == "b" && name == "all_reduce" &&
        event["args"]["call"].as_string() == "DistributedDataParallel gradient bucket") {
      ++bucket_collectives[pid];  // the bucket's own collective (its step check is another)
      EXPECT_EQ(event["args"]["backend"].as_string(), backend);
    }
    if (phase != "X") continue;
    rows[{pid, event["tid"].as_int()}].push_back(&event);
    const Span span{event["ts"].as_int(), event["ts"].as_int() + event["dur"].as_int()};
    if (name == "DistributedDataParallel forward") ++forwards[pid];
    if (name == "DistributedDataParallel backward") backwards[pid].push_back(span);
    if (name == "save_checkpoint") ++saves[pid];
    if (name == "all-reduce" && event["cat"].as_string() == "ddp") {
      bucket_reductions[pid].push_back(span);
      bucket_rows[pid].insert(event["tid"].as_int());
    }
  }
  EXPECT_EQ(process_names, (std::map<int64_t, std::string>{{0, "rank 0"}, {1, "rank 1"}}));
  for (int64_t pid : {0, 1}) {
    SCOPED_TRACE("rank " + std::to_string(pid));
    EXPECT_EQ(forwards[pid], kSteps);
    EXPECT_EQ(backwards[pid].size(), static_cast<size_t>(kSteps));
    EXPECT_EQ(bucket_reductions[pid].size(), static_cast<size_t>(kSteps * kBuckets));
    EXPECT_EQ(bucket_rows[pid].size(), static_cast<size_t>(kBuckets));
    EXPECT_EQ(bucket_collectives[pid], kSteps * kBuckets);
    EXPECT_EQ(marks[pid], kSteps);
    EXPECT_EQ(saves[pid], 1);
    for (const Span& reduction : bucket_reductions[pid]) {
      bool inside = false;
      for (const Span& backward : backwards[pid]) {
        inside = inside || (backward.start <= reduction.start && reduction.end <= backward.end);
      }
      EXPECT_TRUE(inside) << "a bucket all-reduce [" << reduction.start << ", " << reduction.end
                          << "] outside every backward";
    }
  }
  for (const auto& [row, spans] : rows) {
    expect_nested_and_ordered(
        spans, "rank " + std::to_string(row.first) + " row " + std::to_string(row.second));
  }
}

}  // namespace

TEST(Timeline, ATwoRankDdpRunHoldsEveryBucketAllReduceOncePerStepInsideItsBackwardOnShm) {
  check_two_rank_timeline("shm");
}

TEST(Timeline, ATwoRankDdpRunHoldsEveryBucketAllReduceOncePerStepInsideItsBackwardOnGloo) {
  check_two_rank_timeline("gloo");
}

TEST(Timeline, ATwoRankDdpRunHoldsEveryBucketAllReduceOncePerStepInsideItsBackwardAcrossHosts) {
  check_two_rank_timeline("hierarchical");
}

TEST(Timeline, AFileCutShortByAKilledRankStillMergesAndTheCutLineIsNamed) {
  const std::string dir = fresh_folder();
  std::ofstream(dir + "/timeline_rank0.json")
      << "[\n{\"ph\":\"X\",\"name\":\"a\",\"pid\":0,\"tid\":1,\"ts\":5,\"dur\":2},\n"
         "{\"ph\":\"X\",\"name\":\"b\",\"pid\":0,\"tid\":1,\"ts\":1,\"dur\":9}\n]\n";
  std::ofstream(dir + "/timeline_rank1.json")
      << "[\n{\"ph\":\"X\",\"name\":\"c\",\"pid\":1,\"tid\":1,\"ts\":3,\"dur\":1},\n"
         "{\"ph\":\"X\",\"name\":\"d\",\"pid\":1,\"ti";
  const ddprun::MergedTimeline merged = ddprun::MergeTimeline(dir);
  EXPECT_EQ(merged.ranks, (std::vector<int>{0, 1}));
  EXPECT_EQ(merged.events, 3u);
  ASSERT_EQ(merged.problems.size(), 1u) << merged.Summary();
  EXPECT_NE(merged.problems[0].find("rank 1: line 3"), std::string::npos) << merged.problems[0];
  std::ifstream file(dir + "/timeline.json");
  std::stringstream text;
  text << file.rdbuf();
  std::string error;
  auto json = ddprun::ParseJson(text.str(), &error);
  ASSERT_TRUE(json.has_value());
  std::string names;
  for (const JsonValue& event : (*json)["traceEvents"].items) names += event["name"].text;
  EXPECT_EQ(names, "bac");  // by rank, row, then time
}

TEST(Timeline, AFolderThatCannotBeWrittenFailsInitProcessGroupNamingIt) {
  const std::string missing = fresh_path("no_such_folder");
  run_ranks_ok(1, [&](int) {
    try {
      ddp::init_process_group(ddp::InitOptions().backend("gloo").timeline_path(missing));
      ADD_FAILURE() << "init_process_group accepted a timeline folder that does not exist";
    } catch (const ddp::InvalidArgumentError& error) {
      EXPECT_NE(std::string(error.what()).find(missing), std::string::npos) << error.what();
      EXPECT_FALSE(ddp::is_initialized());
    }
  });
}
