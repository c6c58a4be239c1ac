#include "training_history.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <stdexcept>

#include "svg_chart.h"

namespace fashion_mnist {
namespace {

constexpr size_t kEpochFields = TrainingHistory::kEpochFields;
constexpr size_t kLossFields = TrainingHistory::kLossFields;

// Writes through a temporary file and a rename: a run killed while writing leaves the previous
// file whole, never half of a new one.
template <typename WriteBody>
void write_file(const std::string& path, WriteBody body) {
  const std::string temporary = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(temporary);
    if (!out) throw std::runtime_error("cannot write " + temporary);
    out.precision(9);
    body(out);
    if (!out.flush()) throw std::runtime_error("cannot write " + temporary);
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    std::remove(temporary.c_str());
    throw std::runtime_error("cannot rename " + temporary + " to " + path);
  }
}

}  // namespace

std::vector<double> TrainingHistory::epoch_rows() const {
  std::vector<double> rows;
  for (const EpochMetrics& e : epochs) {
    rows.insert(rows.end(),
                {double(e.epoch), e.train_loss, e.test_accuracy, e.samples_per_second, e.seconds});
  }
  return rows;
}

std::vector<double> TrainingHistory::loss_rows() const {
  std::vector<double> rows;
  for (const LossPoint& p : losses) rows.insert(rows.end(), {double(p.step), p.epoch, p.loss});
  return rows;
}

TrainingHistory TrainingHistory::from_rows(const std::vector<double>& epoch_rows,
                                           const std::vector<double>& loss_rows) {
  if (epoch_rows.size() % kEpochFields != 0 || loss_rows.size() % kLossFields != 0) {
    throw std::runtime_error("the checkpoint's training history has rows of the wrong length");
  }
  TrainingHistory history;
  for (size_t i = 0; i < epoch_rows.size(); i += kEpochFields) {
    history.epochs.push_back({static_cast<int>(epoch_rows[i]), epoch_rows[i + 1], epoch_rows[i + 2],
                              epoch_rows[i + 3], epoch_rows[i + 4]});
  }
  for (size_t i = 0; i < loss_rows.size(); i += kLossFields) {
    history.losses.push_back(
        {static_cast<int64_t>(loss_rows[i]), loss_rows[i + 1], loss_rows[i + 2]});
  }
  return history;
}

void write_epochs_csv(const std::string& path, const TrainingHistory& history) {
  write_file(path, [&](std::ostream& out) {
    out << "epoch,train_loss,test_accuracy,samples_per_second,seconds\n";
    for (const EpochMetrics& e : history.epochs) {
      out << e.epoch << ',' << e.train_loss << ',' << e.test_accuracy << ',' << e.samples_per_second
          << ',' << e.seconds << '\n';
    }
  });
}

void write_losses_csv(const std::string& path, const TrainingHistory& history) {
  write_file(path, [&](std::ostream& out) {
    out << "step,epoch,loss\n";
    for (const LossPoint& p : history.losses) {
      out << p.step << ',' << p.epoch << ',' << p.loss << '\n';
    }
  });
}

void write_plot(const std::string& path, const TrainingHistory& history) {
  const double last_epoch = history.epochs.empty() ? 1 : history.epochs.back().epoch;
  Chart loss{"training loss", "epoch", "cross-entropy loss", {}, 0, last_epoch};
  Series every{"", "#1f77b4", {}, true, false};
  Series means{"epoch mean", "#ff7f0e", {}, false, true};
  if (!history.losses.empty()) {
    const LossPoint& first = history.losses.front();
    every.label = "mean of every " + std::to_string(first.step) + " steps";
  }
  for (const LossPoint& p : history.losses) every.points.emplace_back(p.epoch, p.loss);
  for (const EpochMetrics& e : history.epochs) means.points.emplace_back(e.epoch, e.train_loss);
  loss.series = {every, means};

  char title[64] = "test accuracy";
  if (!history.epochs.empty()) {
    std::snprintf(title, sizeof(title), "test accuracy (last %.4f)",
                  history.epochs.back().test_accuracy);
  }
  Chart accuracy{title, "epoch", "accuracy on the test set", {}, 0, last_epoch};
  Series test{"", "#2ca02c", {}, true, true};
  for (const EpochMetrics& e : history.epochs) test.points.emplace_back(e.epoch, e.test_accuracy);
  accuracy.series = {test};
  write_file(path, [&](std::ostream& out) { out << svg_page({loss, accuracy}); });
}

}  // namespace fashion_mnist
