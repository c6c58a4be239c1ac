// CUDA builds of libtorch: c10d's ProcessGroupNCCL as the backend of CUDA tensors.
#include "process_group/nccl/nccl_backend.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/cuda.h>

#include <cstdlib>
#include <map>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "common/error_context.h"
#include "process_group/c10d_backend.h"

namespace ddp::detail {
namespace {

std::string gpu_key(int rank) { return "ddp_nccl_gpu/" + std::to_string(rank); }

// Every member publishes the UUID of its current GPU. Returns "" when each has its own, else
// which two share one (NCCL would refuse them at the first collective, less clearly).
std::string shared_gpu(c10d::Store& store, int group_rank, int group_size,
                       std::chrono::milliseconds timeout, const std::string& operation) {
  const int device = c10::cuda::current_device();
  const auto& uuid = at::cuda::getDeviceProperties(device)->uuid;
  std::string mine(uuid.bytes, uuid.bytes + sizeof(uuid.bytes));
  mine += "cuda:" + std::to_string(device);  // for the message: the rest is the identity
  store.set(gpu_key(group_rank), std::vector<uint8_t>(mine.begin(), mine.end()));
  std::vector<std::string> keys;
  for (int rank = 0; rank < group_size; ++rank) keys.push_back(gpu_key(rank));
  try {
    store.wait(keys, timeout);
  } catch (const std::exception& error) {
    rethrow_backend_failure(operation + " (every rank saying which GPU it uses for NCCL)", error);
  }
  std::map<std::string, int> first_user;
  for (int rank = 0; rank < group_size; ++rank) {
    auto value = store.get(gpu_key(rank));
    std::string gpu(value.begin(), value.end());
    auto [seen, fresh] = first_user.emplace(gpu.substr(0, sizeof(uuid.bytes)), rank);
    if (!fresh) {
      return "group ranks " + std::to_string(seen->second) + " and " + std::to_string(rank) +
             " both use the same GPU (" + gpu.substr(sizeof(uuid.bytes)) + " there)";
    }
  }
  return "";
}

}  // namespace

bool nccl_compiled_in() { return true; }

int visible_gpus() { return static_cast<int>(torch::cuda::device_count()); }

std::shared_ptr<Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                           int group_rank, int group_size,
                                           std::chrono::milliseconds timeout,
                                           const std::string& operation, bool required) {
  if (visible_gpus() == 0) {
    fail(operation,
         "backend 'nccl' needs a GPU, and this process sees none (CUDA_VISIBLE_DEVICES, the "
         "driver); use backend \"gloo\" or \"auto\" on machines without GPUs");
  }
  const std::string shared = shared_gpu(*store, group_rank, group_size, timeout, operation);
  if (!shared.empty() && !required) return nullptr;
  if (!shared.empty()) {
    fail(operation, shared +
                        ", and NCCL needs one GPU per rank. Call ddp::set_device() before "
                        "init_process_group so that each rank takes its own GPU "
                        "(cuda:LOCAL_RANK), start at most one rank per GPU, or let ranks share "
                        "a GPU through backend(\"gloo\") (or \"auto\", which does).");
  }
  // c10d reads its error handling from the environment when the group is made. A failed or
  // timed-out NCCL collective must surface as an error of the call that waits for it, not take
  // the process down from c10d's watchdog thread: CleanUpOnly (2) aborts the communicators and
  // leaves the failure on the work. A user's own setting stays.
  setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2", /*overwrite=*/0);
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  C10dTraits traits;
  traits.name = "nccl";
  traits.device = c10::DeviceType::CUDA;
  traits.reduce_scatters = true;
  traits.averages = true;
  traits.barrier = false;  // barriers go to the CPU backend: no device to pick, no stream to sync
  try {
    return std::make_shared<C10dBackend>(
        c10::make_intrusive<c10d::ProcessGroupNCCL>(store, group_rank, group_size, options),
        std::move(traits));
  } catch (const std::exception& error) {
    rethrow_backend_failure(operation + " (creating the NCCL group)", error);
  }
}

}  // namespace ddp::detail
