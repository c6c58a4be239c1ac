// WorkState: an in-flight collective behind a ddp::Work handle.
//
// It holds the backend's c10d::Work, or the WorkState it was chained to with Work::then, and a
// completion step run once after success (copying a contiguous staging tensor back into a strided
// one, dividing for AVG, a user's continuation...). Thread-safety: wait()
// and is_completed() may race; the completion step runs exactly once, under the mutex.
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <torch/csrc/distributed/c10d/Work.hpp>

namespace ddp::detail {

struct WorkState {
  WorkState(c10::intrusive_ptr<c10d::Work> work, std::string operation,
            std::function<void()> on_success = nullptr)
      : work(std::move(work)), operation(std::move(operation)), on_success(std::move(on_success)) {}
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

 private:
  std::shared_ptr<WorkState> parent;  // set for a chained state
  std::mutex mutex_;
  std::function<void()> on_success;
  bool finished_ = false;
  std::exception_ptr error_;
};

}  // namespace ddp::detail
