// WaitsAtOnce: "this thread waits for the op it issues next, right away".
//
// The synchronous collectives (all_reduce(), barrier(), the fingerprint exchange...) hold one
// while they issue their backend call and wait for it. A backend that runs ops on a worker thread
// (the shm backend) then leaves the worker asleep and lets the waiting caller run the op itself:
// waking a thread costs tens of microseconds on a machine whose cores are all busy with ranks,
// more than a small collective. Async calls never hold one, so their ops always start on their
// own. Thread-local, so it is thread-safe by construction.
#pragma once

namespace ddp::detail {

class WaitsAtOnce {
 public:
  WaitsAtOnce() { ++depth(); }
  ~WaitsAtOnce() { --depth(); }
  WaitsAtOnce(const WaitsAtOnce&) = delete;
  WaitsAtOnce& operator=(const WaitsAtOnce&) = delete;

  static bool active() { return depth() > 0; }

 private:
  static int& depth() {
    thread_local int value = 0;
    return value;
  }
};

}  // namespace ddp::detail
