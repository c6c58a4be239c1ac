// HostTopology: which ranks of a group share a host, and so a shared-memory segment.
//
// Hosts are told apart by an identity string per rank (local_host_identity(), read at init): two
// ranks are on one host when they can share a POSIX shared-memory segment and see each other's
// pids. Hosts are numbered in order of their lowest group rank; a host's leader is its lowest
// group rank. Plain data, thread-compatible.
#pragma once

#include <chrono>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

namespace ddp::detail {

struct HostTopology {
  std::vector<int> host_of;               // group rank -> host index
  std::vector<std::vector<int>> members;  // host index -> its group ranks, ascending

  int hosts() const { return static_cast<int>(members.size()); }
  int leader(int host) const { return members[host].front(); }
  /// Index of `group_rank` among its host's ranks.
  int local_rank(int group_rank) const;
  /// True when some host holds two or more ranks: shared memory has something to do.
  bool any_host_shared() const;

  static HostTopology from_ids(const std::vector<std::string>& host_id_by_rank);
};

/// This process's host identity: `declared` when not empty (DDP_CPP_HOST_ID, read at the edge: a
/// testing aid, ranks of one machine that declare different ids act as different hosts);
/// otherwise the hostname, the boot id, the device of /dev/shm and the pid namespace, so that
/// containers sharing a hostname but not /dev/shm or pids are not mistaken for one host.
std::string local_host_identity(const std::string& declared);

/// Collective over the world: every rank publishes its host identity in the store and reads
/// everybody's, in rank order. Ranks that publish none within `timeout` are named in the error
/// (`operation` failed): torch.distributed ranks, which make no such exchange, end up there.
std::vector<std::string> exchange_host_ids(c10d::Store& store, int rank, int world_size,
                                           const std::string& host_id,
                                           std::chrono::milliseconds timeout,
                                           const std::string& operation);

}  // namespace ddp::detail
