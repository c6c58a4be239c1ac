// Training progress on rank 0. On a terminal (stdout a terminal, or ddprun's DDPRUN_STDOUT_TTY=1:
// ddprun keeps the bar at the bottom of its terminal, below the other ranks' lines) a bar redrawn
// in place at most 10 times a second: epoch, steps, mean loss, images/s and the epoch's ETA.
// Otherwise (logs, pipes) a plain line about every 10% of an epoch.
#pragma once

#include <chrono>

namespace fashion_mnist {

class Progress {
 public:
  Progress(int epoch, int epochs, int steps, int global_batch, bool enabled);
  void update(int step, double loss);  // step counts from 1
  void finish();

 private:
  using Clock = std::chrono::steady_clock;
  int epoch_, epochs_, steps_, global_batch_;
  bool enabled_, terminal_;
  int last_printed_ = 0;
  Clock::time_point start_, last_drawn_;
};

}  // namespace fashion_mnist
