// CountVisibleGpus: against stand-ins for the CUDA driver (fake_cuda_driver.cpp), against a
// library that is missing or is not a driver, and against this host's own driver, if any.
#include "gpu_count.h"

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <optional>
#include <string>

namespace ddprun {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// True when `library` is loaded in this process (RTLD_NOLOAD loads nothing).
bool LoadedHere(const std::string& library) {
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (handle == nullptr) return false;
  dlclose(handle);
  return true;
}

// Sets an environment variable for the scope of one test (which the counting child inherits).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(GpuCount, CountsTheDevicesTheDriverReports) {
  GpuCount count = CountVisibleGpus(FAKE_CUDA_THREE_DEVICES);
  EXPECT_EQ(count.count, 3) << count.why_none;
  EXPECT_EQ(count.why_none, "");
}

TEST(GpuCount, TheDriverIsLoadedOnlyInTheChildThatAsksIt) {
  CountVisibleGpus(FAKE_CUDA_THREE_DEVICES);
  EXPECT_FALSE(LoadedHere(FAKE_CUDA_THREE_DEVICES));
  CountVisibleGpus();
  EXPECT_FALSE(LoadedHere(kCudaDriverLibrary));
}

TEST(GpuCount, CuInitFailureCountsNoneAndNamesTheCode) {
  GpuCount count = CountVisibleGpus(FAKE_CUDA_NO_DEVICE);
  EXPECT_EQ(count.count, 0);
  EXPECT_EQ(count.why_none, "cuInit failed with code 100 (CUDA_ERROR_NO_DEVICE)");
}

TEST(GpuCount, MissingLibraryCountsNoneAndNamesIt) {
  GpuCount count = CountVisibleGpus("libddprun-no-such-driver.so.1");
  EXPECT_EQ(count.count, 0);
  EXPECT_NE(count.why_none.find("the CUDA driver library could not be loaded"), std::string::npos)
      << count.why_none;
  EXPECT_NE(count.why_none.find("libddprun-no-such-driver.so.1"), std::string::npos)
      << count.why_none;
}

TEST(GpuCount, LibraryThatIsNotADriverCountsNone) {
  GpuCount count = CountVisibleGpus("libm.so.6");
  EXPECT_EQ(count.count, 0);
  EXPECT_NE(count.why_none.find("libm.so.6 has no cuInit"), std::string::npos) << count.why_none;
}

TEST(GpuCount, HangingDriverIsKilledAtTheTimeout) {
  auto start = std::chrono::steady_clock::now();
  GpuCount count = CountVisibleGpus(FAKE_CUDA_HANGS, 0.5);
  double seconds = SecondsSince(start);
  EXPECT_EQ(count.count, 0);
  EXPECT_NE(count.why_none.find("no answer within 0.5 s"), std::string::npos) << count.why_none;
  EXPECT_NE(count.why_none.find("cuInit hung?"), std::string::npos) << count.why_none;
  EXPECT_GE(seconds, 0.4);
  EXPECT_LT(seconds, 5.0);
}

TEST(GpuCount, CrashingDriverCountsNoneAndSaysHowTheChildEnded) {
  GpuCount count = CountVisibleGpus(FAKE_CUDA_CRASHES);
  EXPECT_EQ(count.count, 0);
  EXPECT_NE(count.why_none.find("SIGSEGV"), std::string::npos) << count.why_none;
  EXPECT_NE(count.why_none.find("before answering"), std::string::npos) << count.why_none;
}

// This host's own driver: none on a machine without libcuda.so.1 or without GPUs, and any
// driver's count is none when CUDA_VISIBLE_DEVICES hides every device.
TEST(GpuCount, ThisHostsDriverAnswersWithinTheTimeout) {
  auto start = std::chrono::steady_clock::now();
  GpuCount count = CountVisibleGpus();
  EXPECT_LT(SecondsSince(start), 12.0);
  EXPECT_GE(count.count, 0);
  EXPECT_EQ(count.count == 0, !count.why_none.empty()) << count.why_none;
  if (count.count > 0) {
    ScopedEnv hide_every_device("CUDA_VISIBLE_DEVICES", "");
    GpuCount hidden = CountVisibleGpus();
    EXPECT_EQ(hidden.count, 0);
    EXPECT_NE(hidden.why_none, "");
  }
}

}  // namespace
}  // namespace ddprun
