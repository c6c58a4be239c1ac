// The address gloo listens on when no interface is named: the one facing the rendezvous host.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <string>

#include "process_group/gloo/gloo_address.h"

namespace ddp::detail {
namespace {

// This machine's IPv4 addresses on interfaces that are up and not loopback.
std::vector<std::string> interface_addresses() {
  std::vector<std::string> found;
  ifaddrs* interfaces = nullptr;
  if (getifaddrs(&interfaces) != 0) return found;
  for (ifaddrs* i = interfaces; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    if ((i->ifa_flags & IFF_UP) == 0 || (i->ifa_flags & IFF_LOOPBACK) != 0) continue;
    char text[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, text, sizeof(text));
    found.push_back(text);
  }
  freeifaddrs(interfaces);
  return found;
}

TEST(GlooAddress, TheAddressFacingOneOfThisHostsAddressesIsThatAddress) {
  const auto addresses = interface_addresses();
  if (addresses.empty()) GTEST_SKIP() << "no interface but loopback here";
  for (const std::string& address : addresses) EXPECT_EQ(address_facing(address), address);
}

TEST(GlooAddress, ALoopbackRendezvousOnAMultiHostJobFallsBackToAnInterfaceThatIsUp) {
  // MASTER_ADDR naming this host through Debian's "127.0.1.1 hostname" line: listening on
  // loopback would shut the other hosts out, so an address of a real interface is taken.
  const auto addresses = interface_addresses();
  if (addresses.empty()) GTEST_SKIP() << "no interface but loopback here";
  const std::string chosen = address_facing("127.0.1.1");
  EXPECT_NE(chosen.rfind("127.", 0), 0u) << chosen;
  EXPECT_FALSE(chosen.empty());
}

TEST(GlooAddress, AHostThatDoesNotResolveGivesNoAddress) {
  EXPECT_EQ(address_facing("no-such-host.invalid"), "");
}

}  // namespace
}  // namespace ddp::detail
