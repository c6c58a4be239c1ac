// Training progress on rank 0: a live bar (epoch, step/total, loss, samples/s, ETA) when stdout is
// a terminal, plain lines about every 10% of an epoch otherwise (logs, ddprun's prefixed pipes).
#pragma once

#include <chrono>

namespace fashion_mnist {

class Progress {
 public:
  Progress(int epoch, int epochs, int steps, int global_batch, bool enabled);
  void update(int step, double loss);  // step counts from 1
  void finish();

 private:
  int epoch_, epochs_, steps_, global_batch_;
  bool enabled_, terminal_;
  int last_printed_ = 0;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace fashion_mnist
