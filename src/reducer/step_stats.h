// StepStatsRecorder: the instants of DDP's steps, turned into include/ddp/ddp_stats.h's numbers.
//
// DDPCore marks the forward's start and end; the reducer marks the moment the last parameter's
// gradient is ready, each bucket it hands to the process group (with its bytes), and the end of
// its work in backward, which closes the step. Marks are steady_clock reads under an uncontended
// mutex: a few per step and one per bucket, no allocation, no synchronization with a device.
//
// Thread-safety: every member function may be called from any thread. The forward's marks come
// from the training thread, the others from the autograd thread; snapshot() and reset() from the
// training thread between steps.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>

#include "ddp/ddp_stats.h"

namespace ddp::detail {

class StepStatsRecorder {
 public:
  using Clock = std::chrono::steady_clock;

  void forward_started();
  void forward_ended();
  /// The last parameter's gradient is ready: backward's compute is over for DDP.
  void gradients_ready();
  void bucket_launched(int64_t bytes);
  /// The reducer handed the averages to .grad: the step is complete and counted.
  void backward_finished(int64_t unused_parameters);

  /// last_step, average, steps and total_bytes_reduced; the rest of DDPStats is left as it is.
  void fill(DDPStats& stats) const;
  /// Forgets the steps counted so far (not a step in progress).
  void reset();

 private:
  mutable std::mutex mutex_;
  // The step in progress.
  Clock::time_point forward_start_, forward_end_, gradients_ready_, first_launch_;
  bool launched_ = false;
  int64_t bytes_ = 0;
  int64_t buckets_ = 0;
  // The steps counted.
  DDPStepStats last_;
  DDPStepStats sum_;
  int64_t steps_ = 0;
};

}  // namespace ddp::detail
