#include "process_group/shm/host_topology.h"

#include <map>

namespace ddp::detail {

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

std::vector<std::string> exchange_host_ids(c10d::Store& store, int rank, int world_size,
                                           const std::string& host_id) {
  store.set("ddp_host_id/" + std::to_string(rank),
            std::vector<uint8_t>(host_id.begin(), host_id.end()));
  std::vector<std::string> ids;
  for (int other = 0; other < world_size; ++other) {
    auto value = store.get("ddp_host_id/" + std::to_string(other));
    ids.emplace_back(value.begin(), value.end());
  }
  return ids;
}

}  // namespace ddp::detail
