// CountVisibleGpus counts the GPUs that this host's workers would see, for `--nproc-per-node gpu`
// and `auto`, without libtorch and without linking CUDA: it loads the driver library with
// dlopen and asks it (cuInit, cuDeviceGetCount). The driver honours CUDA_VISIBLE_DEVICES, which
// ddprun inherits and passes on to its workers unchanged, so the count is the workers' count.
//
// The driver is initialised in a short-lived child process, never in ddprun itself: cuInit
// leaves driver threads and state behind, and CUDA in a process forked from one that initialised
// it is undefined, while ddprun forks every worker. The child reports through a pipe and is
// killed when it does not answer in time. Safe to call from one thread at a time; it forks, so
// call it before other threads exist (ddprun calls it while parsing its command line).
#pragma once

#include <string>

namespace ddprun {

struct GpuCount {
  int count = 0;
  // When `count` is 0: why, e.g. "the CUDA driver library could not be loaded (libcuda.so.1:
  // cannot open shared object file: ...)" or "cuInit failed with code 100 (CUDA_ERROR_NO_DEVICE)".
  // Empty otherwise.
  std::string why_none;
};

// The CUDA driver library that CountVisibleGpus loads by default (its ABI-stable name).
constexpr const char* kCudaDriverLibrary = "libcuda.so.1";

// Counts the GPUs that `driver_library` (a name dlopen looks up, or a path) reports. Any failure
// (library missing, cuInit failing because there is no driver or no device, the child not
// answering within `timeout_s` seconds) counts as 0 GPUs, with the reason in `why_none`.
GpuCount CountVisibleGpus(const std::string& driver_library = kCudaDriverLibrary,
                          double timeout_s = 10.0);

}  // namespace ddprun
