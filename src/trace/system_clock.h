// The clock of the files the library writes for people to read (flight records, the timeline):
// the system clock, so that time stamps compare across processes and, clocks in sync, across
// hosts. Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>

namespace ddp::detail {

/// Microseconds since the epoch on this process's system clock.
inline int64_t system_clock_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace ddp::detail
