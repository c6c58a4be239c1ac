#include "process_group/shm/shm_sync.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstring>

#include "common/error_context.h"
#include "common/peer_directory.h"
#include "process_group/shm/segment_ownership.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define DDP_CPU_RELAX() _mm_pause()
#else
#define DDP_CPU_RELAX() ((void)0)
#endif

namespace ddp::detail {
namespace {

using Clock = std::chrono::steady_clock;

// Spin this long before yielding, and yield this long before sleeping: a peer already inside the
// same collective arrives within a few microseconds, and a futex round trip costs about as much
// as the whole small collective. Past that the peer is still computing, and the core is better
// given to it (this machine has as many cores as ranks).
constexpr auto kSpin = std::chrono::microseconds(20);
constexpr auto kYield = std::chrono::microseconds(100);
// A sleeping waiter wakes at least this often to check deadline, peers and abort.
constexpr auto kNap = std::chrono::milliseconds(20);

bool reached(uint32_t value, uint32_t target) { return static_cast<int32_t>(value - target) >= 0; }

void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::nanoseconds timeout) {
  struct timespec ts;
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000000000);
  ts.tv_nsec = static_cast<long>(timeout.count() % 1000000000);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace

ShmSync::ShmSync(ShmHeader* header, RankSlot* slots, int local_rank, int local_size,
                 std::vector<int> global_ranks, std::chrono::milliseconds timeout)
    : header_(header),
      slots_(slots),
      local_rank_(local_rank),
      local_size_(local_size),
      global_ranks_(std::move(global_ranks)),
      timeout_(timeout),
      phase_(slots[local_rank].arrive.load()) {}

void ShmSync::arrive() {
  RankSlot& mine = slots_[local_rank_];
  ++phase_;
  mine.arrive.store(phase_, std::memory_order_seq_cst);
  // seq_cst on both sides (store arrive / load sleepers here, increment sleepers / load arrive in
  // the waiter) makes sure that one of the two sees the other: no lost wake-up.
  if (mine.sleepers.load(std::memory_order_seq_cst) != 0) futex_wake_all(&mine.arrive);
}

void ShmSync::wait_for(int peer, uint32_t target, Clock::time_point deadline,
                       const char* operation) {
  RankSlot& slot = slots_[peer];
  if (reached(slot.arrive.load(std::memory_order_acquire), target)) return;
  // An abort ends the wait only if the peer has not arrived: the peer may arrive, and then some
  // rank fail the next collective and abort, before this rank looks at the counter again.
  auto arrived_unless_aborted = [&] {
    if (header_->aborted_by.load(std::memory_order_acquire) < 0) return false;
    if (reached(slot.arrive.load(std::memory_order_seq_cst), target)) return true;
    throw_if_aborted(operation);
    return false;
  };
  const auto start = Clock::now();
  auto now = start;
  unsigned spins = 0;
  while (now - start < kSpin) {
    for (int i = 0; i < 64; ++i) {
      if (reached(slot.arrive.load(std::memory_order_acquire), target)) return;
      DDP_CPU_RELAX();
    }
    if ((++spins & 7) == 0 && arrived_unless_aborted()) return;
    now = Clock::now();
  }
  while (now - start < kSpin + kYield) {
    if (reached(slot.arrive.load(std::memory_order_acquire), target)) return;
    sched_yield();
    now = Clock::now();
  }
  while (true) {
    // A peer that arrived and then left or died did its part: look at its counter again after
    // learning that it is gone (it stores the counter first).
    if (arrived_unless_aborted()) return;
    if (!peer_is_present(peer)) {
      if (reached(slot.arrive.load(std::memory_order_seq_cst), target)) return;
      fail_wait(peer, why_absent(peer), operation, ShmFailure::kPeerLost);
    }
    now = Clock::now();
    if (now >= deadline) {
      // The deadline is the collective's, not this wait's: name the timeout the collective ran out
      // of.
      const std::string timed_out = "timed out after the group timeout of " +
                                    std::to_string(timeout_.count()) + " ms waiting for rank " +
                                    std::to_string(global_ranks_[peer]);
      const std::string stopped = why_stopped(peer);
      fail_wait(peer,
                !stopped.empty()
                    ? timed_out + ": " + stopped
                    : timed_out +
                          " (it is alive but has not reached this collective: it is slower, "
                          "stuck, or issuing different collectives). Raise "
                          "InitOptions().timeout if it is only slow.",
                operation, ShmFailure::kTimeout);
    }
    slot.sleepers.fetch_add(1, std::memory_order_seq_cst);
    uint32_t value = slot.arrive.load(std::memory_order_seq_cst);
    if (!reached(value, target)) {
      futex_wait(&slot.arrive, value, std::min<Clock::duration>(kNap, deadline - now));
    }
    slot.sleepers.fetch_sub(1, std::memory_order_seq_cst);
    if (reached(slot.arrive.load(std::memory_order_acquire), target)) return;
  }
}

void ShmSync::wait_for_all(uint32_t target, Clock::time_point deadline, const char* operation) {
  for (int peer = 0; peer < local_size_; ++peer) {
    if (peer != local_rank_) wait_for(peer, target, deadline, operation);
  }
}

void ShmSync::publish_call(uint64_t call, uint64_t kind, uint64_t dtype, uint64_t count) {
  auto& fields = slots_[local_rank_].call[call & 1];
  fields[0].store(kind, std::memory_order_relaxed);
  fields[1].store(dtype, std::memory_order_relaxed);
  fields[2].store(count, std::memory_order_relaxed);
  // Ordered before the next arrive() by its seq_cst store.
}

void ShmSync::check_call(int peer, uint64_t call, const char* operation) const {
  const auto& mine = slots_[local_rank_].call[call & 1];
  const auto& theirs = slots_[peer].call[call & 1];
  for (int i = 0; i < 3; ++i) {
    if (mine[i].load(std::memory_order_relaxed) != theirs[i].load(std::memory_order_relaxed)) {
      fail<MismatchError>(
          operation,
          "rank " + std::to_string(global_ranks_[peer]) +
              " issued a different collective, or one on a tensor of another size or dtype, "
              "at the same point (call kind/dtype/count " +
              std::to_string(theirs[0].load()) + "/" + std::to_string(theirs[1].load()) + "/" +
              std::to_string(theirs[2].load()) + " against this rank's " +
              std::to_string(mine[0].load()) + "/" + std::to_string(mine[1].load()) + "/" +
              std::to_string(mine[2].load()) +
              "). Every rank of a group must issue the same collectives in the same order.");
    }
  }
}

void ShmSync::abort(const std::string& reason, ShmFailure kind, int lost_rank) {
  int32_t none = -1;
  // Claim, write the reason, then publish: a peer that sees aborted_by also sees the reason.
  if (header_->abort_claimed_by.compare_exchange_strong(none, local_rank_)) {
    std::snprintf(header_->abort_reason, sizeof(header_->abort_reason), "%s", reason.c_str());
    header_->abort_kind.store(static_cast<int32_t>(kind), std::memory_order_relaxed);
    header_->abort_lost_rank.store(lost_rank, std::memory_order_relaxed);
    header_->aborted_by.store(local_rank_, std::memory_order_release);
  }
  for (int peer = 0; peer < local_size_; ++peer) futex_wake_all(&slots_[peer].arrive);
}

void ShmSync::throw_if_aborted(const char* operation) const {
  int32_t by = header_->aborted_by.load(std::memory_order_acquire);
  if (by < 0) return;
  const std::string cause =
      "rank " + std::to_string(global_ranks_[by]) +
      " failed a collective of this group and aborted it: " +
      std::string(header_->abort_reason,
                  strnlen(header_->abort_reason, sizeof(header_->abort_reason)));
  // The aborting rank's kind of failure is this rank's too: a peer lost to one is lost to all.
  fail_of_kind(static_cast<ShmFailure>(header_->abort_kind.load(std::memory_order_relaxed)),
               operation, cause, header_->abort_lost_rank.load(std::memory_order_relaxed));
}

void ShmSync::mark_left() {
  slots_[local_rank_].left.store(1, std::memory_order_seq_cst);
  futex_wake_all(&slots_[local_rank_].arrive);
}

bool ShmSync::peer_is_present(int peer) const {
  const RankSlot& slot = slots_[peer];
  return !slot.left.load(std::memory_order_seq_cst) &&
         process_is_alive(slot.pid.load(std::memory_order_acquire));
}

std::string ShmSync::why_absent(int peer) const {
  const RankSlot& slot = slots_[peer];
  if (slot.left.load()) {
    return "rank " + std::to_string(global_ranks_[peer]) +
           " destroyed its process group while this rank waits for it in a collective; every "
           "rank must issue the same collectives before destroy_process_group()";
  }
  return "rank " + std::to_string(global_ranks_[peer]) + " (pid " +
         std::to_string(slot.pid.load()) +
         ") exited during the collective; see that rank's output for why";
}

std::string ShmSync::why_stopped(int peer) const {
  // The ranks of a segment share this host and, as peer_is_present assumes too, its PID namespace.
  detail::PeerIdentity identity = detail::PeerIdentity::of_this_process(global_ranks_[peer]);
  identity.pid = slots_[peer].pid.load();
  identity.start_time = 0;
  return detail::describe_stopped({identity});
}

void ShmSync::fail_wait(int peer, const std::string& cause, const char* operation,
                        ShmFailure kind) {
  const int lost = kind == ShmFailure::kPeerLost ? global_ranks_[peer] : -1;
  abort("rank " + std::to_string(global_ranks_[local_rank_]) + ": " + cause, kind, lost);
  if (kind == ShmFailure::kPeerLost) fail_peer_lost(operation, cause, lost);
  if (kind == ShmFailure::kTimeout) fail<TimeoutError>(operation, cause);
  fail(operation, cause);
}

ShmFailure failure_kind_of(const std::exception& error) {
  if (dynamic_cast<const PeerLostError*>(&error)) return ShmFailure::kPeerLost;
  if (dynamic_cast<const TimeoutError*>(&error)) return ShmFailure::kTimeout;
  if (dynamic_cast<const MismatchError*>(&error)) return ShmFailure::kMismatch;
  return ShmFailure::kOther;
}

void fail_of_kind(ShmFailure kind, const std::string& operation, const std::string& cause,
                  int lost_rank) {
  switch (kind) {
    case ShmFailure::kPeerLost:
      fail_peer_lost(operation, cause, lost_rank);
    case ShmFailure::kTimeout:
      fail<TimeoutError>(operation, cause);
    case ShmFailure::kMismatch:
      fail<MismatchError>(operation, cause);
    case ShmFailure::kOther:
      break;
  }
  fail(operation, cause);
}

}  // namespace ddp::detail
