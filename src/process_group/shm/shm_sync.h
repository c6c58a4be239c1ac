// Synchronization between the ranks of one host through their shared segment.
//
// Each rank owns one cache line (RankSlot) with a phase counter that only it increments: "I have
// finished phase p". A collective is a fixed sequence of phases, identical on every rank, so
// waiting for a peer means waiting until its counter reaches a known value. No lock is ever taken
// in shared memory: a rank that dies (even by SIGKILL) cannot leave one held; its counter simply
// stops, and the waiters notice that the process is gone.
//
// Waiting spins briefly (a peer usually arrives within microseconds), then yields, then blocks on
// a futex of the peer's counter, which the peer wakes only when somebody sleeps on it. Every wait
// is bounded by a deadline, and between naps it checks that the peers are alive, that none has
// left the group and that no rank has aborted it. A rank that fails a collective aborts the
// segment, so that the others raise at once rather than at their timeout.
//
// Thread-safety: one thread per process drives a group's collectives (the group's op queue);
// abort() may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

namespace ddp::detail {

constexpr uint64_t kShmMagic = 0x6464702d63707034ULL;  // "ddp-cpp4"

// The kind of failure an abort reports, so that every rank raises the same exception type.
enum class ShmFailure : int32_t { kOther = 0, kPeerLost, kTimeout, kMismatch };

/// The kind of a caught exception (kOther for one that is not a typed DistributedError).
ShmFailure failure_kind_of(const std::exception& error);

/// Raises the error of that kind (its inverse): PeerLostError naming `lost_rank`, TimeoutError,
/// MismatchError, or a plain DistributedError for kOther.
[[noreturn]] void fail_of_kind(ShmFailure kind, const std::string& operation,
                               const std::string& cause, int lost_rank);

// One rank's control line. `arrive` is a 32-bit word because futexes are.
struct alignas(64) RankSlot {
  std::atomic<uint32_t> arrive;      // phases this rank has finished
  std::atomic<uint32_t> sleepers;    // peers blocked on this rank's futex
  std::atomic<int32_t> pid;          // 0 until the rank has mapped the segment
  std::atomic<uint32_t> left;        // 1 once the rank destroyed its process group
  std::atomic<uint64_t> call[2][3];  // the current call's {kind, dtype, count}, by call parity
};

struct ShmHeader {
  uint64_t magic;
  uint32_t local_size;
  uint32_t chunk_bytes;
  std::atomic<uint32_t> mapped;           // ranks that have mapped the segment
  std::atomic<int32_t> abort_claimed_by;  // -1, or the first local rank to abort the group
  std::atomic<int32_t> aborted_by;        // -1, or that rank once abort_reason is written
  // Room for a reason that quotes another: a host that fails because another host did names
  // the first failure, with its rank and cause.
  char abort_reason[1024];
  std::atomic<int32_t> abort_kind;       // a ShmFailure, written before aborted_by
  std::atomic<int32_t> abort_lost_rank;  // the global rank a kPeerLost abort lost, else -1
};

class ShmSync {
 public:
  ShmSync() = default;
  /// `header` and `slots` point into the mapped segment; `ranks` are the global ranks of the local
  /// group, for messages.
  ShmSync(ShmHeader* header, RankSlot* slots, int local_rank, int local_size,
          std::vector<int> global_ranks, std::chrono::milliseconds timeout);

  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  uint32_t phase() const { return phase_; }

  /// Finishes this rank's current phase and wakes sleepers.
  void arrive();
  /// Waits until local rank `peer` has finished phase `target` (a value of its counter).
  void wait_for(int peer, uint32_t target, std::chrono::steady_clock::time_point deadline,
                const char* operation);
  /// Waits until every other local rank has finished phase `target`.
  void wait_for_all(uint32_t target, std::chrono::steady_clock::time_point deadline,
                    const char* operation);

  /// Publishes this rank's call (numbered `call`) and, after a wait, checks a peer's against it.
  void publish_call(uint64_t call, uint64_t kind, uint64_t dtype, uint64_t count);
  void check_call(int peer, uint64_t call, const char* operation) const;

  /// Marks the group broken for every rank with a reason; the first abort wins. `lost_rank` is
  /// the global rank that is gone, for kPeerLost.
  void abort(const std::string& reason, ShmFailure kind = ShmFailure::kOther, int lost_rank = -1);
  /// Throws if some rank aborted the group.
  void throw_if_aborted(const char* operation) const;
  void mark_left();

 private:
  [[noreturn]] void fail_wait(int peer, const std::string& cause, const char* operation,
                              ShmFailure kind);
  // False when the peer has left the group or its process is gone.
  bool peer_is_present(int peer) const;
  std::string why_absent(int peer) const;
  // "rank 1 (pid 42 on host-a) is stopped (...)." when that peer is stopped, else "".
  std::string why_stopped(int peer) const;

  ShmHeader* header_ = nullptr;
  RankSlot* slots_ = nullptr;
  int local_rank_ = 0;
  int local_size_ = 1;
  std::vector<int> global_ranks_;
  std::chrono::milliseconds timeout_{0};
  uint32_t phase_ = 0;  // phases this rank has finished (mirror of its own counter)
};

}  // namespace ddp::detail
