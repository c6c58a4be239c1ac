#include "reducer/step_stats.h"

namespace ddp::detail {
namespace {

double ms_between(StepStatsRecorder::Clock::time_point from,
                  StepStatsRecorder::Clock::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

}  // namespace

void StepStatsRecorder::forward_started() {
  const auto now = Clock::now();
  std::lock_guard<std::mutex> lock(mutex_);
  forward_start_ = now;
  launched_ = false;
  bytes_ = 0;
  buckets_ = 0;
}

void StepStatsRecorder::forward_ended() {
  const auto now = Clock::now();
  std::lock_guard<std::mutex> lock(mutex_);
  forward_end_ = now;
}

void StepStatsRecorder::gradients_ready() {
  const auto now = Clock::now();
  std::lock_guard<std::mutex> lock(mutex_);
  gradients_ready_ = now;
}

void StepStatsRecorder::bucket_launched(int64_t bytes) {
  const auto now = Clock::now();
  std::lock_guard<std::mutex> lock(mutex_);
  if (!launched_) first_launch_ = now;
  launched_ = true;
  bytes_ += bytes;
  ++buckets_;
}

void StepStatsRecorder::backward_finished(int64_t unused_parameters) {
  const auto now = Clock::now();
  std::lock_guard<std::mutex> lock(mutex_);
  DDPStepStats step;
  step.forward_ms = ms_between(forward_start_, forward_end_);
  step.backward_compute_ms = ms_between(forward_end_, gradients_ready_);
  step.exposed_communication_ms = ms_between(gradients_ready_, now);
  step.communication_ms = launched_ ? ms_between(first_launch_, now) : 0.0;
  step.bytes_reduced = bytes_;
  step.buckets_reduced = buckets_;
  step.unused_parameters = unused_parameters;
  last_ = step;
  sum_.forward_ms += step.forward_ms;
  sum_.backward_compute_ms += step.backward_compute_ms;
  sum_.exposed_communication_ms += step.exposed_communication_ms;
  sum_.communication_ms += step.communication_ms;
  sum_.bytes_reduced += step.bytes_reduced;
  sum_.buckets_reduced += step.buckets_reduced;
  sum_.unused_parameters += step.unused_parameters;
  ++steps_;
  launched_ = false;
  bytes_ = 0;
  buckets_ = 0;
}

void StepStatsRecorder::fill(DDPStats& stats) const {
  std::lock_guard<std::mutex> lock(mutex_);
  stats.last_step = last_;
  stats.steps = steps_;
  stats.total_bytes_reduced = sum_.bytes_reduced;
  stats.average = DDPStepStats();
  if (steps_ == 0) return;
  const double n = static_cast<double>(steps_);
  stats.average.forward_ms = sum_.forward_ms / n;
  stats.average.backward_compute_ms = sum_.backward_compute_ms / n;
  stats.average.exposed_communication_ms = sum_.exposed_communication_ms / n;
  stats.average.communication_ms = sum_.communication_ms / n;
  stats.average.bytes_reduced = sum_.bytes_reduced / steps_;
  stats.average.buckets_reduced = sum_.buckets_reduced / steps_;
  stats.average.unused_parameters = sum_.unused_parameters / steps_;
}

void StepStatsRecorder::reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  last_ = DDPStepStats();
  sum_ = DDPStepStats();
  steps_ = 0;
}

}  // namespace ddp::detail
