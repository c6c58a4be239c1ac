#include "common/atomic_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>

namespace ddp::detail {
namespace {

std::string folder_of(const std::string& path) {
  auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string base_name(const std::string& path) {
  auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// The writer of "<name>.tmp.<pid>.<time>.<n>" is certainly gone when no process has its pid
// (ESRCH) and nobody holds the file's lock: the writer holds it while writing, and the kernel
// drops it when the writer dies. The pid test alone could be fooled by a writer in another pid
// namespace or on another host sharing the folder; the lock alone, by the moment between a
// writer's open and its flock.
bool writer_is_gone(const std::string& tmp, const std::string& pid_text) {
  char* end = nullptr;
  long pid = std::strtol(pid_text.c_str(), &end, 10);
  if (pid_text.empty() || *end != '\0' || pid <= 0 || pid == ::getpid()) return false;
  if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) return false;
  int fd = ::open(tmp.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  bool unlocked = ::flock(fd, LOCK_EX | LOCK_NB) == 0;
  ::close(fd);
  return unlocked;
}

}  // namespace

std::string AtomicWriteResult::message() const {
  if (ok()) return "";
  const std::string cause = std::strerror(error);
  if (failed_step == "create") {
    return "cannot create the temporary file " + temporary + ": " + cause + ". Does the folder " +
           folder_of(path) + " exist and is it writable?";
  }
  if (failed_step == "rename") return "cannot rename " + temporary + " to " + path + ": " + cause;
  return "cannot " + failed_step + " " + temporary + ": " + cause;
}

AtomicWriteResult write_file_atomically(const std::string& path, std::string_view bytes,
                                        const AtomicWriteOptions& options) {
  static std::atomic<unsigned> counter{0};
  AtomicWriteResult result;
  result.path = path;
  auto now = std::chrono::steady_clock::now().time_since_epoch().count();
  result.temporary = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(now) + "." +
                     std::to_string(counter++);
  const std::string& tmp = result.temporary;
  auto fail = [&](const char* step) {
    result.failed_step = step;
    result.error = errno;
    return result;
  };
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, options.mode);
  if (fd < 0) return fail("create");
  // Held until this process closes the file or dies: it marks the file as being written.
  ::flock(fd, LOCK_EX | LOCK_NB);
  auto give_up = [&](const char* step) {
    fail(step);
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    return result;
  };
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return give_up("write");
    }
    done += static_cast<size_t>(n);
  }
  if (options.durable && ::fsync(fd) != 0) return give_up("fsync");
  int closed = ::close(fd);
  fd = -1;
  if (closed != 0) return give_up("close");
  if (::rename(tmp.c_str(), path.c_str()) != 0) return give_up("rename");
  if (options.durable) {
    int dir = ::open(folder_of(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir >= 0) {
      ::fsync(dir);  // best effort: the file is in place; some filesystems refuse fsync on folders
      ::close(dir);
    }
  }
  return result;
}

void remove_stale_temporaries(const std::string& path) {
  const std::string prefix = base_name(path) + ".tmp.";
  const std::string folder = folder_of(path);
  DIR* dir = ::opendir(folder.c_str());
  if (dir == nullptr) return;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string rest = name.substr(prefix.size());
    const std::string tmp = folder + "/" + name;
    if (writer_is_gone(tmp, rest.substr(0, rest.find('.')))) ::unlink(tmp.c_str());
  }
  ::closedir(dir);
}

}  // namespace ddp::detail
