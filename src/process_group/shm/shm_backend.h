// ShmBackend: the "shm" backend, for a group whose members all run on this host.
//
// all_reduce (also of lists of tensors, reduced where they are, with PREMUL_SUM), broadcast,
// all_gather, reduce_scatter and barrier run in shared memory (shm_communicator.h). It takes
// dense CPU tensors only; the group gives everything else (the other collectives, CUDA tensors)
// to the backends after it. A group of several hosts gets a HierarchicalBackend instead
// (hierarchical/hierarchical_backend.h).
//
// Thread-safety: as c10d's process groups: collectives may be issued from several threads; they
// run in issue order, one at a time, on the backend's op queue (op_queue.h).
#pragma once

#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "process_group/backend.h"
#include "process_group/shm/shm_communicator.h"

namespace ddp::detail {

class OpQueue;

/// Shared memory takes dense, contiguous CPU tensors.
bool fits_shm(const at::Tensor& tensor);

class ShmBackend : public Backend {
 public:
  /// Collective over the group's members, which share this host. `setup` names the segment;
  /// with one member there is none, and the calls are local.
  ShmBackend(c10d::Store& store, int rank, const ShmGroupSetup& setup,
             const std::string& operation);
  ~ShmBackend() override;

  std::string name() const override { return "shm"; }
  bool takes(Collective collective, const at::Tensor& like) const override;

  BackendWork all_reduce(at::Tensor& tensor, RedOp op, Launch launch) override;
  BackendWork broadcast(at::Tensor& tensor, int root, Launch launch) override;
  BackendWork all_gather(std::vector<at::Tensor>& outputs, at::Tensor& input,
                         Launch launch) override;
  BackendWork barrier(Launch launch) override;
  BackendWork reduce_scatter(at::Tensor& output, std::vector<at::Tensor>& inputs, RedOp op,
                             Launch launch) override;
  BackendWork all_reduce_lists(std::vector<at::Tensor> inputs, std::vector<at::Tensor> outputs,
                               RedOp op, double factor, Launch launch) override;
  /// One host: nothing crosses a network, so nothing is narrowed.
  BackendWork all_reduce_narrow_between_hosts(at::Tensor& tensor, c10::ScalarType wire,
                                              int64_t divisor, Launch launch) override;

 private:
  BackendWork enqueue(c10d::OpType type, Launch launch, std::function<void()> body);

  int rank_;
  int size_;
  std::unique_ptr<ShmCommunicator> local_;  // null for a group of one
  std::shared_ptr<OpQueue> queue_;
};

}  // namespace ddp::detail
