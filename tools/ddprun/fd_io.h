// Small POSIX file-descriptor helpers shared by the launcher's parts. Stateless: thread-safe.
#pragma once

#include <string_view>

namespace ddprun {

// Writes all of `data` to `fd`, issuing one write() when the descriptor accepts it whole, so a
// line is not interleaved with other writers' lines. Retries on EINTR and on EAGAIN (waiting
// for POLLOUT, should the descriptor be non-blocking); gives up silently on other errors
// (e.g. EPIPE when the reader went away), since output loss must not stop the supervision.
void WriteAll(int fd, std::string_view data);

// Sets O_NONBLOCK on `fd`; returns false on failure.
bool SetNonBlocking(int fd);

// Makes sure descriptors 0, 1 and 2 are open (on /dev/null if not), so that pipes created
// later never land on them and get dup2()ed onto themselves.
void EnsureStandardDescriptors();

}  // namespace ddprun
