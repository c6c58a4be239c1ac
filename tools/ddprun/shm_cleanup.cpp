#include "shm_cleanup.h"

#include <dirent.h>
#include <unistd.h>

#include "process_group/shm/segment_ownership.h"

namespace ddprun {
namespace {

// Unlinks each entry of `directory` whose name starts with `prefix` and for which
// `remove(creator pid)` says so; returns the names removed.
template <typename Predicate>
std::vector<std::string> RemoveSegments(const std::string& directory, const std::string& prefix,
                                        Predicate remove) {
  std::vector<std::string> removed;
  DIR* dir = opendir(directory.c_str());
  if (dir == nullptr) return removed;
  while (dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    const int creator = ddp::detail::shm_segment_creator(name);
    if (creator > 0 && remove(creator) && unlink((directory + "/" + name).c_str()) == 0) {
      removed.push_back(name);
    }
  }
  closedir(dir);
  return removed;
}

}  // namespace

std::vector<std::string> RemoveSegmentsOfWorker(pid_t pid, const std::string& directory) {
  return RemoveSegments(directory, "ddp-cpp.", [pid](int creator) { return creator == pid; });
}

std::vector<std::string> RemoveSegmentsOfDeadCreators(const std::string& run_id, int attempt,
                                                      const std::string& directory) {
  return RemoveSegments(directory, ddp::detail::shm_segment_prefix(run_id, attempt),
                        [](int creator) { return !ddp::detail::process_is_alive(creator); });
}

}  // namespace ddprun
