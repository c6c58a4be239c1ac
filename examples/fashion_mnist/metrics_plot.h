// Per-epoch metrics of the example: appended to a CSV file, and drawn as an SVG line chart (loss
// and test accuracy against the epoch) that the program writes itself, with no plotting library.
#pragma once

#include <string>
#include <vector>

namespace fashion_mnist {

struct EpochMetrics {
  int epoch = 0;
  double train_loss = 0;
  double test_accuracy = 0;
  double samples_per_second = 0;
  double seconds = 0;
};

void write_csv(const std::string& path, const std::vector<EpochMetrics>& epochs);
void write_svg_plot(const std::string& path, const std::vector<EpochMetrics>& epochs);

}  // namespace fashion_mnist
