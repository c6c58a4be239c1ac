#include "process_group/shm/op_queue.h"

#include "ddp/errors.h"

namespace ddp::detail {

bool OpWork::wait(std::chrono::milliseconds timeout) {
  queue_->help_until(*this);
  return c10d::Work::wait(timeout);
}

std::shared_ptr<OpQueue> OpQueue::start() {
  std::shared_ptr<OpQueue> queue(new OpQueue());
  queue->worker_ = std::thread([raw = queue.get()] { raw->worker_loop(); });
  return queue;
}

OpQueue::~OpQueue() {
  if (!worker_.joinable()) return;
  if (worker_.get_id() == std::this_thread::get_id()) {
    worker_.detach();  // the last reference went away on the worker itself; it exits on its own
  } else {
    shut_down("the process group was destroyed");
  }
}

c10::intrusive_ptr<OpWork> OpQueue::submit(int rank, c10d::OpType type, std::function<void()> body,
                                           Launch launch) {
  auto work = c10::make_intrusive<OpWork>(shared_from_this(), rank, type);
  std::unique_lock<std::mutex> lock(mutex_);
  if (stopping_) {
    lock.unlock();
    work->complete(std::make_exception_ptr(DistributedError(stop_reason_)));
    return work;
  }
  pending_.push_back(Op{std::move(body), work});
  // Waking the worker costs more than a small collective (it takes a core from a peer rank); skip
  // it when the caller is about to wait, and so run the op, itself.
  if (launch == Launch::kAsync) changed_.notify_all();
  return work;
}

void OpQueue::run_head(std::unique_lock<std::mutex>& lock) {
  Op op = std::move(pending_.front());
  pending_.pop_front();
  running_ = true;
  lock.unlock();
  std::exception_ptr error;
  try {
    op.body();
  } catch (...) {
    error = std::current_exception();
  }
  // The body's captures (the tensors it read and wrote) go before the work completes: a waiter
  // may count the references to them as soon as it returns (the reducer does).
  op.body = nullptr;
  op.work->complete(error);
  op = Op{};
  lock.lock();
  running_ = false;
  if (waiters_ > 0 || !pending_.empty()) changed_.notify_all();
}

void OpQueue::help_until(const OpWork& work) {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!const_cast<OpWork&>(work).isCompleted()) {
    if (!running_ && !pending_.empty()) {
      run_head(lock);
    } else {
      ++waiters_;
      changed_.wait(lock);
      --waiters_;
    }
  }
}

void OpQueue::worker_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    changed_.wait(lock, [&] { return stopping_ || (!running_ && !pending_.empty()); });
    if (stopping_) return;
    run_head(lock);
  }
}

void OpQueue::shut_down(const std::string& reason) {
  std::deque<Op> abandoned;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (stopping_) return;
    stopping_ = true;
    stop_reason_ = reason;
    // An op already running finishes (its waits are bounded); the queued ones never start.
    ++waiters_;
    changed_.wait(lock, [&] { return !running_; });
    --waiters_;
    abandoned.swap(pending_);
    changed_.notify_all();
  }
  for (auto& op : abandoned) {
    op.work->complete(std::make_exception_ptr(DistributedError(reason)));
  }
  {
    // A thread in help_until() waits on changed_ for one of the works just completed.
    std::lock_guard<std::mutex> lock(mutex_);
    changed_.notify_all();
  }
  if (worker_.joinable()) worker_.join();
}

}  // namespace ddp::detail
