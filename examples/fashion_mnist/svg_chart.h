// A small SVG line-chart writer for the example's training curves, with no plotting library:
// axes whose range fits the data, ticks at round values (1, 2 or 5 times a power of ten) with
// labels precise enough to tell them apart, a light grid, a legend, titled axes.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace fashion_mnist {

struct Series {
  std::string label;
  std::string color;                              // any SVG colour
  std::vector<std::pair<double, double>> points;  // (x, y), in x order
  bool line = true;                               // joined by a polyline
  bool markers = false;                           // a dot on each point
};

struct Chart {
  std::string title;
  std::string x_label;
  std::string y_label;
  std::vector<Series> series;
  // Forced axis ranges; where lo >= hi the range is taken from the data.
  double x_lo = 0, x_hi = 0;
};

/// Round tick values covering [lo, hi]: about `target` of them, a step of 1, 2 or 5 times a power
/// of ten, the first at or below lo and the last at or above hi (so the axis ends on a tick).
std::vector<double> nice_ticks(double lo, double hi, int target = 5);

/// A tick label with as many decimals as the step between ticks needs (0.005 -> 3), no more.
std::string tick_label(double value, double step);

/// One chart as an SVG group, drawn in the box (left, top, width, height) of the page.
std::string svg_chart(const Chart& chart, double left, double top, double width, double height);

/// A whole SVG document of charts side by side, each `width` x `height`.
std::string svg_page(const std::vector<Chart>& charts, double width = 440, double height = 300);

}  // namespace fashion_mnist
