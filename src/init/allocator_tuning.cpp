#include "init/allocator_tuning.h"

#include <malloc.h>
#include <unistd.h>  // environ (declared there, with C linkage, under _GNU_SOURCE)

#include <cstring>

namespace ddp::detail {

std::string user_malloc_tuning(const std::vector<std::string>& names,
                               const rendezvous::EnvLookup& env) {
  for (const auto& name : names) {
    // MALLOC_ARENA_MAX, MALLOC_TRIM_THRESHOLD_, ...: glibc's older names for its tunables.
    if (name.rfind("MALLOC_", 0) == 0) return name;
  }
  if (auto tunables = env("GLIBC_TUNABLES")) {
    if (tunables->find("glibc.malloc.") != std::string::npos) return "GLIBC_TUNABLES=" + *tunables;
  }
  return "";
}

bool tune_allocator_for_training() {
#if defined(__GLIBC__)
  // Setting either also stops glibc from moving them itself as large blocks are freed.
  return mallopt(M_MMAP_THRESHOLD, kMmapThresholdBytes) == 1 &&
         mallopt(M_TRIM_THRESHOLD, kTrimThresholdBytes) == 1;
#else
  return false;
#endif
}

std::vector<std::string> environment_names() {
  std::vector<std::string> names;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const char* equals = std::strchr(*entry, '=');
    names.emplace_back(*entry, equals ? static_cast<size_t>(equals - *entry) : std::strlen(*entry));
  }
  return names;
}

}  // namespace ddp::detail
