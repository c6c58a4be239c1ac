// CUDA builds of libtorch: c10d's ProcessGroupNCCL as the backend of CUDA tensors.
#include "process_group/nccl/nccl_backend.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/cuda.h>

#include <cstdio>
#include <cstdlib>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "common/error_context.h"
#include "process_group/c10d_backend.h"
#include "process_group/gpu_inventory.h"

namespace ddp::detail {
namespace {

std::string gpu_key(int rank) { return "ddp_nccl_gpu/" + std::to_string(rank); }

// backend("nccl"): every member publishes the GPU it uses; "" when each has its own, else why not
// (NCCL would refuse them at the first collective, less clearly).
std::string why_not_one_gpu_each(c10d::Store& store, int group_rank, int group_size,
                                 std::chrono::milliseconds timeout, const std::string& operation) {
  const std::string mine = local_gpu_identity();
  store.set(gpu_key(group_rank), std::vector<uint8_t>(mine.begin(), mine.end()));
  std::vector<std::string> keys;
  for (int rank = 0; rank < group_size; ++rank) keys.push_back(gpu_key(rank));
  try {
    store.wait(keys, timeout);
  } catch (const std::exception& error) {
    rethrow_backend_failure(operation + " (every rank saying which GPU it uses for NCCL)", error);
  }
  std::vector<std::string> gpus;
  for (const auto& key : keys) {
    auto value = store.get(key);
    gpus.emplace_back(value.begin(), value.end());
  }
  return why_members_lack_own_gpu(gpus);
}

// Destroys the communicators through c10d's shutdown() before the group goes: without it,
// libtorch 2.4 and later warn at every exit that the process group was not destroyed, and a
// communicator left to the destructor can block in NCCL's teardown.
class NcclBackend : public C10dBackend {
 public:
  NcclBackend(c10::intrusive_ptr<c10d::ProcessGroupNCCL> nccl, C10dTraits traits)
      : C10dBackend(nccl, std::move(traits)), nccl_(std::move(nccl)) {}
  ~NcclBackend() override {
    try {
      nccl_->shutdown();
    } catch (const std::exception& error) {
      std::fprintf(stderr, "ddp-cpp: shutting NCCL down: %s\n", error.what());
    }
  }

 private:
  c10::intrusive_ptr<c10d::ProcessGroupNCCL> nccl_;
};

}  // namespace

bool nccl_compiled_in() { return true; }

int visible_gpus() { return static_cast<int>(torch::cuda::device_count()); }

std::string local_gpu_identity() {
  if (visible_gpus() == 0) return "";
  const int device = c10::cuda::current_device();
  const auto& uuid = at::cuda::getDeviceProperties(device)->uuid;
  static const char kHex[] = "0123456789abcdef";
  std::string identity;
  for (char byte : uuid.bytes) {
    identity += kHex[(static_cast<unsigned char>(byte) >> 4) & 0xf];
    identity += kHex[static_cast<unsigned char>(byte) & 0xf];
  }
  return identity + "@cuda:" + std::to_string(device);
}

void prepare_nccl_error_handling() {
  // c10d reads its error handling from the environment when an NCCL group is made, and setenv
  // races with every thread that reads the environment: set before any thread of ours starts.
  // CleanUpOnly (2): a failed or timed-out NCCL collective aborts its communicators and stays on
  // its work, where our wait raises it as an error of the call (work.cpp), instead of taking the
  // process down from c10d's watchdog thread. A user's own setting stays.
  setenv(compat::kNcclErrorHandlingVariable, "2", /*overwrite=*/0);
}

std::shared_ptr<Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                           int group_rank, int group_size,
                                           std::chrono::milliseconds timeout,
                                           const std::string& operation, bool required) {
  if (visible_gpus() == 0) {
    fail(operation,
         "backend 'nccl' needs a GPU, and this process sees none (CUDA_VISIBLE_DEVICES, the "
         "driver); use backend \"gloo\" or \"auto\" on machines without GPUs");
  }
  if (required) {
    const std::string why_not =
        why_not_one_gpu_each(*store, group_rank, group_size, timeout, operation);
    if (!why_not.empty()) {
      fail(operation, why_not +
                          ", and NCCL needs a GPU of its own for every rank. Call "
                          "ddp::set_device() before init_process_group so that each rank takes "
                          "its own GPU, start at most one rank per GPU, or let ranks share a GPU "
                          "through backend(\"gloo\") (or \"auto\", which does).");
    }
  }
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  C10dTraits traits;
  traits.name = "nccl";
  traits.device = c10::DeviceType::CUDA;
  traits.reduce_scatters = true;
  traits.flat_calls = true;
  traits.averages = true;
  // A barrier all-reduces on this rank's GPU and completes when the GPU has done it, ordering
  // the GPU's work as torch.distributed's NCCL barrier does.
  traits.barrier_device = c10::cuda::current_device();
  traits.completes_on_device = true;
  try {
    return std::make_shared<NcclBackend>(
        c10::make_intrusive<c10d::ProcessGroupNCCL>(store, group_rank, group_size, options),
        std::move(traits));
  } catch (const std::exception& error) {
    rethrow_backend_failure(operation + " (creating the NCCL group)", error);
  }
}

}  // namespace ddp::detail
