// What the example records while it trains: the mean training loss every few steps and, per
// epoch, the loss, test accuracy and speed. The history is saved inside each checkpoint, so that
// a resumed run continues the same CSV files and the same curves instead of starting them over.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fashion_mnist {

struct EpochMetrics {
  int epoch = 0;  // from 1
  double train_loss = 0;
  double test_accuracy = 0;
  double samples_per_second = 0;
  double seconds = 0;
};

struct LossPoint {
  int64_t step = 0;  // global step, from 1, counted across epochs
  double epoch = 0;  // where that step falls, in epochs (1.5: half-way through the second)
  double loss = 0;   // the mean over the steps since the previous point, and over the ranks
};

struct TrainingHistory {
  std::vector<EpochMetrics> epochs;
  std::vector<LossPoint> losses;

  // Flat rows of doubles, kEpochFields per epoch and kLossFields per loss point: the form kept
  // in checkpoints.
  static constexpr int kEpochFields = 5;
  static constexpr int kLossFields = 3;
  std::vector<double> epoch_rows() const;
  std::vector<double> loss_rows() const;
  static TrainingHistory from_rows(const std::vector<double>& epoch_rows,
                                   const std::vector<double>& loss_rows);
};

/// epoch,train_loss,test_accuracy,samples_per_second,seconds (one row per epoch).
void write_epochs_csv(const std::string& path, const TrainingHistory& history);
/// step,epoch,loss (one row per loss point).
void write_losses_csv(const std::string& path, const TrainingHistory& history);
/// Two charts side by side: the training loss against the epoch (every point and the epoch
/// means) and the test accuracy per epoch, each on a range that fits its data.
void write_plot(const std::string& path, const TrainingHistory& history);

}  // namespace fashion_mnist
