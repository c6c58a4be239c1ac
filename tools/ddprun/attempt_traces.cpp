#include "attempt_traces.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "trace_analysis.h"

namespace ddprun {
namespace {

bool HasRecords(const std::string& dir) {
  DIR* folder = opendir(dir.c_str());
  if (!folder) return false;
  bool found = false;
  while (dirent* item = readdir(folder)) {
    const std::string name = item->d_name;
    if (name.rfind("rank", 0) == 0 && name.size() > 5 &&
        name.compare(name.size() - 5, 5, ".json") == 0) {
      found = true;
    }
  }
  closedir(folder);
  return found;
}

}  // namespace

bool RemoveFlatFolder(const std::string& dir) {
  if (DIR* folder = opendir(dir.c_str())) {
    std::vector<std::string> names;
    while (dirent* item = readdir(folder)) {
      const std::string name = item->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    closedir(folder);
    for (const std::string& name : names) unlink((dir + "/" + name).c_str());
  }
  return rmdir(dir.c_str()) == 0 || errno == ENOENT;
}

AttemptTraces::AttemptTraces(const LauncherOptions& options, std::string user_dir)
    : log_dir_(options.log_dir), run_id_(options.run_id), user_dir_(std::move(user_dir)) {}

AttemptTraces::~AttemptTraces() {
  if (!root_.empty()) rmdir(root_.c_str());  // only when every attempt's folder went
}

std::string AttemptTraces::Begin(int restart_count, std::string* error) {
  if (!ChosenByDdprun()) return current_ = user_dir_;
  current_.clear();
  if (root_.empty()) {
    std::string parent = log_dir_;
    std::string prefix;  // torchrun's <run-id>_XXXXXX in --log-dir; named for ddprun elsewhere
    if (parent.empty()) {
      const char* tmp = std::getenv("TMPDIR");
      parent = tmp && *tmp ? tmp : "/tmp";
      prefix = "ddprun_";
    } else if (mkdir(parent.c_str(), 0755) != 0 && errno != EEXIST) {
      *error = "cannot make --log-dir " + parent + ": " + std::strerror(errno);
      return "";
    }
    std::string pattern = parent + "/" + prefix + run_id_ + "_XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) {
      *error = "cannot make a folder for flight records in " + parent + ": " + std::strerror(errno);
      return "";
    }
    root_ = pattern;
  }
  const std::string attempt = root_ + "/attempt_" + std::to_string(restart_count);
  if (mkdir(attempt.c_str(), 0755) != 0 && errno != EEXIST) {
    *error = "cannot make " + attempt + ": " + std::strerror(errno);
    return "";
  }
  return current_ = attempt;
}

std::string AttemptTraces::End(bool succeeded) {
  if (current_.empty()) return "";
  const std::string dir = current_;
  current_.clear();
  if (succeeded) {
    if (ChosenByDdprun()) RemoveFlatFolder(dir);
    return "";
  }
  if (!HasRecords(dir)) {
    if (ChosenByDdprun()) RemoveFlatFolder(dir);
    return "ddprun: no rank wrote a flight record: none raised a timeout, lost-peer or mismatch "
           "error\n";
  }
  std::string printed;
  WriteDiagnosis(dir, &printed);
  return "ddprun: the ranks' flight records are kept in " + dir + "\n" + printed;
}

}  // namespace ddprun
