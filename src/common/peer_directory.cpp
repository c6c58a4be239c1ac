#include "common/peer_directory.h"

#include <unistd.h>

#include <cctype>
#include <climits>
#include <map>
#include <mutex>
#include <sstream>

namespace ddp::detail {
namespace {

std::mutex directory_mutex;
std::map<std::string, PeerIdentity> peers_by_address;  // guarded by directory_mutex

// gloo appends "$<sequence>" to an address that is not connected yet; a connection's is bare.
std::string bare(const std::string& address) { return address.substr(0, address.find('$')); }

// True when `address` occurs in `text` as a whole: "[127.0.0.1]:6522" is not in
// "[127.0.0.1]:65220".
bool names(const std::string& text, const std::string& address) {
  for (auto at = text.find(address); at != std::string::npos; at = text.find(address, at + 1)) {
    const auto end = at + address.size();
    if (end == text.size() || !std::isdigit(static_cast<unsigned char>(text[end]))) return true;
  }
  return false;
}

}  // namespace

std::string PeerIdentity::describe() const {
  return "rank " + std::to_string(rank) + " (pid " + std::to_string(pid) + " on " + host + ")";
}

std::string PeerIdentity::text() const {
  return std::to_string(rank) + " " + std::to_string(pid) + " " + host;
}

PeerIdentity PeerIdentity::parse(const std::string& text) {
  PeerIdentity peer;
  std::istringstream in(text);
  in >> peer.rank >> peer.pid >> peer.host;
  return peer;
}

PeerIdentity PeerIdentity::of_this_process(int rank) {
  char host[HOST_NAME_MAX + 1] = {};
  ::gethostname(host, sizeof(host) - 1);
  PeerIdentity me;
  me.rank = rank;
  me.pid = ::getpid();
  me.host = host;
  return me;
}

void remember_peer_address(const std::string& address, const PeerIdentity& peer) {
  std::lock_guard<std::mutex> lock(directory_mutex);
  peers_by_address[bare(address)] = peer;
}

std::optional<PeerIdentity> peer_named_in(const std::string& text) {
  std::lock_guard<std::mutex> lock(directory_mutex);
  for (const auto& [address, peer] : peers_by_address) {
    if (!address.empty() && names(text, address)) return peer;
  }
  return std::nullopt;
}

void forget_peer_addresses() {
  std::lock_guard<std::mutex> lock(directory_mutex);
  peers_by_address.clear();
}

}  // namespace ddp::detail
