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
      partial_.append(chunk);
      if (partial_.size() >= kMaxLineBytes) {
        lines.push_back(Emit(partial_));
        partial_.clear();
      }
      break;
    }
    if (partial_.empty()) {
      lines.push_back(Emit(chunk.substr(0, newline)));
    } else {
      partial_.append(chunk.substr(0, newline));
      lines.push_back(Emit(partial_));
      partial_.clear();
    }
    chunk.remove_prefix(newline + 1);
  }
  return lines;
}

std::string LinePrefixer::Finish() {
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
