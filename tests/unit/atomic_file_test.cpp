// Writing a file through a temporary and a rename (src/common/atomic_file.h): the new content
// replaces the old whole, and no failure leaves the temporary behind.
#include "common/atomic_file.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "support/multiprocess.h"

namespace {

namespace fs = std::filesystem;
using ddp::detail::write_file_atomically;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<std::string> files_in(const std::string& folder) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(folder)) {
    names.push_back(entry.path().filename().string());
  }
  return names;
}

TEST(AtomicFileTest, ReplacesTheContentAndLeavesOnlyTheFile) {
  const std::string path = ddp::testing::fresh_path("out.json");
  fs::create_directories(fs::path(path).parent_path());
  for (const char* text : {"first, longer content", "second"}) {
    ddp::detail::AtomicWriteOptions options;
    options.durable = true;
    const auto written = write_file_atomically(path, text, options);
    ASSERT_TRUE(written.ok()) << written.message();
    EXPECT_EQ(written.message(), "");
    EXPECT_EQ(read_file(path), text);
  }
  EXPECT_EQ(files_in(fs::path(path).parent_path().string()), std::vector<std::string>{"out.json"});
}

TEST(AtomicFileTest, AMissingFolderIsReportedWithTheFix) {
  const std::string path = ddp::testing::fresh_path("missing") + "/out.json";
  const auto written = write_file_atomically(path, "x");
  EXPECT_EQ(written.failed_step, "create");
  EXPECT_EQ(written.error, ENOENT);
  EXPECT_NE(written.message().find("cannot create the temporary file " + path + ".tmp."),
            std::string::npos)
      << written.message();
  EXPECT_NE(written.message().find("Does the folder"), std::string::npos) << written.message();
}

TEST(AtomicFileTest, AFailedRenameRemovesTheTemporary) {
  // The destination is a non-empty folder: the temporary is written, the rename fails.
  const std::string path = ddp::testing::fresh_path("taken");
  fs::create_directories(path);
  std::ofstream(path + "/keep") << "x";
  const auto written = write_file_atomically(path, "new");
  EXPECT_EQ(written.failed_step, "rename");
  EXPECT_NE(written.message().find("cannot rename " + written.temporary + " to " + path),
            std::string::npos)
      << written.message();
  EXPECT_FALSE(fs::exists(written.temporary));
  EXPECT_EQ(files_in(fs::path(path).parent_path().string()), std::vector<std::string>{"taken"});
}

}  // namespace
