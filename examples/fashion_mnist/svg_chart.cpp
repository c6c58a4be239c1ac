#include "svg_chart.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

namespace fashion_mnist {
namespace {

// Space for the tick labels left of the plot and below it, and for the title above.
constexpr double kLeft = 64, kRight = 16, kTop = 36, kBottom = 46;

std::string escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else if (c == '&')
      out += "&amp;";
    else
      out += c;
  }
  return out;
}

double step_of(const std::vector<double>& ticks) {
  return ticks.size() > 1 ? ticks[1] - ticks[0] : 1.0;
}

}  // namespace

std::vector<double> nice_ticks(double lo, double hi, int target) {
  if (!std::isfinite(lo) || !std::isfinite(hi)) return {0, 1};
  if (hi < lo) std::swap(lo, hi);
  if (hi - lo < 1e-12 * std::max(1.0, std::fabs(hi))) {
    // One value: a small range around it, so that the point sits inside the axis.
    const double pad = lo != 0 ? std::fabs(lo) * 0.01 : 0.01;
    lo -= pad;
    hi += pad;
  }
  const double raw = (hi - lo) / std::max(1, target);
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  double step = magnitude * 10;
  for (double factor : {1.0, 2.0, 5.0}) {
    if (magnitude * factor >= raw) {
      step = magnitude * factor;
      break;
    }
  }
  const double first = std::floor(lo / step + 1e-9) * step;
  const double last = std::ceil(hi / step - 1e-9) * step;
  std::vector<double> ticks;
  for (long i = 0; first + i * step <= last + step * 1e-6; ++i) {
    double value = first + i * step;
    if (std::fabs(value) < step * 1e-9) value = 0;  // no "-0"
    ticks.push_back(value);
  }
  return ticks;
}

std::string tick_label(double value, double step) {
  const int decimals = std::max(0, static_cast<int>(std::ceil(-std::log10(step) - 1e-9)));
  char text[64];
  std::snprintf(text, sizeof(text), "%.*f", decimals, value);
  return text;
}

std::string svg_chart(const Chart& chart, double left, double top, double width, double height) {
  double x_lo = std::numeric_limits<double>::infinity(), x_hi = -x_lo;
  double y_lo = x_lo, y_hi = -x_lo;
  for (const Series& series : chart.series) {
    for (const auto& [x, y] : series.points) {
      x_lo = std::min(x_lo, x);
      x_hi = std::max(x_hi, x);
      y_lo = std::min(y_lo, y);
      y_hi = std::max(y_hi, y);
    }
  }
  if (chart.x_lo < chart.x_hi) {
    x_lo = chart.x_lo;
    x_hi = chart.x_hi;
  }
  if (!std::isfinite(x_lo)) x_lo = 0, x_hi = 1, y_lo = 0, y_hi = 1;  // no data yet
  const std::vector<double> x_ticks = nice_ticks(x_lo, x_hi, 6);
  const std::vector<double> y_ticks = nice_ticks(y_lo, y_hi, 5);
  const double x0 = left + kLeft, x1 = left + width - kRight;
  const double y0 = top + height - kBottom, y1 = top + kTop;  // y0: the bottom of the plot
  auto px = [&](double x) {
    return x0 + (x - x_ticks.front()) / (x_ticks.back() - x_ticks.front()) * (x1 - x0);
  };
  auto py = [&](double y) {
    return y0 - (y - y_ticks.front()) / (y_ticks.back() - y_ticks.front()) * (y0 - y1);
  };

  std::ostringstream svg;
  svg.precision(6);
  svg << "<g font-family='sans-serif' font-size='12'>\n";
  svg << "<text x='" << (x0 + x1) / 2 << "' y='" << top + 20
      << "' text-anchor='middle' font-size='15'>" << escape(chart.title) << "</text>\n";
  for (double tick : y_ticks) {
    svg << "<line x1='" << x0 << "' x2='" << x1 << "' y1='" << py(tick) << "' y2='" << py(tick)
        << "' stroke='#e4e4e4'/><text x='" << x0 - 6 << "' y='" << py(tick) + 4
        << "' text-anchor='end'>" << tick_label(tick, step_of(y_ticks)) << "</text>\n";
  }
  for (double tick : x_ticks) {
    svg << "<line x1='" << px(tick) << "' x2='" << px(tick) << "' y1='" << y1 << "' y2='" << y0
        << "' stroke='#e4e4e4'/><text x='" << px(tick) << "' y='" << y0 + 16
        << "' text-anchor='middle'>" << tick_label(tick, step_of(x_ticks)) << "</text>\n";
  }
  svg << "<rect x='" << x0 << "' y='" << y1 << "' width='" << x1 - x0 << "' height='" << y0 - y1
      << "' fill='none' stroke='#444'/>\n";
  svg << "<text x='" << (x0 + x1) / 2 << "' y='" << top + height - 8 << "' text-anchor='middle'>"
      << escape(chart.x_label) << "</text>\n";
  svg << "<text transform='translate(" << left + 14 << ',' << (y0 + y1) / 2
      << ") rotate(-90)' text-anchor='middle'>" << escape(chart.y_label) << "</text>\n";

  // The legend, top right inside the plot: as wide as its longest label (about 7 pixels a
  // character at this size), a short line or a dot in the series' colour before each.
  size_t longest = 0;
  for (const Series& series : chart.series) longest = std::max(longest, series.label.size());
  const double legend_x = x1 - 34 - 7.0 * static_cast<double>(longest);
  double legend_y = y1 + 18;
  for (const Series& series : chart.series) {
    if (series.line && series.points.size() > 1) {
      svg << "<polyline fill='none' stroke='" << series.color << "' stroke-width='1.5' points='";
      for (const auto& [x, y] : series.points) svg << px(x) << ',' << py(y) << ' ';
      svg << "'/>\n";
    }
    if (series.markers || series.points.size() == 1) {
      for (const auto& [x, y] : series.points) {
        svg << "<circle cx='" << px(x) << "' cy='" << py(y) << "' r='3.5' fill='" << series.color
            << "'/>\n";
      }
    }
    if (series.label.empty()) continue;
    if (series.line) {
      svg << "<line x1='" << legend_x << "' x2='" << legend_x + 20 << "' y1='" << legend_y - 4
          << "' y2='" << legend_y - 4 << "' stroke='" << series.color << "' stroke-width='2'/>";
    } else {
      svg << "<circle cx='" << legend_x + 10 << "' cy='" << legend_y - 4 << "' r='3.5' fill='"
          << series.color << "'/>";
    }
    svg << "<text x='" << legend_x + 26 << "' y='" << legend_y << "'>" << escape(series.label)
        << "</text>\n";
    legend_y += 16;
  }
  svg << "</g>\n";
  return svg.str();
}

std::string svg_page(const std::vector<Chart>& charts, double width, double height) {
  std::ostringstream svg;
  svg << "<svg xmlns='http://www.w3.org/2000/svg' width='" << width * charts.size() << "' height='"
      << height << "'>\n<rect width='100%' height='100%' fill='white'/>\n";
  for (size_t i = 0; i < charts.size(); ++i)
    svg << svg_chart(charts[i], i * width, 0, width, height);
  svg << "</svg>\n";
  return svg.str();
}

}  // namespace fashion_mnist
