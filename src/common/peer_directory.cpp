#include "common/peer_directory.h"

#include <signal.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <climits>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

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

// "BOOT_ID/pid:[INODE]", or "" when /proc does not say. Read once: neither changes while the
// process lives, and it is compared for every peer at every look.
const std::string& this_pid_space() {
  static const std::string space = [] {
    std::ifstream boot_file("/proc/sys/kernel/random/boot_id");
    std::string boot_id;
    std::getline(boot_file, boot_id);
    char pid_namespace[64] = {};
    const auto length = ::readlink("/proc/self/ns/pid", pid_namespace, sizeof(pid_namespace) - 1);
    if (boot_id.empty() || length <= 0) return std::string();
    return boot_id + "/" + std::string(pid_namespace, static_cast<size_t>(length));
  }();
  return space;
}

// A process's state and start time, from /proc/PID/stat (the fields after its name, which may
// hold spaces and parentheses: they start after the last ')'). Nothing when it has no entry.
struct ProcessStat {
  char state = '?';
  unsigned long long start_time = 0;
};
std::optional<ProcessStat> stat_of(int pid) {
  std::ifstream stat_file("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  std::getline(stat_file, stat);
  const auto name_end = stat.rfind(')');
  if (name_end == std::string::npos || name_end + 2 >= stat.size()) return std::nullopt;
  std::istringstream fields(stat.substr(name_end + 2));
  ProcessStat found;
  fields >> found.state;
  // Fields 4 to 21 (man 5 proc) lie between the state (3) and the start time (22).
  std::string skipped;
  for (int field = 4; field <= 21; ++field) fields >> skipped;
  fields >> found.start_time;
  return found;
}

// A pid that means this peer: on this boot, in this PID namespace.
bool pid_means_it(const PeerIdentity& peer) {
  return peer.pid > 0 && !peer.pid_space.empty() && peer.pid_space == this_pid_space();
}

}  // namespace

std::string PeerIdentity::describe() const {
  return "rank " + std::to_string(rank) + " (pid " + std::to_string(pid) + " on " + host + ")";
}

std::string PeerIdentity::text() const {
  return std::to_string(rank) + " " + std::to_string(pid) + " " + host + " " +
         (pid_space.empty() ? "-" : pid_space) + " " + std::to_string(start_time);
}

PeerIdentity PeerIdentity::parse(const std::string& text) {
  PeerIdentity peer;
  std::istringstream in(text);
  in >> peer.rank >> peer.pid >> peer.host >> peer.pid_space >> peer.start_time;
  if (peer.pid_space == "-") peer.pid_space.clear();
  return peer;
}

PeerIdentity PeerIdentity::of_this_process(int rank) {
  char host[HOST_NAME_MAX + 1] = {};
  ::gethostname(host, sizeof(host) - 1);
  PeerIdentity me;
  me.rank = rank;
  me.pid = ::getpid();
  me.host = host;
  me.pid_space = this_pid_space();
  if (auto stat = stat_of(me.pid)) me.start_time = stat->start_time;
  return me;
}

bool PeerIdentity::known_to_have_exited() const {
  if (!pid_means_it(*this)) return false;
  if (::kill(pid, 0) == -1 && errno == ESRCH) return true;
  // A process that has exited but whose parent has not collected it yet (a zombie) still has a
  // pid; so has a later process that was given the same pid.
  const auto stat = stat_of(pid);
  if (!stat) return false;
  if (stat->state == 'Z' || stat->state == 'X') return true;
  return start_time != 0 && stat->start_time != start_time;
}

bool PeerIdentity::known_to_be_running() const {
  if (!pid_means_it(*this) || (::kill(pid, 0) == -1 && errno == ESRCH)) return false;
  const auto stat = stat_of(pid);
  return stat && stat->state != 'Z' && stat->state != 'X' &&
         (start_time == 0 || stat->start_time == start_time);
}

bool PeerIdentity::known_to_be_stopped() const {
  if (!pid_means_it(*this)) return false;
  const auto stat = stat_of(pid);
  return stat && (stat->state == 'T' || stat->state == 't') &&
         (start_time == 0 || stat->start_time == start_time);
}

std::string describe_stopped(const std::vector<PeerIdentity>& peers) {
  std::string stopped;
  for (const auto& peer : peers) {
    if (!peer.known_to_be_stopped()) continue;
    stopped += (stopped.empty() ? "" : " ") + peer.describe() +
               " is stopped (by SIGSTOP, Ctrl-Z or a debugger) and cannot answer until it is "
               "continued (kill -CONT " +
               std::to_string(peer.pid) + ") or ended.";
  }
  return stopped;
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

std::vector<PeerIdentity> known_peers() {
  std::lock_guard<std::mutex> lock(directory_mutex);
  std::vector<PeerIdentity> peers;
  std::set<std::string> listed;  // by identity text: one peer has an address per connection
  for (const auto& entry : peers_by_address) {
    if (listed.insert(entry.second.text()).second) peers.push_back(entry.second);
  }
  return peers;
}

std::optional<PeerIdentity> peer_known_to_have_exited(std::chrono::milliseconds patience) {
  const std::vector<PeerIdentity> peers = known_peers();
  const auto deadline = std::chrono::steady_clock::now() + patience;
  for (;;) {
    for (const auto& peer : peers) {
      if (peer.known_to_have_exited()) return peer;
    }
    if (peers.empty() || std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void forget_peer_addresses() {
  std::lock_guard<std::mutex> lock(directory_mutex);
  peers_by_address.clear();
}

}  // namespace ddp::detail
