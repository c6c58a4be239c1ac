// LinePrefixer turns the byte stream of one worker pipe into whole output lines, each prefixed
// (e.g. "[1]: ") and newline-terminated, ready to be written with a single write(). It buffers
// an incomplete line until its newline arrives or the stream ends, and keeps the last few lines
// (unprefixed) for the failure summary. One instance per pipe; not thread-safe.
//
// A carriage return inside a line starts the line over, as on a terminal: a progress bar that
// redraws itself with "\r" becomes one line holding its last state (a "\r" just before the
// newline, as in "\r\n", is kept). Until its newline comes, such a line is the stream's live
// line, which ddprun redraws in place at the bottom of its terminal.
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

  // The line being redrawn with carriage returns (its state so far, unprefixed), or empty when
  // the pending text has no carriage return in it.
  std::string_view live_line() const;
  const std::string& prefix() const { return prefix_; }

 private:
  void Append(std::string_view piece);
  std::string Emit(std::string_view line);

  std::string prefix_;
  size_t tail_lines_;
  std::string partial_;
  bool redrawn_ = false;  // partial_ has been started over by a carriage return
  std::deque<std::string> tail_;
};

}  // namespace ddprun
