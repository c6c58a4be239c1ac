// A stand-in for the CUDA driver library (libcuda.so.1) with the entry points that
// CountVisibleGpus uses, built once per behaviour (FAKE_CUDA_THREE_DEVICES, _NO_DEVICE, _HANGS,
// _CRASHES), so that gpu_count_test covers hosts with GPUs, hosts without, and drivers that hang
// or crash in cuInit, on any machine.
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

namespace {
constexpr int kCudaSuccess = 0;
constexpr int kCudaErrorInvalidValue = 1;
constexpr int kCudaErrorNoDevice = 100;
}  // namespace

extern "C" {

int cuInit(unsigned int /*flags*/) {
#if defined(FAKE_CUDA_NO_DEVICE)
  return kCudaErrorNoDevice;
#elif defined(FAKE_CUDA_HANGS)
  for (;;) pause();
#elif defined(FAKE_CUDA_CRASHES)
  rlimit no_core{0, 0};  // A crash, without leaving a core file behind.
  setrlimit(RLIMIT_CORE, &no_core);
  raise(SIGSEGV);
  return kCudaSuccess;
#else
  return kCudaSuccess;
#endif
}

int cuDeviceGetCount(int* count) {
  *count = 3;
  return kCudaSuccess;
}

int cuGetErrorName(int error, const char** name) {
  if (error != kCudaErrorNoDevice) return kCudaErrorInvalidValue;
  *name = "CUDA_ERROR_NO_DEVICE";
  return kCudaSuccess;
}

}  // extern "C"
