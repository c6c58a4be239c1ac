// OpQueue: runs a process group's collectives one at a time, in the order they were issued.
//
// Collectives must run in issue order on every rank, and the shared-memory transport drives one
// at a time. A background thread runs them so that an async call returns at once (the DDP reducer
// launches a bucket and goes on with backward). A caller that waits for an op that nobody has
// started yet runs it itself, together with any op queued before it: a synchronous collective
// then costs no thread hand-off, which is most of a small all-reduce's latency.
//
// Thread-safety: submit() and OpWork::wait() may be called from any thread.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "process_group/backend.h"

namespace ddp::detail {

class OpQueue;

/// The c10d::Work of a queued op; wait() helps run the queue until this op is done.
class OpWork : public c10d::Work {
 public:
  OpWork(std::shared_ptr<OpQueue> queue, int rank, c10d::OpType type)
      : c10d::Work(rank, type), queue_(std::move(queue)) {}
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  void complete(std::exception_ptr error) { finish(std::move(error)); }

 private:
  std::shared_ptr<OpQueue> queue_;
};

class OpQueue : public std::enable_shared_from_this<OpQueue> {
 public:
  static std::shared_ptr<OpQueue> start();
  ~OpQueue();

  /// Queues `body`; the returned work completes when it has run (with its exception, if any).
  /// With Launch::kWaitNow the worker is not woken: the caller runs the op when it waits.
  c10::intrusive_ptr<OpWork> submit(int rank, c10d::OpType type, std::function<void()> body,
                                    Launch launch);
  /// Runs queued ops on this thread until `work` is complete (or another thread runs them).
  void help_until(const OpWork& work);
  /// Fails the ops still queued and joins the thread; later submits fail at once.
  void shut_down(const std::string& reason);

 private:
  struct Op {
    std::function<void()> body;
    c10::intrusive_ptr<OpWork> work;
  };
  OpQueue() = default;
  void worker_loop();
  // Runs the head op; called with the lock held, returns with it held.
  void run_head(std::unique_lock<std::mutex>& lock);

  std::mutex mutex_;
  std::condition_variable changed_;
  // Threads other than the worker waiting on changed_ (in help_until or shut_down): an op's end
  // wakes nobody when there are none and nothing is queued behind it, so that a synchronous
  // collective does not wake the idle worker (a system call, and a thread that takes a core from
  // a spinning peer, for every call).
  int waiters_ = 0;
  std::deque<Op> pending_;
  bool running_ = false;
  bool stopping_ = false;
  std::string stop_reason_;
  std::thread worker_;
};

}  // namespace ddp::detail
