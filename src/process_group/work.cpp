#include "common/error_context.h"
#include "ddp/errors.h"
#include "ddp/process_group.h"
#include "process_group/work_state.h"

namespace ddp {
namespace detail {

void WorkState::wait() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!finished_) {
    try {
      if (parent) {
        parent->wait();
      } else {
        work->wait();
        // A backend whose wait only orders streams (NCCL) leaves a failure its watchdog found on
        // the work instead of throwing it.
        if (auto failure = work->exception()) std::rethrow_exception(failure);
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
  }
  if (error_) std::rethrow_exception(error_);
}

bool WorkState::is_completed() { return parent ? parent->is_completed() : work->isCompleted(); }

bool WorkState::is_success() {
  if (!is_completed()) return false;
  std::lock_guard<std::mutex> lock(mutex_);
  if (finished_) return !error_;
  return parent ? parent->is_success() : work->isSuccess();
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
