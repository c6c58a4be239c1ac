#include "process_group/gloo/gloo_address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

namespace ddp::detail {
namespace {

std::string numeric(const sockaddr* address) {
  char text[INET6_ADDRSTRLEN] = {};
  const void* raw =
      address->sa_family == AF_INET
          ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(address)->sin_addr)
          : static_cast<const void*>(&reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr);
  return inet_ntop(address->sa_family, raw, text, sizeof(text)) ? text : "";
}

bool is_loopback(const sockaddr* address) {
  if (address->sa_family == AF_INET) {
    return (ntohl(reinterpret_cast<const sockaddr_in*>(address)->sin_addr.s_addr) >> 24) == 127;
  }
  return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr);
}

// A UDP socket "connected" to the host sends nothing; the kernel only picks the route and with it
// the source address, which getsockname() then reports.
std::string source_address_towards(const addrinfo& target) {
  const int fd = ::socket(target.ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return "";
  std::string found;
  sockaddr_storage local{};
  socklen_t length = sizeof(local);
  if (::connect(fd, target.ai_addr, target.ai_addrlen) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0 &&
      !is_loopback(reinterpret_cast<sockaddr*>(&local))) {
    found = numeric(reinterpret_cast<sockaddr*>(&local));
  }
  ::close(fd);
  return found;
}

// IPv4 first, as gloo's default device does.
std::string first_interface_address() {
  ifaddrs* interfaces = nullptr;
  if (::getifaddrs(&interfaces) != 0) return "";
  std::string found;
  for (int family : {AF_INET, AF_INET6}) {
    for (ifaddrs* i = interfaces; i != nullptr && found.empty(); i = i->ifa_next) {
      if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != family) continue;
      if ((i->ifa_flags & IFF_UP) == 0 || (i->ifa_flags & IFF_LOOPBACK) != 0) continue;
      if (family == AF_INET6 &&
          IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr)) {
        continue;  // a link-local address needs a scope that gloo's hostname device cannot take
      }
      found = numeric(i->ifa_addr);
    }
  }
  ::freeifaddrs(interfaces);
  return found;
}

}  // namespace

std::string address_facing(const std::string& rendezvous_host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* targets = nullptr;
  if (::getaddrinfo(rendezvous_host.c_str(), "9", &hints, &targets) != 0) return "";
  std::string found;
  bool to_this_host = false;
  for (addrinfo* target = targets; target != nullptr && found.empty(); target = target->ai_next) {
    if (is_loopback(target->ai_addr)) {
      to_this_host = true;
      continue;
    }
    found = source_address_towards(*target);
  }
  ::freeaddrinfo(targets);
  if (found.empty() && to_this_host) found = first_interface_address();
  return found;
}

}  // namespace ddp::detail
