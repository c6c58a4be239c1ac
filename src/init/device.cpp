// set_device without CUDA headers: libtorch's device guard interface reaches the CUDA runtime
// where it is loaded, so the same code builds against CPU and CUDA libtorch.
#include "ddp/device.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/cuda.h>

#include "common/error_context.h"
#include "rendezvous/rendezvous_spec.h"

namespace ddp {

int cuda_device_count() { return static_cast<int>(torch::cuda::device_count()); }

c10::Device set_device(int local_rank) {
  if (local_rank < 0) {
    local_rank = rendezvous::local_rank_from(rendezvous::process_environment()).value_or(0);
  }
  const int gpus = cuda_device_count();
  if (gpus == 0) return c10::Device(c10::kCPU);
  if (local_rank >= gpus) {
    detail::fail("set_device", "local rank " + std::to_string(local_rank) + " has no GPU: this " +
                                   "process sees " + std::to_string(gpus) +
                                   " (CUDA_VISIBLE_DEVICES). Start at most one rank per GPU "
                                   "(ddprun --nproc-per-node " +
                                   std::to_string(gpus) + "), or train on the CPU.");
  }
  const c10::Device device(c10::kCUDA, static_cast<c10::DeviceIndex>(local_rank));
  c10::impl::getDeviceGuardImpl(c10::kCUDA)->setDevice(device);
  return device;
}

}  // namespace ddp
