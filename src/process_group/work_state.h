// WorkState: an in-flight collective behind a ddp::Work handle.
//
// It holds the backend's c10d::Work, or the WorkState it was chained to with Work::then, and a
// completion step run once after success (copying a contiguous staging tensor back into a strided
// one, dividing for AVG, a user's continuation...). Its first wait learns how the work ended, on a
// device too (NCCL: the GPU finished it, or it failed), so that a failure is raised by the wait
// that would otherwise use its result. A state made while a collective is being recorded
// (ActiveTraceScope, trace/flight_recorder.h) takes over its flight-recorder entry, which its
// first wait marks completed or failed. Thread-safety: wait()
// and is_completed() may race; the completion step runs exactly once, under the mutex.
#pragma once

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "trace/flight_recorder.h"

namespace ddp::detail {

/// Waits for a backend's work: wait(), then, where `poll_limit` is positive (a backend whose works
/// complete on a device, whose wait() only orders the caller's stream), polls its completion up
/// to that long. Throws the work's failure, or a timeout error saying how long it waited.
void wait_for_backend_work(c10d::Work& work, std::chrono::milliseconds poll_limit);

struct WorkState {
  WorkState(c10::intrusive_ptr<c10d::Work> work, std::string operation,
            std::function<void()> on_success = nullptr);
  WorkState(std::shared_ptr<WorkState> parent, std::function<void()> on_success)
      : operation(parent->operation),
        parent(std::move(parent)),
        on_success(std::move(on_success)) {}

  /// Waits, runs the completion step once; throws DistributedError on failure (every time).
  void wait();
  bool is_completed();
  bool is_success();

  c10::intrusive_ptr<c10d::Work> work;  // null for a chained state
  const std::string operation;
  /// Set by the collective that made it: wait_for_backend_work's poll_limit.
  std::chrono::milliseconds poll_limit{0};
  TraceSlot trace;  // the collective's flight-recorder entry; empty for a chained state
  std::shared_ptr<FlightRecorder> trace_recorder;  // keeps trace.recorder alive

 private:
  std::shared_ptr<WorkState> parent;  // set for a chained state
  std::mutex mutex_;
  std::function<void()> on_success;
  bool finished_ = false;
  std::exception_ptr error_;
};

}  // namespace ddp::detail
