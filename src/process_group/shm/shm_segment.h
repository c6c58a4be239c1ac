// ShmSegment: one POSIX shared-memory segment mapped by the ranks of one host.
//
// The creator (local rank 0 of the group on that host) makes it with shm_open(O_EXCL), reserves
// its pages with posix_fallocate (so that a /dev/shm too small for it fails here, with a message,
// instead of killing a rank with SIGBUS on first touch) and maps it; the others open and map it by
// name. Once every rank has mapped it, the creator unlinks the name: from then on the memory lives
// only as long as some rank maps it, and nothing is left in /dev/shm however the ranks end.
//
// Names come from shm_segment_name (segment_ownership.h): they say the job, the attempt and the
// creator's pid, so that ddprun can remove a segment whose creator was killed in the short window
// before the unlink (see tools/ddprun).
//
// Not thread-safe; the object is owned by one process group.
#pragma once

#include <cstddef>
#include <string>

namespace ddp::detail {

class ShmSegment {
 public:
  /// Creates and maps a segment of `bytes` bytes (zero-filled). Returns an empty segment (no
  /// data) when the name is taken, to be retried with another name. Throws DistributedError.
  static ShmSegment create(const std::string& name, size_t bytes, const std::string& operation);
  /// Opens and maps an existing segment, checking that it has `bytes` bytes.
  static ShmSegment open(const std::string& name, size_t bytes, const std::string& operation);

  ShmSegment() = default;
  ShmSegment(ShmSegment&& other) noexcept;
  ShmSegment& operator=(ShmSegment&& other) noexcept;
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;
  ~ShmSegment();  // unmaps, and unlinks if this object created the name and still owns it

  /// Removes the name from /dev/shm (idempotent); the mapping stays valid.
  void unlink();

  void* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }

 private:
  void release();  // unlink if owned, unmap

  std::string name_;
  void* data_ = nullptr;
  size_t size_ = 0;
  bool owns_name_ = false;
};

}  // namespace ddp::detail
