#include "shm_cleanup.h"

#include <dirent.h>
#include <unistd.h>

namespace ddprun {

std::vector<std::string> RemoveSegmentsOfWorker(pid_t pid, const std::string& directory) {
  std::vector<std::string> removed;
  const std::string prefix = "ddp-cpp.";
  const std::string suffix = ".p" + std::to_string(pid);
  DIR* dir = opendir(directory.c_str());
  if (dir == nullptr) return removed;
  while (dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    if (name.size() > prefix.size() + suffix.size() &&
        name.compare(0, prefix.size(), prefix) == 0 &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      if (unlink((directory + "/" + name).c_str()) == 0) removed.push_back(name);
    }
  }
  closedir(dir);
  return removed;
}

}  // namespace ddprun
