#include "terminal_status.h"

#include <utility>

namespace ddprun {
namespace {

// Cuts a line to at most `width` characters: UTF-8 continuation bytes do not count, and a cut
// never falls inside a character.
std::string Fit(const std::string& line, size_t width) {
  size_t characters = 0;
  for (size_t i = 0; i < line.size(); ++i) {
    const bool starts_character = (static_cast<unsigned char>(line[i]) & 0xC0) != 0x80;
    if (starts_character && ++characters > width) return line.substr(0, i);
  }
  return line;
}

}  // namespace

bool TerminalStatus::Set(size_t slot, std::string line) {
  if (lines_[slot] == line) return false;
  lines_[slot] = std::move(line);
  return true;
}

std::string TerminalStatus::Erase() {
  if (drawn_ == 0) return "";
  std::string bytes = "\r";
  if (drawn_ > 1) bytes += "\x1b[" + std::to_string(drawn_ - 1) + "A";  // up to the first line
  bytes += "\x1b[J";  // erase from the cursor to the end of the screen
  drawn_ = 0;
  return bytes;
}

std::string TerminalStatus::Draw(size_t columns) {
  const size_t width = columns > 1 ? columns - 1 : 1;
  std::string bytes = Erase();
  for (const std::string& line : lines_) {
    if (line.empty()) continue;
    if (drawn_ > 0) bytes += "\r\n";  // "\r" too: the terminal may not add it (raw mode)
    bytes += Fit(line, width);
    ++drawn_;
  }
  return bytes;
}

}  // namespace ddprun
