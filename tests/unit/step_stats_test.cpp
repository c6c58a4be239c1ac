// StepStatsRecorder: the phases of a step follow each other, the means are over the steps
// counted, reset starts them anew, and a step counts only once backward has finished.
#include "reducer/step_stats.h"

#include <gtest/gtest.h>

#include <thread>

using ddp::detail::StepStatsRecorder;

namespace {

void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

// One step with a forward of at least 2 ms, a backward compute of at least 3 ms and 4 ms from the
// last gradient to the end; `buckets` buckets of `bytes` each.
void run_step(StepStatsRecorder& recorder, int buckets, int64_t bytes) {
  recorder.forward_started();
  sleep_ms(2);
  recorder.forward_ended();
  sleep_ms(3);
  for (int i = 0; i + 1 < buckets; ++i) recorder.bucket_launched(bytes);
  recorder.gradients_ready();
  recorder.bucket_launched(bytes);
  sleep_ms(4);
  recorder.backward_finished(/*unused_parameters=*/1);
}

}  // namespace

TEST(StepStatsRecorder, PhasesFollowEachOtherAndMeansAreOverTheStepsCounted) {
  StepStatsRecorder recorder;
  ddp::DDPStats stats;
  recorder.fill(stats);
  EXPECT_EQ(stats.steps, 0);
  EXPECT_EQ(stats.average.forward_ms, 0);

  std::vector<ddp::DDPStepStats> steps;
  for (int i = 0; i < 3; ++i) {
    run_step(recorder, /*buckets=*/i + 1, /*bytes=*/100);
    recorder.fill(stats);
    steps.push_back(stats.last_step);
    EXPECT_GE(stats.last_step.forward_ms, 2);
    EXPECT_GE(stats.last_step.backward_compute_ms, 3);
    EXPECT_GE(stats.last_step.exposed_communication_ms, 4);
    // From the first bucket handed over: before the last gradient was ready when there are two.
    if (i > 0) {
      EXPECT_GE(stats.last_step.communication_ms, stats.last_step.exposed_communication_ms);
    } else {
      EXPECT_LE(stats.last_step.communication_ms, stats.last_step.exposed_communication_ms);
    }
    EXPECT_EQ(stats.last_step.bytes_reduced, 100 * (i + 1));
    EXPECT_EQ(stats.last_step.buckets_reduced, i + 1);
    EXPECT_EQ(stats.last_step.unused_parameters, 1);
  }
  EXPECT_EQ(stats.steps, 3);
  EXPECT_EQ(stats.total_bytes_reduced, 600);
  EXPECT_EQ(stats.average.bytes_reduced, 200);
  EXPECT_EQ(stats.average.buckets_reduced, 2);
  EXPECT_DOUBLE_EQ(stats.average.forward_ms,
                   (steps[0].forward_ms + steps[1].forward_ms + steps[2].forward_ms) / 3);
  EXPECT_DOUBLE_EQ(stats.average.exposed_communication_ms,
                   (steps[0].exposed_communication_ms + steps[1].exposed_communication_ms +
                    steps[2].exposed_communication_ms) /
                       3);

  // A forward whose backward never finished is not a step.
  recorder.forward_started();
  recorder.forward_ended();
  recorder.fill(stats);
  EXPECT_EQ(stats.steps, 3);
  EXPECT_EQ(stats.last_step.bytes_reduced, 300);

  recorder.reset();
  recorder.fill(stats);
  EXPECT_EQ(stats.steps, 0);
  EXPECT_EQ(stats.total_bytes_reduced, 0);
  EXPECT_EQ(stats.last_step.bytes_reduced, 0);
  run_step(recorder, 2, 50);
  recorder.fill(stats);
  EXPECT_EQ(stats.steps, 1);
  EXPECT_EQ(stats.last_step.bytes_reduced, 100);
}
