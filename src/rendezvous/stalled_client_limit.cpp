#include "rendezvous/stalled_client_limit.h"

#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>

#include <algorithm>
#include <cstdlib>

namespace ddp::rendezvous {
namespace {

constexpr auto kLongestStall = std::chrono::seconds(5);
constexpr auto kShortestStall = std::chrono::milliseconds(500);

int local_port(int fd) {
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) return -1;
  if (address.ss_family == AF_INET) {
    return ntohs(reinterpret_cast<const sockaddr_in&>(address).sin_port);
  }
  if (address.ss_family == AF_INET6) {
    return ntohs(reinterpret_cast<const sockaddr_in6&>(address).sin6_port);
  }
  return -1;
}

// A socket of the server: the listening one, or one it accepted (local port = the store's). The
// clients of this process (rank 0's own) have the store's port as their peer's, not their own.
bool served_on(int fd, int port) {
  struct stat info {};
  return ::fstat(fd, &info) == 0 && S_ISSOCK(info.st_mode) && local_port(fd) == port;
}

}  // namespace

std::chrono::milliseconds stalled_client_limit(std::chrono::milliseconds timeout) {
  return std::clamp<std::chrono::milliseconds>(timeout / 2, kShortestStall, kLongestStall);
}

int limit_stalled_store_clients(int port, std::chrono::milliseconds limit) {
  DIR* descriptors = ::opendir("/proc/self/fd");
  if (descriptors == nullptr) return 0;
  timeval stall{};
  stall.tv_sec = static_cast<time_t>(limit.count() / 1000);
  stall.tv_usec = static_cast<suseconds_t>((limit.count() % 1000) * 1000);
  int changed = 0;
  while (const dirent* entry = ::readdir(descriptors)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == ::dirfd(descriptors)) continue;
    if (!served_on(static_cast<int>(fd), port)) continue;
    bool set = true;
    for (int option : {SO_RCVTIMEO, SO_SNDTIMEO}) {
      set = ::setsockopt(static_cast<int>(fd), SOL_SOCKET, option, &stall, sizeof(stall)) == 0 &&
            set;
    }
    changed += set ? 1 : 0;
  }
  ::closedir(descriptors);
  return changed;
}

}  // namespace ddp::rendezvous
