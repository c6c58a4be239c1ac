// Which backends a group gets, and making them.
//
// init_process_group and new_group name a backend ("auto", "gloo", "shm", "hierarchical",
// "nccl"); this file turns the name and where the ranks are into the group's ordered list of
// backends (group_state.h):
//   gloo          gloo
//   shm           shm on one host; hierarchical (shm inside each host, gloo between them) when
//                 the group spans hosts; then gloo for the collectives shared memory lacks
//   hierarchical  the same (the name says what "shm" becomes across hosts)
//   nccl          NCCL for CUDA tensors, gloo for CPU ones (PyTorch's "cpu:gloo,cuda:nccl")
//   auto          NCCL for CUDA tensors where libtorch has CUDA and every member has a GPU of its
//                 own, told apart by UUID (else CUDA tensors go through the host); shm or
//                 hierarchical where some host runs two or more of the group's ranks; gloo
// A flat gloo group over every member is always made, first: its rendezvous names the ranks
// that never arrive, and it carries what the others do not.
#pragma once

#include <chrono>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "process_group/gloo/gloo_backend.h"
#include "process_group/group_state.h"

namespace ddp::detail {

/// How this job's groups get their backends; settled by init_process_group.
struct BackendChoice {
  std::string name;                   // normalized: "auto", "gloo", "shm", "hierarchical", "nccl"
  GlooDeviceChoice gloo_device;       // the network interface gloo binds to
  std::string host_id;                // this process's host identity (host_topology.h)
  std::vector<std::string> host_ids;  // by global rank; empty until learned
  std::vector<std::string> gpu_ids;   // by global rank: its GPU (gpu_inventory.h), "" for none
  std::string job;                    // names the shared-memory segments: the run id
  int attempt = 0;                    // and the restart count
};

/// Lower-cased and checked: throws DistributedError naming the known backends, or saying that
/// "nccl" needs a CUDA build of libtorch.
std::string normalize_backend_name(const std::string& requested, const std::string& operation);

/// True when `name` needs to know which host every rank is on.
bool needs_host_ids(const std::string& name);

/// Collective over the world: learns every rank's host identity and GPU into choice.host_ids and
/// choice.gpu_ids.
void learn_hosts(BackendChoice& choice, c10d::Store& store, int rank, int world_size,
                 std::chrono::milliseconds timeout, const std::string& operation);

/// Collective over the group's members: makes the flat gloo group of every member. Made first,
/// before anything else is exchanged: its rendezvous names the ranks that never arrive.
std::shared_ptr<Backend> make_flat_gloo(const BackendChoice& choice, const GroupState& group,
                                        const std::string& operation);

/// Collective over the group's members: makes group.backends around the flat gloo group and
/// sets group.backend_name. REQUIRES: group.store, group_rank, global_ranks and timeout set;
/// host ids learned where needs_host_ids(choice.name).
void make_group_backends(const BackendChoice& choice, std::shared_ptr<Backend> flat_gloo,
                         GroupState& group, const std::string& operation);

}  // namespace ddp::detail
