// TrafficCounters: the bytes and calls a group has handed to its backends, by collective kind.
//
// Counted where a collective gives its call to the backend (collectives.cpp), with the bytes of
// the call's payload on this rank: the input of a reduction or gather (for a list, all of its
// tensors), the buffer that a broadcast, scatter or recv fills, the tensor a send sends. What a
// backend moves on the wire for it depends on its algorithm (a ring all-reduce sends about twice
// the payload); these are the bytes given to it. The cross-rank checks of verify_collectives are
// not counted: they are not the caller's data. Statistics read them; tests compare them.
//
// Thread-safety: every member may be used from any thread (relaxed atomics: each counter is
// exact, a reading of several is not a snapshot).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

#include "process_group/backend.h"

namespace ddp::detail {

class TrafficCounters {
 public:
  static constexpr size_t kKinds = static_cast<size_t>(Collective::kAllReduceNarrowBetweenHosts) + 1;

  void add(Collective kind, uint64_t bytes) {
    bytes_[index(kind)].fetch_add(bytes, std::memory_order_relaxed);
    calls_[index(kind)].fetch_add(1, std::memory_order_relaxed);
  }
  uint64_t bytes(Collective kind) const { return bytes_[index(kind)].load(std::memory_order_relaxed); }
  uint64_t calls(Collective kind) const { return calls_[index(kind)].load(std::memory_order_relaxed); }

 private:
  static size_t index(Collective kind) { return static_cast<size_t>(kind); }

  std::array<std::atomic<uint64_t>, kKinds> bytes_{};
  std::array<std::atomic<uint64_t>, kKinds> calls_{};
};

}  // namespace ddp::detail
