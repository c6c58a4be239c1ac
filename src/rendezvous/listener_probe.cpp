#include "rendezvous/listener_probe.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

namespace ddp::rendezvous {
namespace {

using Clock = std::chrono::steady_clock;

// One non-blocking connect to one address, bounded by the deadline. Returns 0 or an errno; on
// success, hands the connected socket to `kept` where given, else closes it.
int try_connect(const addrinfo& address, Clock::time_point deadline, int* kept = nullptr) {
  int fd = ::socket(address.ai_family, address.ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                    address.ai_protocol);
  if (fd < 0) return errno;
  int error = 0;
  if (::connect(fd, address.ai_addr, address.ai_addrlen) != 0) {
    error = errno;
    if (error == EINPROGRESS) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      pollfd waiting{fd, POLLOUT, 0};
      int ready = ::poll(&waiting, 1, static_cast<int>(std::max<int64_t>(left.count(), 0)));
      socklen_t length = sizeof(error);
      if (ready == 1) {
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length);
      } else {
        error = ready == 0 ? ETIMEDOUT : errno;
      }
    }
  }
  if (error == 0 && kept != nullptr) {
    *kept = fd;
  } else {
    ::close(fd);
  }
  return error;
}

// The addresses of host:port, or null (with why in `error`).
addrinfo* resolve(const std::string& host, int port, std::string& error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  int resolved = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (resolved != 0) {
    error = std::string("cannot resolve ") + host + ": " + ::gai_strerror(resolved);
    return nullptr;
  }
  return found;
}

}  // namespace

std::string wait_until_listening(const std::string& host, int port, Clock::time_point deadline) {
  // Refused attempts are cheap; the back-off only keeps a long wait from spinning.
  auto pause = std::chrono::milliseconds(5);
  std::string last_error = "no attempt";
  while (true) {
    if (addrinfo* found = resolve(host, port, last_error)) {
      for (addrinfo* address = found; address != nullptr; address = address->ai_next) {
        int error = try_connect(*address, deadline);
        if (error == 0) {
          ::freeaddrinfo(found);
          return "";
        }
        last_error = std::strerror(error);
      }
      ::freeaddrinfo(found);
    }
    if (Clock::now() >= deadline) return last_error;
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - Clock::now()));
    pause = std::min(pause * 2, std::chrono::milliseconds(200));
  }
}

std::unique_ptr<ServerCloseWatch> ServerCloseWatch::open(const std::string& host, int port,
                                                         Clock::time_point deadline) {
  std::string error;
  addrinfo* found = resolve(host, port, error);
  int fd = -1;
  for (addrinfo* address = found; address != nullptr && fd < 0; address = address->ai_next) {
    try_connect(*address, deadline, &fd);
  }
  if (found != nullptr) ::freeaddrinfo(found);
  if (fd < 0) return nullptr;
  return std::unique_ptr<ServerCloseWatch>(new ServerCloseWatch(fd, host, port));
}

ServerCloseWatch::~ServerCloseWatch() { ::close(fd_); }

bool ServerCloseWatch::wait_closed(Clock::time_point deadline) const {
  // Nothing was sent, so the server sends nothing: readable means closed (end of file or reset).
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    pollfd watched{fd_, POLLIN | POLLRDHUP, 0};
    int ready = ::poll(&watched, 1, static_cast<int>(std::max<int64_t>(left.count(), 0)));
    if (ready == 1) return true;
    if (ready == 0) return false;
    if (errno != EINTR) return true;  // nothing more to learn from this socket
  }
}

}  // namespace ddp::rendezvous
