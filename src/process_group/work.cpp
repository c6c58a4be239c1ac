#include <algorithm>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>

#include "common/error_context.h"
#include "ddp/errors.h"
#include "ddp/process_group.h"
#include "process_group/work_state.h"

namespace ddp {
namespace detail {

void wait_for_backend_work(c10d::Work& work, std::chrono::milliseconds poll_limit) {
  work.wait();
  if (poll_limit.count() > 0) {
    // Yield at first (a collective on the GPU takes microseconds to milliseconds), then sleep in
    // short steps: a wait that goes on for long is a failure being found by c10d's watchdog.
    const auto start = std::chrono::steady_clock::now();
    auto pause = std::chrono::microseconds(0);
    while (!work.isCompleted()) {
      const auto waited = std::chrono::steady_clock::now() - start;
      if (waited >= poll_limit) {
        throw std::runtime_error(
            "timed out: the collective did not complete on the device within " +
            std::to_string(poll_limit.count()) +
            " ms (a peer that never entered it, or a hung GPU)");
      }
      if (pause.count() == 0) {
        std::this_thread::yield();
        if (waited > std::chrono::microseconds(200)) pause = std::chrono::microseconds(20);
      } else {
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2, std::chrono::microseconds(1000));
      }
    }
  }
  // A backend whose wait only orders streams (NCCL) leaves a failure its watchdog found on the
  // work instead of throwing it.
  if (auto failure = work.exception()) std::rethrow_exception(failure);
}

WorkState::WorkState(c10::intrusive_ptr<c10d::Work> work, std::string operation,
                     std::function<void()> on_success)
    : work(std::move(work)), operation(std::move(operation)), on_success(std::move(on_success)) {
  if (TraceSlot* collective = ActiveTraceScope::current(); collective && *collective) {
    collective->handed_to_work = true;
    trace = *collective;
    trace_recorder = collective->recorder->shared_from_this();
    trace.recorder->mark_started(trace);  // where the launch did not say so itself
  }
}

void WorkState::wait() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!finished_) {
    // A failure raised while waiting is this collective's (note_failure).
    std::optional<ActiveTraceScope> active;
    if (trace) active.emplace(&trace);
    try {
      if (parent) {
        parent->wait();
      } else {
        wait_for_backend_work(*work, poll_limit);
      }
      if (on_success) on_success();
    } catch (const std::exception& error) {
      try {
        rethrow_backend_failure(operation, error);
      } catch (...) {
        error_ = std::current_exception();
      }
    }
    finished_ = true;
    on_success = nullptr;
    if (trace) {
      if (error_) {
        trace.recorder->mark_failed(trace, TraceFailure::kOther);
      } else {
        trace.recorder->mark_completed(trace);
      }
    }
  }
  if (error_) std::rethrow_exception(error_);
}

bool WorkState::is_completed() { return parent ? parent->is_completed() : work->isCompleted(); }

bool WorkState::is_success() {
  if (!is_completed()) return false;
  std::lock_guard<std::mutex> lock(mutex_);
  if (finished_) return !error_;
  // Not c10d's isSuccess(): deprecated, and NCCL's throws.
  return parent ? parent->is_success() : work->exception() == nullptr;
}

}  // namespace detail

void Work::wait() {
  if (!state_) throw DistributedError("ddp::Work::wait: this Work handle refers to no operation");
  state_->wait();
}

bool Work::is_completed() const { return state_ && state_->is_completed(); }

bool Work::is_success() const { return state_ && state_->is_success(); }

Work Work::then(std::function<void()> continuation) const {
  if (!state_) throw DistributedError("ddp::Work::then: this Work handle refers to no operation");
  return Work(std::make_shared<detail::WorkState>(state_, std::move(continuation)));
}

}  // namespace ddp
