#include "process_group/backend_factory.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "common/error_context.h"
#include "compat/libtorch_compat.h"
#include "process_group/gpu_inventory.h"
#include "process_group/hierarchical/hierarchical_backend.h"
#include "process_group/nccl/nccl_backend.h"
#include "process_group/shm/host_topology.h"
#include "process_group/shm/shm_backend.h"

namespace ddp::detail {
namespace {

HostTopology topology_of(const BackendChoice& choice, const std::vector<int>& global_ranks) {
  std::vector<std::string> ids;
  for (int rank : global_ranks) ids.push_back(choice.host_ids[rank]);
  return HostTopology::from_ids(ids);
}

ShmGroupSetup shm_setup(const BackendChoice& choice, const GroupState& group) {
  ShmGroupSetup setup;
  setup.job = choice.job;
  setup.attempt = choice.attempt;
  setup.group = group.name;
  setup.timeout = group.timeout;
  return setup;
}

// Shared memory (one host) or the hierarchy (several), for CPU tensors; null where neither is
// asked for or helps.
std::shared_ptr<Backend> make_shared_memory_backend(const BackendChoice& choice,
                                                    const GroupState& group,
                                                    const std::string& operation) {
  if (choice.name == "gloo" || choice.name == "nccl") return nullptr;
  HostTopology topology = topology_of(choice, group.global_ranks);
  if (choice.name == "auto" && !topology.any_host_shared()) return nullptr;
  if (topology.hosts() == 1) {
    ShmGroupSetup setup = shm_setup(choice, group);
    setup.local_rank = group.group_rank;
    setup.global_ranks = group.global_ranks;
    return std::make_shared<ShmBackend>(*group.store, group.group_rank, setup, operation);
  }
  HierarchySetup setup;
  setup.topology = std::move(topology);
  setup.global_ranks = group.global_ranks;
  setup.shm = shm_setup(choice, group);
  const auto timeout = group.timeout;
  const auto device = choice.gloo_device;
  setup.make_gloo = [timeout, device, operation](const c10::intrusive_ptr<c10d::Store>& store,
                                                 int rank, int size) {
    return make_gloo_backend(store, rank, size, timeout, device, operation);
  };
  return std::make_shared<HierarchicalBackend>(group.store, group.group_rank, std::move(setup),
                                               operation);
}

// "auto" gives CUDA tensors to NCCL where every member has a GPU of its own (gpu_inventory.h).
bool every_member_has_its_own_gpu(const BackendChoice& choice, const GroupState& group) {
  if (!nccl_compiled_in() || choice.gpu_ids.empty()) return false;
  std::vector<std::string> gpus;
  for (int rank : group.global_ranks) gpus.push_back(choice.gpu_ids[rank]);
  return why_members_lack_own_gpu(gpus).empty();
}

// Host id and GPU identity travel in one value per rank: one exchange at init, not two.
constexpr char kFieldSeparator = '\x1f';

}  // namespace

std::string normalize_backend_name(const std::string& requested, const std::string& operation) {
  std::string name = requested;
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (name == "gloo" || name == "shm" || name == "hierarchical" || name == "auto") return name;
  if (name == "nccl") {
    if (nccl_compiled_in()) return name;
    fail<InvalidArgumentError>(
        operation,
        "backend 'nccl' is not available: this libtorch was built without CUDA, so ddp-cpp "
        "compiles NCCL out. Use backend \"gloo\" (or \"auto\"), or build against a CUDA "
        "libtorch (README: \"GPUs\").");
  }
  fail<InvalidArgumentError>(
      operation, "unknown backend '" + requested +
                     "'; known backends: \"gloo\", \"shm\", \"hierarchical\", \"auto\" and "
                     "\"nccl\" (CUDA builds of libtorch)");
}

bool needs_host_ids(const std::string& name) { return name != "gloo" && name != "nccl"; }

void learn_hosts(BackendChoice& choice, c10d::Store& store, int rank, int world_size,
                 std::chrono::milliseconds timeout, const std::string& operation) {
  const std::string mine =
      local_host_identity(choice.host_id) + kFieldSeparator + local_gpu_identity();
  choice.host_ids.clear();
  choice.gpu_ids.clear();
  for (const std::string& value :
       exchange_host_ids(store, rank, world_size, mine, timeout, operation)) {
    const auto separator = value.rfind(kFieldSeparator);
    choice.host_ids.push_back(value.substr(0, separator));
    choice.gpu_ids.push_back(separator == std::string::npos ? "" : value.substr(separator + 1));
  }
}

std::shared_ptr<Backend> make_flat_gloo(const BackendChoice& choice, const GroupState& group,
                                        const std::string& operation) {
  return make_gloo_backend(compat::device_backend_store(group.store, "cpu"), group.group_rank,
                           group.size(), group.timeout, choice.gloo_device, operation);
}

void make_group_backends(const BackendChoice& choice, std::shared_ptr<Backend> flat_gloo,
                         GroupState& group, const std::string& operation) {
  std::vector<std::shared_ptr<Backend>> backends;
  const bool required = choice.name == "nccl";
  if (required || (choice.name == "auto" && every_member_has_its_own_gpu(choice, group))) {
    if (auto nccl =
            make_nccl_backend(compat::device_backend_store(group.store, "cuda"), group.group_rank,
                              group.size(), group.timeout, operation, required)) {
      backends.push_back(std::move(nccl));
    }
  }
  const size_t cpu = backends.size();
  if (auto shared = make_shared_memory_backend(choice, group, operation)) {
    backends.push_back(std::move(shared));
  }
  backends.push_back(std::move(flat_gloo));
  // What get_backend() says: the user's "nccl"; where "auto" chose NCCL, both, as
  // torch.distributed words a backend per device ("cpu:gloo,cuda:nccl"); else the CPU backend.
  if (required) {
    group.backend_name = "nccl";
  } else if (cpu > 0) {
    group.backend_name = "cpu:" + backends[cpu]->name() + ",cuda:nccl";
  } else {
    group.backend_name = backends[cpu]->name();
  }
  group.backends = std::move(backends);
}

}  // namespace ddp::detail
