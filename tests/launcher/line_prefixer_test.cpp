// Splitting a worker's output stream into whole, prefixed lines.
#include "line_prefixer.h"

#include <gtest/gtest.h>

namespace ddprun {
namespace {

using Lines = std::vector<std::string>;

TEST(LinePrefixer, PrefixesEachCompleteLine) {
  LinePrefixer p("[1]: ");
  EXPECT_EQ(p.Feed("hello\n"), Lines{"[1]: hello\n"});
}

TEST(LinePrefixer, SplitsSeveralLinesInOneChunk) {
  LinePrefixer p("[0]: ");
  EXPECT_EQ(p.Feed("a\nbb\n\nccc\n"), (Lines{"[0]: a\n", "[0]: bb\n", "[0]: \n", "[0]: ccc\n"}));
}

TEST(LinePrefixer, JoinsPartialLinesAcrossChunks) {
  LinePrefixer p("[2]: ");
  EXPECT_EQ(p.Feed("hel"), Lines{});
  EXPECT_EQ(p.Feed("lo wo"), Lines{});
  EXPECT_EQ(p.Feed("rld\nnext"), Lines{"[2]: hello world\n"});
  EXPECT_EQ(p.Feed("\n"), Lines{"[2]: next\n"});
  EXPECT_EQ(p.Finish(), "");
}

TEST(LinePrefixer, FinishFlushesUnterminatedLastLineWithNewline) {
  LinePrefixer p("[3]: ");
  EXPECT_EQ(p.Feed("done\npartial"), Lines{"[3]: done\n"});
  EXPECT_EQ(p.Finish(), "[3]: partial\n");
  EXPECT_EQ(p.Finish(), "");
}

TEST(LinePrefixer, KeepsNulAndCarriageReturnBytes) {
  LinePrefixer p("[0]: ");
  EXPECT_EQ(p.Feed(std::string("a\0b\r\n", 5)), Lines{std::string("[0]: a\0b\r\n", 10)});
}

TEST(LinePrefixer, CutsOverlongLinesInsteadOfBufferingForever) {
  LinePrefixer p("[0]: ");
  std::string chunk(LinePrefixer::kMaxLineBytes, 'x');
  Lines lines = p.Feed(chunk);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0], "[0]: " + chunk + "\n");
  EXPECT_EQ(p.Finish(), "");
}

TEST(LinePrefixer, TailKeepsTheLastLinesWithoutPrefix) {
  LinePrefixer p("[1]: ", 2);
  p.Feed("one\ntwo\nthree\nfour");
  EXPECT_EQ(std::vector<std::string>(p.tail().begin(), p.tail().end()), (Lines{"two", "three"}));
  p.Finish();
  EXPECT_EQ(std::vector<std::string>(p.tail().begin(), p.tail().end()), (Lines{"three", "four"}));
}

TEST(LinePrefixer, NoTailByDefault) {
  LinePrefixer p("[1]: ");
  p.Feed("one\n");
  EXPECT_TRUE(p.tail().empty());
}

TEST(LinePrefixer, ACarriageReturnStartsTheLineOverAndMakesItLive) {
  LinePrefixer p("[0]: ");
  EXPECT_EQ(p.Feed("\rstep 1/3"), Lines{});
  EXPECT_EQ(p.live_line(), "step 1/3");
  EXPECT_EQ(p.Feed("\rstep 2/3\rst"), Lines{});
  EXPECT_EQ(p.live_line(), "st");
  EXPECT_EQ(p.Feed("ep 3/3"), Lines{});
  EXPECT_EQ(p.live_line(), "step 3/3");
  // The newline ends it: one line with the bar's last state, and nothing live any more.
  EXPECT_EQ(p.Feed("\nnext"), (Lines{"[0]: step 3/3\n"}));
  EXPECT_EQ(p.live_line(), "");
  EXPECT_EQ(p.Finish(), "[0]: next\n");
}

TEST(LinePrefixer, ACarriageReturnSplitFromItsNewlineIsKept) {
  LinePrefixer p("[0]: ");
  EXPECT_EQ(p.Feed("dos line\r"), Lines{});
  EXPECT_EQ(p.live_line(), "");  // nothing was started over
  EXPECT_EQ(p.Feed("\n"), Lines{"[0]: dos line\r\n"});
  EXPECT_EQ(p.Feed("a\rb\r"), Lines{});
  EXPECT_EQ(p.live_line(), "b");
  EXPECT_EQ(p.Feed("\n"), Lines{"[0]: b\r\n"});
}

TEST(LinePrefixer, ARedrawnLineNeverGrowsTheBuffer) {
  LinePrefixer p("[0]: ");
  const std::string bar(1000, '#');
  for (int i = 0; i < 200; ++i) EXPECT_EQ(p.Feed("\r" + bar), Lines{});  // 200 KB in all
  EXPECT_EQ(p.live_line(), bar);
  EXPECT_EQ(p.Finish(), "[0]: " + bar + "\n");
}

}  // namespace
}  // namespace ddprun
