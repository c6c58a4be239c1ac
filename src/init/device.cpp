// set_device without CUDA headers: libtorch's device guard interface reaches the CUDA runtime
// where it is loaded, so the same code builds against CPU and CUDA libtorch.
#include "ddp/device.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/cuda.h>

#include "common/error_context.h"
#include "rendezvous/rendezvous_spec.h"

namespace ddp {

int cuda_device_count() { return static_cast<int>(torch::cuda::device_count()); }

int cuda_device_index_for(int local_rank, int gpus) {
  if (gpus <= 0) return -1;
  // A process that sees one GPU was given it (CUDA_VISIBLE_DEVICES per rank): it is cuda:0 there,
  // whatever the rank's place on the host.
  if (gpus == 1) return 0;
  if (local_rank >= gpus) {
    detail::fail("set_device", "local rank " + std::to_string(local_rank) + " has no GPU: this " +
                                   "process sees " + std::to_string(gpus) +
                                   " (CUDA_VISIBLE_DEVICES). Start at most one rank per GPU "
                                   "(ddprun --nproc-per-node " +
                                   std::to_string(gpus) + "), or train on the CPU.");
  }
  return local_rank;
}

c10::Device set_device(int local_rank) {
  if (local_rank < 0) {
    local_rank = rendezvous::local_rank_from(rendezvous::process_environment()).value_or(0);
  }
  const int index = cuda_device_index_for(local_rank, cuda_device_count());
  if (index < 0) return c10::Device(c10::kCPU);
  const c10::Device device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
  c10::impl::getDeviceGuardImpl(c10::kCUDA)->setDevice(device);
  return device;
}

}  // namespace ddp
