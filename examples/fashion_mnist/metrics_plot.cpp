#include "metrics_plot.h"

#include <algorithm>
#include <fstream>
#include <sstream>

namespace fashion_mnist {

void write_csv(const std::string& path, const std::vector<EpochMetrics>& epochs) {
  std::ofstream out(path);
  out << "epoch,train_loss,test_accuracy,samples_per_second,seconds\n";
  for (const auto& e : epochs) {
    out << e.epoch << ',' << e.train_loss << ',' << e.test_accuracy << ',' << e.samples_per_second
        << ',' << e.seconds << '\n';
  }
}

void write_svg_plot(const std::string& path, const std::vector<EpochMetrics>& epochs) {
  // Two panels side by side: training loss (own scale) and test accuracy (0..1).
  constexpr double kWidth = 320, kHeight = 220, kMargin = 40;
  const double max_loss = std::max_element(epochs.begin(), epochs.end(), [](auto& a, auto& b) {
                            return a.train_loss < b.train_loss;
                          })->train_loss;
  auto x_of = [&](size_t i) {
    return kMargin +
           (epochs.size() == 1 ? 0.5 : double(i) / (epochs.size() - 1)) * (kWidth - 2 * kMargin);
  };
  auto panel = [&](double offset, const std::string& title, auto value, double top) {
    std::ostringstream svg;
    svg << "<g transform='translate(" << offset << ",0)'>"
        << "<rect x='" << kMargin << "' y='" << kMargin << "' width='" << kWidth - 2 * kMargin
        << "' height='" << kHeight - 2 * kMargin << "' fill='none' stroke='#888'/>"
        << "<text x='" << kWidth / 2 << "' y='24' text-anchor='middle' font-size='14'>" << title
        << "</text><polyline fill='none' stroke='#1f77b4' stroke-width='2' points='";
    for (size_t i = 0; i < epochs.size(); ++i) {
      double y = kHeight - kMargin - value(epochs[i]) / top * (kHeight - 2 * kMargin);
      svg << x_of(i) << ',' << y << ' ';
    }
    svg << "'/>";
    for (size_t i = 0; i < epochs.size(); ++i) {
      double y = kHeight - kMargin - value(epochs[i]) / top * (kHeight - 2 * kMargin);
      svg << "<circle cx='" << x_of(i) << "' cy='" << y << "' r='3' fill='#1f77b4'/>"
          << "<text x='" << x_of(i) << "' y='" << kHeight - 22 << "' text-anchor='middle' "
          << "font-size='11'>" << epochs[i].epoch << "</text>";
    }
    svg << "<text x='" << kMargin - 4 << "' y='" << kMargin + 4 << "' text-anchor='end' "
        << "font-size='11'>" << top << "</text><text x='" << kMargin - 4 << "' y='"
        << kHeight - kMargin << "' text-anchor='end' font-size='11'>0</text>"
        << "<text x='" << kWidth / 2 << "' y='" << kHeight - 6
        << "' text-anchor='middle' font-size='12'>epoch</text></g>";
    return svg.str();
  };
  std::ofstream out(path);
  out << "<svg xmlns='http://www.w3.org/2000/svg' width='" << 2 * kWidth << "' height='" << kHeight
      << "' font-family='sans-serif'><rect width='100%' height='100%' fill='white'/>"
      << panel(
             0, "training loss", [](const EpochMetrics& e) { return e.train_loss; },
             max_loss > 0 ? max_loss : 1)
      << panel(
             kWidth, "test accuracy", [](const EpochMetrics& e) { return e.test_accuracy; }, 1.0)
      << "</svg>\n";
}

}  // namespace fashion_mnist
