#include "process_group/shm/host_topology.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <map>

#include "common/error_context.h"

namespace ddp::detail {
namespace {

std::string first_line_of(const char* path) {
  std::ifstream file(path);
  std::string line;
  std::getline(file, line);
  return line;
}

}  // namespace

std::string local_host_identity(const std::string& declared) {
  if (!declared.empty()) return declared;
  char name[256] = {0};
  if (gethostname(name, sizeof(name) - 1) != 0) name[0] = 0;
  // The hostname alone is not enough: containers with --network=host share it but may each have
  // their own /dev/shm (a segment made in one cannot be opened in the other) or their own pid
  // namespace (a peer's liveness is checked by pid). Ranks that differ in any of these are on
  // different "hosts" and meet through gloo.
  struct stat shm {};
  struct stat pids {};
  std::string id = std::string(name) + "/boot:" + first_line_of("/proc/sys/kernel/random/boot_id");
  if (stat("/dev/shm", &shm) == 0) {
    id += "/shm:" + std::to_string(static_cast<unsigned long long>(shm.st_dev));
  } else {
    id += "/no-shm:" + std::to_string(getpid());  // no shared memory: every rank on its own
  }
  if (stat("/proc/self/ns/pid", &pids) == 0) {
    id += "/pidns:" + std::to_string(static_cast<unsigned long long>(pids.st_ino));
  }
  return id;
}

int HostTopology::local_rank(int group_rank) const {
  const auto& mine = members[host_of[group_rank]];
  for (size_t i = 0; i < mine.size(); ++i) {
    if (mine[i] == group_rank) return static_cast<int>(i);
  }
  return -1;
}

bool HostTopology::any_host_shared() const {
  for (const auto& host : members) {
    if (host.size() > 1) return true;
  }
  return false;
}

HostTopology HostTopology::from_ids(const std::vector<std::string>& host_id_by_rank) {
  HostTopology topology;
  std::map<std::string, int> index;
  for (size_t rank = 0; rank < host_id_by_rank.size(); ++rank) {
    auto found = index.find(host_id_by_rank[rank]);
    int host;
    if (found == index.end()) {
      host = static_cast<int>(topology.members.size());
      index.emplace(host_id_by_rank[rank], host);
      topology.members.emplace_back();
    } else {
      host = found->second;
    }
    topology.host_of.push_back(host);
    topology.members[host].push_back(static_cast<int>(rank));
  }
  return topology;
}

namespace {

std::string host_id_key(int rank) { return "ddp_host_id/" + std::to_string(rank); }

}  // namespace

std::vector<std::string> exchange_host_ids(c10d::Store& store, int rank, int world_size,
                                           const std::string& host_id,
                                           std::chrono::milliseconds timeout,
                                           const std::string& operation) {
  store.set(host_id_key(rank), std::vector<uint8_t>(host_id.begin(), host_id.end()));
  std::vector<std::string> keys;
  for (int other = 0; other < world_size; ++other) keys.push_back(host_id_key(other));
  try {
    store.wait(keys, timeout);
  } catch (const c10::Error&) {
    std::string missing;
    for (int other = 0; other < world_size; ++other) {
      if (store.check({host_id_key(other)})) continue;
      missing += (missing.empty() ? "" : ", ") + std::to_string(other);
    }
    if (missing.empty()) throw;  // the store itself failed
    fail(operation,
         "rank(s) " + missing + " joined the group but did not say which host they are on within " +
             std::to_string(timeout.count()) +
             " ms. Backend \"auto\" and \"shm\" need every rank to be a ddp-cpp rank; a job "
             "with torch.distributed (Python) ranks must use backend(\"gloo\") on the ddp-cpp "
             "side.");
  }
  std::vector<std::string> ids;
  for (const auto& key : keys) {
    auto value = store.get(key);
    ids.emplace_back(value.begin(), value.end());
  }
  return ids;
}

}  // namespace ddp::detail
