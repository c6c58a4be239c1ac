// LinePrefixer turns the byte stream of one worker pipe into whole output lines, each prefixed
// (e.g. "[1]: ") and newline-terminated, ready to be written with a single write(). It buffers
// an incomplete line until its newline arrives or the stream ends, and keeps the last few lines
// (unprefixed) for the failure summary. One instance per pipe; not thread-safe.
#pragma once

#include <cstddef>
#include <deque>
#include <string>
#include <string_view>
#include <vector>

namespace ddprun {

class LinePrefixer {
 public:
  // A line longer than this is cut and emitted in pieces, so that a worker writing without
  // newlines cannot make ddprun buffer without bound.
  static constexpr size_t kMaxLineBytes = 64 * 1024;

  // `tail_lines`: how many of the last lines tail() keeps (0 keeps none).
  explicit LinePrefixer(std::string prefix, size_t tail_lines = 0);

  // Consumes a chunk read from the pipe; returns the lines it completes, prefixed, each ending
  // in '\n'.
  std::vector<std::string> Feed(std::string_view chunk);

  // The stream ended: returns the buffered unterminated line with prefix and '\n' added, or an
  // empty string when there is none.
  std::string Finish();

  // The last `tail_lines` lines, oldest first, without prefix or newline.
  const std::deque<std::string>& tail() const { return tail_; }

 private:
  std::string Emit(std::string_view line);

  std::string prefix_;
  size_t tail_lines_;
  std::string partial_;
  std::deque<std::string> tail_;
};

}  // namespace ddprun
