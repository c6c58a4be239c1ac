// TerminalStatus: the workers' live lines (progress bars that redraw themselves with "\r"),
// kept at the bottom of ddprun's terminal below the lines the workers print.
//
// Workers write through pipes, so a bar's "\r" would reach the terminal mixed with the other
// ranks' lines and tear. Instead ddprun erases its status area before it writes any worker line,
// then draws the area again: one line per live stream, in rank order, each cut to the terminal's
// width (a wrapped line would break the erase). Only used when ddprun's stdout is a terminal;
// the escape sequences are the ANSI ones every terminal emulator and tmux understand.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace ddprun {

class TerminalStatus {
 public:
  explicit TerminalStatus(size_t slots) : lines_(slots) {}

  // Sets one slot's line (empty: none). Returns whether it changed.
  bool Set(size_t slot, std::string line);

  // Bytes that erase the area as last drawn, leaving the cursor at the start of its first line.
  std::string Erase();
  // Bytes that draw the area afresh (erasing it first if it is on screen; nothing more when no
  // slot has a line), each line cut to `columns` - 1 characters; the cursor stays at the end of
  // the last line.
  std::string Draw(size_t columns);

 private:
  std::vector<std::string> lines_;
  size_t drawn_ = 0;  // terminal lines the area took when last drawn
};

}  // namespace ddprun
