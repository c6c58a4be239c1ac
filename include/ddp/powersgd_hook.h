// PowerSGD: a DDP comm hook that all-reduces low-rank approximations of the gradient matrices
// instead of the matrices, as torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook does
// (Vogels et al., "PowerSGD: Practical Low-Rank Gradient Compression for Distributed
// Optimization", 2019), with PyTorch's option names, defaults and arithmetic, so that a model
// trained with it in C++ follows the one trained with PyTorch's hook (tests compare the two).
//
// For each bucket, once start_powerSGD_iter iterations have run with plain all-reduce: every
// gradient viewed as a matrix M (its first dimension by the rest) that is worth compressing is
// replaced by P Q^T, where P = M Q is all-reduced and orthogonalized, then Q = M^T P is
// all-reduced and averaged; the other gradients (biases, small matrices) are all-reduced together,
// uncompressed. With error feedback the part of each local gradient that the approximation
// missed is added to the next one; with warm start Q carries over from one iteration to the next.
//
// The hook's state (iteration count, error and Q memories per bucket, the random generator) is
// owned by the CommHook that comm_hooks::powerSGD returns: register each returned hook with one
// DDP model only. Thread-safety: DDP calls the hook and waits for its Works from one thread at a
// time, which the state relies on; do not share one hook between models trained concurrently.
#pragma once

#include <torch/arg.h>

#include <cstdint>

#include "ddp/comm_hooks.h"

namespace ddp {

/// PyTorch's PowerSGDState, without the process group (the hook uses the group DDP gives it).
struct PowerSGDOptions {
  /// The rank r of the approximation P Q^T (P: n x r, Q: m x r); lower compresses more. Must be
  /// at least 1. Default: 1.
  TORCH_ARG(int64_t, matrix_approximation_rank) = 1;
  /// Iterations reduced with plain all-reduce before compression starts (counted at each bucket
  /// set's last bucket). Must be at least 2 with error feedback or warm start: DDP rebuilds its
  /// buckets after the first iteration, which would mismatch the per-bucket memories. Default:
  /// 1000.
  TORCH_ARG(int64_t, start_powerSGD_iter) = 1000;
  /// A matrix n x m is compressed only when (n + m) * r * min_compression_rate < n * m; others go
  /// in the uncompressed all-reduce. Default: 2.
  TORCH_ARG(double, min_compression_rate) = 2.0;
  /// Add to each bucket the error its previous approximation made on this rank. Default: true.
  TORCH_ARG(bool, use_error_feedback) = true;
  /// Start each iteration's power step from the previous Q instead of a fresh random one.
  /// Default: true.
  TORCH_ARG(bool, warm_start) = true;
  /// Added to each column norm in orthogonalization; 0 leaves an all-zero column's division by
  /// zero to produce NaN, as PyTorch's does (1e-8 avoids it). Must be >= 0. Default: 0.
  TORCH_ARG(double, orthogonalization_epsilon) = 0.0;
  /// Seeds numpy's RandomState as PyTorch's state does: the initial Qs equal PyTorch's. 0 to
  /// 2^32 - 1. Default: 0.
  TORCH_ARG(int64_t, random_seed) = 0;
};

namespace comm_hooks {

/// PowerSGD (PyTorch's powerSGD_hook) with a state of its own. Throws InvalidArgumentError for
/// options PyTorch refuses or cannot use (rank < 1, start_powerSGD_iter < 2 with error feedback
/// or warm start, a negative epsilon or min_compression_rate, a seed outside numpy's range); the
/// hook throws it for a bucket that does not hold floating-point gradients.
CommHook powerSGD(PowerSGDOptions options = {});

}  // namespace comm_hooks
}  // namespace ddp
