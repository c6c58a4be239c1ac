#include "rendezvous/stalled_client_limit.h"

#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
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

bool set_stall_limit(int fd, std::chrono::milliseconds limit) {
  timeval stall{};
  stall.tv_sec = static_cast<time_t>(limit.count() / 1000);
  stall.tv_usec = static_cast<suseconds_t>((limit.count() % 1000) * 1000);
  bool set = true;
  for (int option : {SO_RCVTIMEO, SO_SNDTIMEO}) {
    set = ::setsockopt(fd, SOL_SOCKET, option, &stall, sizeof(stall)) == 0 && set;
  }
  return set;
}

}  // namespace

int bound_store_socket(int port, std::chrono::milliseconds limit) {
  // As c10d's server binds: every address, IPv6 and IPv4 on one socket where the host has IPv6.
  int error = EAFNOSUPPORT;
  for (int family : {AF_INET6, AF_INET}) {
    const int fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      error = errno;
      continue;
    }
    const int on = 1;
    const int off = 0;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
    sockaddr_storage address{};
    socklen_t length = 0;
    if (family == AF_INET6) {
      ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof(off));
      auto& any = reinterpret_cast<sockaddr_in6&>(address);
      any.sin6_family = AF_INET6;
      any.sin6_addr = in6addr_any;
      any.sin6_port = htons(static_cast<uint16_t>(port));
      length = sizeof(any);
    } else {
      auto& any = reinterpret_cast<sockaddr_in&>(address);
      any.sin_family = AF_INET;
      any.sin_addr.s_addr = htonl(INADDR_ANY);
      any.sin_port = htons(static_cast<uint16_t>(port));
      length = sizeof(any);
    }
    if (set_stall_limit(fd, limit) &&
        ::bind(fd, reinterpret_cast<const sockaddr*>(&address), length) == 0) {
      return fd;
    }
    error = errno;
    ::close(fd);
    if (error == EADDRINUSE) break;
  }
  errno = error;
  return -1;
}

std::chrono::milliseconds stalled_client_limit(std::chrono::milliseconds timeout) {
  return std::clamp<std::chrono::milliseconds>(timeout / 2, kShortestStall, kLongestStall);
}

int limit_stalled_store_clients(int port, std::chrono::milliseconds limit) {
  DIR* descriptors = ::opendir("/proc/self/fd");
  if (descriptors == nullptr) return 0;
  int changed = 0;
  while (const dirent* entry = ::readdir(descriptors)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == ::dirfd(descriptors)) continue;
    if (served_on(static_cast<int>(fd), port) && set_stall_limit(static_cast<int>(fd), limit)) {
      ++changed;
    }
  }
  ::closedir(descriptors);
  return changed;
}

}  // namespace ddp::rendezvous
