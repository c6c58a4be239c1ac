#include "free_port.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace ddprun {

std::optional<int> PickFreePort(std::string* error) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *error = std::string("socket: ") + std::strerror(errno);
    return std::nullopt;
  }
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof(address);
  std::optional<int> port;
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    *error = std::string("bind 127.0.0.1:0: ") + std::strerror(errno);
  } else if (getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    *error = std::string("getsockname: ") + std::strerror(errno);
  } else {
    port = ntohs(address.sin_port);
  }
  close(fd);
  return port;
}

}  // namespace ddprun
