// DistributedError and its subclasses: the exceptions of ddp-cpp.
//
// Every failure a user can cause or meet (bad options, a missing environment variable, a peer that
// died, a timeout) is reported as a DistributedError whose message names the rank, the operation,
// the cause and, where it is known, the fix. Broken internal invariants are assertions instead
// (TORCH_INTERNAL_ASSERT): they mean a bug in ddp-cpp, not a mistake of the caller.
//
// The subclasses say what kind of failure it was, as c10d's DistBackendError, DistStoreError and
// DistNetworkError do, so that a program can react to the kind (retry after a lost peer, fix its
// input after an InvalidArgumentError) without reading the message:
//   TimeoutError          a peer or the store did not answer within the timeout
//   PeerLostError         a peer process exited or closed its connection
//   MismatchError         the ranks disagree: collectives, tensor sizes, models, world sizes
//     UnevenInputsError   ... on the number of batches: a rank ran out of inputs (ddp::Join)
//   StoreError            the rendezvous store cannot be hosted, reached or used
//   InvalidArgumentError  bad options, environment values, paths or files given by the caller
// A failure of none of these kinds is a plain DistributedError. Catching DistributedError catches
// them all. The objects are immutable, so any thread may read them.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

namespace ddp {

class DistributedError : public std::runtime_error {
 public:
  explicit DistributedError(const std::string& message) : std::runtime_error(message) {}
  /// rank: the rank that reports the failure (-1 before init_process_group knows it);
  /// operation: the user's call that failed ("all_reduce", "save_checkpoint").
  DistributedError(const std::string& message, int rank, std::string operation)
      : std::runtime_error(message), rank_(rank), operation_(std::move(operation)) {}

  /// The reporting rank, -1 when unknown (before init_process_group).
  int rank() const noexcept { return rank_; }
  /// The ddp call that failed, "" when unknown.
  const std::string& operation() const noexcept { return operation_; }

 private:
  int rank_ = -1;
  std::string operation_;
};

/// A peer or the store did not answer within the timeout (InitOptions().timeout or the call's).
class TimeoutError : public DistributedError {
 public:
  using DistributedError::DistributedError;
};

/// A peer process exited, crashed or closed its connection during the call.
class PeerLostError : public DistributedError {
 public:
  using DistributedError::DistributedError;
  PeerLostError(const std::string& message, int rank, std::string operation, int lost_rank,
                std::string lost_host)
      : DistributedError(message, rank, std::move(operation)),
        lost_rank_(lost_rank),
        lost_host_(std::move(lost_host)) {}

  /// The global rank of the peer that is gone, -1 when unknown (a gloo peer that is a Python
  /// rank, which does not say who is behind its connections).
  int lost_rank() const noexcept { return lost_rank_; }
  /// Its host name; the address gloo gives when the rank is unknown; "" when neither is known.
  const std::string& lost_host() const noexcept { return lost_host_; }

 private:
  int lost_rank_ = -1;
  std::string lost_host_;
};

/// The ranks disagree: different collectives, tensor sizes or dtypes, models, world sizes, or
/// two processes claiming one rank.
class MismatchError : public DistributedError {
 public:
  using DistributedError::DistributedError;
};

/// The ranks have different numbers of inputs: under ddp::Join with throw_on_early_termination, a
/// rank ran out of batches while others still had some. Every rank raises it in the same
/// iteration, so that all can leave the loop together (and, say, go on to the next epoch).
class UnevenInputsError : public MismatchError {
 public:
  using MismatchError::MismatchError;
};

/// The rendezvous store cannot be hosted (port in use), reached, or used.
class StoreError : public DistributedError {
 public:
  using DistributedError::DistributedError;
};

/// The caller gave something unusable: an option, an environment value, a path or a file.
class InvalidArgumentError : public DistributedError {
 public:
  using DistributedError::DistributedError;
};

}  // namespace ddp
