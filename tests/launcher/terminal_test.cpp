// ddprun on a terminal: the workers' live lines (progress bars redrawn with "\r") stay at the
// bottom, below the other ranks' lines, and nothing tears. TerminalStatus's bytes are checked by
// replaying them on a small screen model, then ddprun itself runs under a pseudo-terminal.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "launcher_harness.h"
#include "terminal_status.h"

namespace ddprun_test {
namespace {

// What a terminal shows after `bytes` (as written to the screen: a pty has already turned each
// "\n" a program wrote into "\r\n"): printable characters overwrite at the cursor; "\r", "\n",
// "ESC[nA" (up n) and "ESC[J" (erase to the end of the screen) move or erase. Enough for the
// sequences ddprun writes; anything else fails the test.
std::vector<std::string> Screen(const std::string& bytes) {
  std::vector<std::string> rows(1);
  size_t row = 0, column = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    const char c = bytes[i];
    if (c == '\r') {
      column = 0;
    } else if (c == '\n') {
      if (++row == rows.size()) rows.emplace_back();
    } else if (c == '\x1b') {
      size_t end = bytes.find_first_of("AJ", i);
      EXPECT_NE(end, std::string::npos);
      EXPECT_EQ(bytes[i + 1], '[');
      const std::string count = bytes.substr(i + 2, end - i - 2);
      if (bytes[end] == 'A') {
        row -= std::min(row, static_cast<size_t>(count.empty() ? 1 : std::stoul(count)));
      } else {
        rows[row].resize(std::min(rows[row].size(), column));
        rows.resize(row + 1);
      }
      i = end;
    } else {
      EXPECT_TRUE(c >= ' ' && c <= '~') << "unexpected byte " << int(c);
      if (rows[row].size() < column + 1) rows[row].resize(column + 1, ' ');
      rows[row][column++] = c;
    }
  }
  while (!rows.empty() && rows.back().empty()) rows.pop_back();
  return rows;
}

using Rows = std::vector<std::string>;

TEST(TerminalStatus, LinesScrollAboveTheLiveLinesWhichRedrawInPlace) {
  ddprun::TerminalStatus status(4);
  std::string tty;
  EXPECT_TRUE(status.Set(0, "[0]: epoch 1 [#...] 1/4"));
  tty += status.Draw(80);
  EXPECT_EQ(Screen(tty), (Rows{"[0]: epoch 1 [#...] 1/4"}));
  // Rank 1 prints while the bar is live: erase, the line, the bar again.
  tty += status.Erase() + "[1]: hello\r\n";
  tty += status.Draw(80);
  EXPECT_EQ(Screen(tty), (Rows{"[1]: hello", "[0]: epoch 1 [#...] 1/4"}));
  // Two live lines, in slot order whatever order they came in.
  EXPECT_TRUE(status.Set(2, "[1]: eval [##..]"));
  EXPECT_TRUE(status.Set(0, "[0]: epoch 1 [##..] 2/4"));
  EXPECT_FALSE(status.Set(0, "[0]: epoch 1 [##..] 2/4"));
  tty += status.Draw(80);
  EXPECT_EQ(Screen(tty), (Rows{"[1]: hello", "[0]: epoch 1 [##..] 2/4", "[1]: eval [##..]"}));
  tty += status.Erase() + "[0]: done\r\n";
  status.Set(0, "");
  tty += status.Draw(80);
  EXPECT_EQ(Screen(tty), (Rows{"[1]: hello", "[0]: done", "[1]: eval [##..]"}));
  status.Set(2, "");
  tty += status.Draw(80);
  EXPECT_EQ(Screen(tty), (Rows{"[1]: hello", "[0]: done"}));
}

TEST(TerminalStatus, ALiveLineIsCutToTheTerminalWidthSoThatItNeverWraps) {
  ddprun::TerminalStatus status(1);
  status.Set(0, std::string(100, '#'));
  EXPECT_EQ(status.Draw(40), std::string(39, '#'));
  status.Set(0, "\xc3\xa9t\xc3\xa9 long");  // "été long": cut between characters, not bytes
  EXPECT_EQ(status.Draw(4), "\r\x1b[J\xc3\xa9t\xc3\xa9");
}

// Runs ddprun with a pseudo-terminal as its stdout and stderr; returns all it wrote there, or
// nothing when this machine has no pseudo-terminal to give (a chroot without /dev/pts).
std::optional<std::string> RunOnTerminal(const std::vector<std::string>& args, double timeout_s,
                                         const char* term = "xterm") {
  std::vector<char*> argv;
  std::string path = DDPRUN_PATH;
  argv.push_back(path.data());
  std::vector<std::string> copies = args;
  for (std::string& arg : copies) argv.push_back(arg.data());
  argv.push_back(nullptr);
  winsize size{};
  size.ws_row = 24;
  size.ws_col = 100;
  int master = -1;
  const pid_t pid = forkpty(&master, nullptr, nullptr, &size);
  if (pid < 0) return std::nullopt;  // and never kill(pid): kill(-1) would reach every process
  if (pid == 0) {
    unsetenv("OMP_NUM_THREADS");
    setenv("TERM", term, 1);
    execv(argv[0], argv.data());
    _exit(127);
  }
  std::string output;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      ADD_FAILURE() << "ddprun on a terminal did not finish in " << timeout_s << " s:\n" << output;
      kill(pid, SIGKILL);
      break;
    }
    pollfd fd{master, POLLIN, 0};
    if (poll(&fd, 1, static_cast<int>(left.count())) <= 0) continue;
    char buffer[4096];
    ssize_t n = read(master, buffer, sizeof(buffer));
    if (n <= 0) break;  // EIO: every process holding the terminal has gone
    output.append(buffer, static_cast<size_t>(n));
  }
  int status = 0;
  waitpid(pid, &status, 0);
  close(master);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << output;
  return output;
}

TEST(LauncherOnATerminal, ABarStaysBelowTheOtherRanksLinesAndEndsAsOneLine) {
  ScratchDir scratch;
  // Rank 0 draws its bar, then waits (on a pipe, not a clock) until rank 1 has printed its
  // lines, then finishes the bar. Rank 1 waits for rank 0's first bar before printing.
  const std::string drawn = scratch.File("drawn"), printed = scratch.File("printed");
  ASSERT_EQ(mkfifo(drawn.c_str(), 0600), 0);
  ASSERT_EQ(mkfifo(printed.c_str(), 0600), 0);
  const std::string script =
      "if [ $RANK = 0 ]; then echo tty=$DDPRUN_STDOUT_TTY; printf '\\rtrain [#...] 1/4';"
      " printf '\\rtrain [##..] 2/4'; echo > " +
      drawn + "; read x < " + printed +
      ";"
      " printf '\\rtrain [####] 4/4\\n'; echo after;"
      " else read x < " +
      drawn + "; echo one; echo two >&2; echo three; echo > " + printed + "; fi";
  const auto run = RunOnTerminal({"--nproc-per-node", "2", "sh", "-c", script}, 20);
  if (!run) GTEST_SKIP() << "no pseudo-terminal here: " << std::strerror(errno);
  const std::string& output = *run;
  // The pty turns "\n" into "\r\n"; the screen model reads both.
  const Rows screen = Screen(output);
  // Every row is whole: rank 0's in the order it wrote them (the bar's last state as one line),
  // rank 1's lines as they came (its stdout and stderr are two pipes, and ddprun may relay rank
  // 0's last lines before or after them).
  Rows rank0, rank1;
  for (const std::string& row : screen) (row.rfind("[0]: ", 0) == 0 ? rank0 : rank1).push_back(row);
  EXPECT_EQ(rank0, (Rows{"[0]: tty=1", "[0]: train [####] 4/4", "[0]: after"})) << output;
  std::sort(rank1.begin(), rank1.end());
  EXPECT_EQ(rank1, (Rows{"[1]: one", "[1]: three", "[1]: two"})) << output;
}

TEST(LauncherOnATerminal, ADumbTerminalGetsPlainLines) {
  // TERM=dumb (an editor's shell) moves no cursor: bars end as lines, nothing is redrawn.
  const auto run = RunOnTerminal(
      {"--nproc-per-node", "1", "sh", "-c", "echo tty=$DDPRUN_STDOUT_TTY; printf '\\ra\\rb\\n'"},
      20, "dumb");
  if (!run) GTEST_SKIP() << "no pseudo-terminal here: " << std::strerror(errno);
  const std::string& output = *run;
  EXPECT_EQ(output.find('\x1b'), std::string::npos) << output;
  EXPECT_EQ(Screen(output), (Rows{"[0]: tty=0", "[0]: b"})) << output;
}

}  // namespace
}  // namespace ddprun_test
