// ShmProcessGroup: the "shm" backend, a c10d::ProcessGroup for ranks that share hosts.
//
// On one host, all_reduce (also of a list of tensors: allreduce_coalesced), broadcast, all_gather,
// reduce_scatter and barrier run in shared memory (shm_communicator.h). When the group spans
// several hosts, all_reduce and broadcast become hierarchical: within each host through shared
// memory, between one leader per host through a gloo group of the leaders, and back within the
// host; the other collectives of a multi-host group, and every collective shared memory does not
// implement (reduce, gather, scatter, send/recv, all_to_all, the base variants,
// allgather_coalesced), go to a flat gloo group of all members, transparently. Nothing above
// this class knows which transport carried a call. A hierarchical collective that fails on one
// host fails on every host at once: that host's leader closes its connections to the others.
//
// Thread-safety: as c10d's process groups: collectives may be issued from several threads; they
// run in issue order, one at a time, on the group's op queue (op_queue.h).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "process_group/shm/host_topology.h"
#include "process_group/shm/shm_communicator.h"

namespace ddp::detail {

class OpQueue;

struct ShmGroupOptions {
  std::string job;    // run id, names the segments
  int attempt = 0;    // restart count
  std::string group;  // the group's name
  std::chrono::milliseconds timeout{0};
  HostTopology topology;                        // over the group's ranks
  std::vector<int> global_ranks;                // group rank -> global rank, for messages
  c10::intrusive_ptr<c10d::ProcessGroup> gloo;  // flat gloo over every member, already made
  // Makes a gloo group over (store, rank, size): the leaders' group.
  std::function<c10::intrusive_ptr<c10d::ProcessGroup>(const c10::intrusive_ptr<c10d::Store>&,
                                                       int rank, int size)>
      make_gloo;
};

class ShmProcessGroup : public c10d::ProcessGroup {
 public:
  /// Collective over the group's members.
  ShmProcessGroup(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                  ShmGroupOptions options, const std::string& operation);
  ~ShmProcessGroup() override;

  const std::string getBackendName() const override { return "shm"; }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

  /// On one host: the tensors (dense, CPU, of one dtype) reduced in place as one run of
  /// elements, without a flat copy; SUM, ..., and PREMUL_SUM with a double factor (floats and
  /// doubles), which gloo lacks. Across hosts, through the flat gloo group.
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;

  /// True when `backend` is a ShmProcessGroup on one host: its allreduce_coalesced then works in
  /// place on the tensors and takes PREMUL_SUM, and premul_sum_into works (what DDP's reducer asks
  /// before it skips buckets).
  static bool reduces_lists_in_place(const c10d::ProcessGroup& backend);
  /// Only where reduces_lists_in_place: outputs[i] = sum over ranks of inputs[i] * factor (each
  /// product rounded, summed in rank order), the lists reduced as one run of elements. The inputs
  /// are only read, and only while the op runs; outputs[i] may be inputs[i]. Not c10d's interface:
  /// DDP's reducer reads gradients that autograd may still read too, and writes their averages
  /// elsewhere (into the bucket or a tensor of its own).
  c10::intrusive_ptr<c10d::Work> premul_sum_into(std::vector<at::Tensor> inputs,
                                                 std::vector<at::Tensor> outputs, double factor);

  // Through the flat gloo group.
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override;
  void setSequenceNumberForGroup() override;
  uint64_t getSequenceNumberForGroup() override;

  /// True when every member is on this host: no collective needs the network.
  bool single_host() const { return topology_.hosts() == 1; }

 private:
  c10::intrusive_ptr<c10d::Work> enqueue(c10d::OpType type, std::function<void()> body);
  // Tensor lists shared memory can take: on one host, dense CPU, one dtype.
  bool fits_lists(const std::vector<at::Tensor>& tensors) const;
  c10::intrusive_ptr<c10d::Work> all_reduce_lists(std::vector<at::Tensor> inputs,
                                                  std::vector<at::Tensor> outputs,
                                                  c10d::ReduceOp::RedOpType op, double factor);
  // Run on the op queue.
  void all_reduce_now(at::Tensor& tensor, c10d::ReduceOp::RedOpType op,
                      const char* operation = "all_reduce");
  void broadcast_now(at::Tensor& tensor, int root);
  // A collective of several hosts: the first failure breaks the group on every host at once.
  template <typename Body>
  void run_across_hosts(const char* operation, Body&& body);
  // Waits for a collective of the leaders; names another host's failure where that caused it.
  void wait_for_leaders(const char* operation, const c10::intrusive_ptr<c10d::Work>& work);

  HostTopology topology_;
  int host_ = 0;
  c10::intrusive_ptr<c10d::ProcessGroup> gloo_;     // every member
  c10::intrusive_ptr<c10d::ProcessGroup> leaders_;  // host leaders, when several hosts
  c10::intrusive_ptr<c10d::Store> leaders_store_;   // theirs, for the first failure's cause
  std::string broken_;  // why a collective across hosts failed; then every later one fails
  std::unique_ptr<ShmCommunicator> local_;  // this host's members, when two or more
  std::shared_ptr<OpQueue> queue_;
};

}  // namespace ddp::detail
