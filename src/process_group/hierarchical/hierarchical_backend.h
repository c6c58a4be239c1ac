// HierarchicalBackend: all_reduce, broadcast, the flat all-gather and reduce-scatter for a group
// whose ranks span several hosts.
//
// An all_reduce reduces within each host through shared memory (shm_communicator.h), between one
// leader per host through a gloo group of the leaders, and broadcasts the result back within
// each host; a broadcast goes from the root to its host's leader, across the leaders, and down
// each host. Each host's bytes cross the network once, not once per rank. It takes dense CPU
// tensors and those collectives only; the group gives the others to its flat gloo group.
//
// A collective that fails on one host fails on every host at once: that host's leader records
// why in the leaders' store and closes its connections to the other leaders, whose gloo calls
// then fail at once (instead of at the timeout); each of them breaks its own host's
// shared-memory group in turn, and every rank's error names the first failure. The backend is
// broken for good after that.
//
// Thread-safety: as ShmBackend's: calls run in issue order on the backend's op queue.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "process_group/backend.h"
#include "process_group/shm/host_topology.h"
#include "process_group/shm/shm_communicator.h"

namespace ddp::detail {

class OpQueue;

struct HierarchySetup {
  HostTopology topology;          // over the group's ranks
  std::vector<int> global_ranks;  // group rank -> global rank, for messages
  ShmGroupSetup shm;              // job, attempt, group name and timeout of the segments
  // Makes a gloo group over (store, rank, size): the leaders' group. Collective over them.
  std::function<std::shared_ptr<Backend>(const c10::intrusive_ptr<c10d::Store>&, int rank,
                                         int size)>
      make_gloo;
};

class HierarchicalBackend : public Backend {
 public:
  /// Collective over the group's members.
  HierarchicalBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, HierarchySetup setup,
                      const std::string& operation);
  ~HierarchicalBackend() override;

  std::string name() const override { return "hierarchical"; }
  bool takes(Collective collective, const at::Tensor& like) const override;
  /// As its leaders' gloo group: no bfloat16.
  bool reduces(c10::ScalarType dtype) const override { return dtype != c10::kBFloat16; }

  BackendWork all_reduce(at::Tensor& tensor, RedOp op, Launch launch) override;
  BackendWork broadcast(at::Tensor& tensor, int root, Launch launch) override;
  /// Gathered inside each host through shared memory, then across the leaders, one block per
  /// host (padded to the largest host), then down each host: each host's bytes cross once.
  BackendWork all_gather_into_tensor(at::Tensor& output, at::Tensor& input, Launch launch) override;
  /// Reduced inside each host through shared memory; then each leader sends every other host's
  /// leader only the runs of that host's ranks and adds up what it receives, in host order; then
  /// down each host. Each leader sends (hosts - 1) / hosts of the input (padded to the widest
  /// host) across the network, where an all-reduce of it would send about twice that. The flat
  /// form (reduce_scatter_tensor) goes through this one with views of the input's runs.
  BackendWork reduce_scatter(at::Tensor& output, std::vector<at::Tensor>& inputs, RedOp op,
                             Launch launch) override;
  /// Full precision inside each host; the leaders gather every host's average narrowed to
  /// `wire` and add them up in the tensor's dtype, in host order.
  BackendWork all_reduce_narrow_between_hosts(at::Tensor& tensor, c10::ScalarType wire,
                                              int64_t divisor, Launch launch) override;

  /// The bytes this rank, as its host's leader, has handed the leaders' group to carry to the
  /// other hosts: each collective's payload (a ring all-reduce sends about twice it) and each
  /// send. Zero on the other ranks. For tests and statistics; any thread.
  uint64_t bytes_handed_between_hosts() const {
    return bytes_between_hosts_.load(std::memory_order_relaxed);
  }

 private:
  // Run on the op queue.
  void all_reduce_now(const at::Tensor& tensor, RedOp op);
  void broadcast_now(const at::Tensor& tensor, int root);
  void all_gather_into_tensor_now(const at::Tensor& output, const at::Tensor& input);
  void reduce_scatter_now(const at::Tensor& output, const std::vector<at::Tensor>& inputs,
                          RedOp op);
  // On a leader: this host's block of `blocks` (one block per host, in host order), reduced
  // over the hosts in host order where it lies (the view is returned); each other host's block
  // is sent to its leader.
  at::Tensor reduce_blocks_across_leaders(const at::Tensor& blocks, RedOp op,
                                          const char* operation);
  void all_reduce_narrow_now(at::Tensor tensor, c10::ScalarType wire, int64_t divisor);
  // On a leader: `narrow` summed over the hosts, in host order, into `tensor`.
  void add_up_across_leaders(at::Tensor& tensor, at::Tensor narrow, const char* operation);
  // The first failure breaks the group on every host at once.
  template <typename Body>
  void run_across_hosts(const char* operation, Body&& body);
  // Waits for a collective (or send, or receive) of the leaders, which this leader handed
  // `bytes_handed` to carry (bytes_handed_between_hosts); names another host's failure where that
  // caused it, or the hosts that went silent.
  void wait_for_leaders(const char* operation, const BackendWork& work, size_t bytes_handed);
  // The error of a failed exchange between the leaders, as wait_for_leaders raises it.
  [[noreturn]] void fail_between_hosts(const char* operation, const std::exception& error);
  // After the leaders' exchange failed without a recorded cause: this leader says it is still
  // here, and waits briefly for the others to say so. Returns the hosts that did not (their
  // processes are gone, or their link is down), and sets `cause` if one recorded a cause
  // meanwhile. Empty when the leaders' store cannot be reached either.
  std::vector<int> hosts_gone_silent(std::string& cause);
  // "host 1 (ranks 2, 3)", in global ranks.
  std::string describe_host(int host) const;

  int rank_;
  HostTopology topology_;
  std::vector<int> global_ranks_;  // group rank -> global rank, for messages
  int host_ = 0;
  std::shared_ptr<Backend> leaders_;               // host leaders' gloo group, on leaders
  c10::intrusive_ptr<c10d::Store> leaders_store_;  // theirs, for the first failure's cause
  std::string broken_;                      // why a collective failed; then every later one fails
  std::unique_ptr<ShmCommunicator> local_;  // this host's members, when two or more
  std::atomic<uint64_t> bytes_between_hosts_{0};
  std::shared_ptr<OpQueue> queue_;
};

}  // namespace ddp::detail
