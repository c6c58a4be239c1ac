#include "process_group/shm/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "common/error_context.h"

namespace ddp::detail {
namespace {

std::string errno_text(int error) { return std::string(std::strerror(error)); }

void* map_whole(int fd, size_t bytes) {
  void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  return data == MAP_FAILED ? nullptr : data;
}

}  // namespace

ShmSegment ShmSegment::create(const std::string& name, size_t bytes, const std::string& operation) {
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  // Taken: never unlink it, it may be another live job's (pids repeat across containers).
  if (fd < 0 && errno == EEXIST) return ShmSegment();
  if (fd < 0) {
    fail(operation, "cannot create the shared-memory segment /dev/shm" + name + ": " +
                        errno_text(errno) +
                        ". Use backend \"gloo\" where /dev/shm is unavailable.");
  }
  ShmSegment segment;
  segment.name_ = name;
  segment.owns_name_ = true;
  int error = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (error != 0) {
    close(fd);
    shm_unlink(name.c_str());
    fail(operation, "cannot reserve " + std::to_string(bytes >> 20) +
                        " MiB in /dev/shm for the shared-memory transport: " + errno_text(error) +
                        ". Enlarge /dev/shm (in Docker: --shm-size=1g) or use backend \"gloo\".");
  }
  segment.data_ = map_whole(fd, bytes);
  error = errno;
  close(fd);
  if (!segment.data_) {
    shm_unlink(name.c_str());
    fail(operation, "cannot map the shared-memory segment " + name + ": " + errno_text(error));
  }
  segment.size_ = bytes;
  return segment;
}

ShmSegment ShmSegment::open(const std::string& name, size_t bytes, const std::string& operation) {
  int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) {
    fail(operation, "cannot open the shared-memory segment /dev/shm" + name +
                        " made by this host's first rank: " + errno_text(errno) +
                        ". Ranks that declare one host must share /dev/shm (same machine, same "
                        "container); otherwise use backend(\"gloo\").");
  }
  struct stat info {};
  if (fstat(fd, &info) != 0 || static_cast<size_t>(info.st_size) != bytes) {
    close(fd);
    fail(operation, "the shared-memory segment " + name + " has " + std::to_string(info.st_size) +
                        " bytes, expected " + std::to_string(bytes) +
                        "; the ranks of this host disagree on the group");
  }
  ShmSegment segment;
  segment.name_ = name;
  segment.data_ = map_whole(fd, bytes);
  int error = errno;
  close(fd);
  if (!segment.data_) {
    fail(operation, "cannot map the shared-memory segment " + name + ": " + errno_text(error));
  }
  segment.size_ = bytes;
  return segment;
}

ShmSegment::ShmSegment(ShmSegment&& other) noexcept { *this = std::move(other); }

ShmSegment& ShmSegment::operator=(ShmSegment&& other) noexcept {
  if (this != &other) {
    release();
    name_ = std::move(other.name_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    owns_name_ = std::exchange(other.owns_name_, false);
  }
  return *this;
}

ShmSegment::~ShmSegment() { release(); }

void ShmSegment::release() {
  unlink();
  if (data_) munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
}

void ShmSegment::unlink() {
  if (owns_name_) shm_unlink(name_.c_str());
  owns_name_ = false;
}

}  // namespace ddp::detail
