#include "line_prefixer.h"

#include <utility>

namespace ddprun {

LinePrefixer::LinePrefixer(std::string prefix, size_t tail_lines)
    : prefix_(std::move(prefix)), tail_lines_(tail_lines) {}

std::vector<std::string> LinePrefixer::Feed(std::string_view chunk) {
  std::vector<std::string> lines;
  while (!chunk.empty()) {
    size_t newline = chunk.find('\n');
    if (newline == std::string_view::npos) {
      Append(chunk);
      if (partial_.size() >= kMaxLineBytes) {
        lines.push_back(Emit(partial_));
        partial_.clear();
        redrawn_ = false;
      }
      break;
    }
    if (partial_.empty() && chunk.substr(0, newline).find('\r') == std::string_view::npos) {
      lines.push_back(Emit(chunk.substr(0, newline)));
    } else {
      Append(chunk.substr(0, newline));
      lines.push_back(Emit(partial_));
      partial_.clear();
      redrawn_ = false;
    }
    chunk.remove_prefix(newline + 1);
  }
  return lines;
}

void LinePrefixer::Append(std::string_view piece) {
  partial_.append(piece);
  // Keep what follows the last carriage return that has text after it. A carriage return at the
  // very end may be the first half of "\r\n" and stays until the next byte says.
  size_t end = partial_.size();
  if (end > 0 && partial_[end - 1] == '\r') --end;
  size_t last = end == 0 ? std::string::npos : partial_.rfind('\r', end - 1);
  if (last != std::string::npos) {
    partial_.erase(0, last + 1);
    redrawn_ = true;
  }
}

std::string_view LinePrefixer::live_line() const {
  if (!redrawn_) return {};
  std::string_view line = partial_;
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  return line;
}

std::string LinePrefixer::Finish() {
  redrawn_ = false;
  if (partial_.empty()) return "";
  std::string line = Emit(partial_);
  partial_.clear();
  return line;
}

std::string LinePrefixer::Emit(std::string_view line) {
  if (tail_lines_ > 0) {
    tail_.emplace_back(line);
    if (tail_.size() > tail_lines_) tail_.pop_front();
  }
  std::string out;
  out.reserve(prefix_.size() + line.size() + 1);
  out.append(prefix_).append(line).push_back('\n');
  return out;
}

}  // namespace ddprun
