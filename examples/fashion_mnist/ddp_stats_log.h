// DDP's own statistics in the example (model.stats(), include/ddp/ddp_stats.h): one line per
// epoch on rank 0, and with --stats-csv one CSV row per step, also written by rank 0 only (its own
// measurements: other ranks wait for each other at different moments, so theirs differ a little).
#pragma once

#include <ddp/ddp_stats.h>

#include <cstdint>
#include <fstream>
#include <string>

namespace fashion_mnist {

/// "ddp stats, epoch 1 (rank 0, mean of 938 steps): forward 2.1 ms, ..." without a newline.
std::string describe_epoch_stats(int epoch, const ddp::DDPStats& stats);

/// One row per step: epoch, step (counted over the run, from 1), then the step's numbers.
/// A run that resumes appends to the file (the header only where it is empty); otherwise the file
/// is rewritten.
class StatsCsv {
 public:
  StatsCsv(const std::string& path, bool append);
  void add(int epoch, int64_t step, const ddp::DDPStepStats& stats);

 private:
  std::ofstream out_;
};

}  // namespace fashion_mnist
