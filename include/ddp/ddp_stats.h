// DDPStats: what DistributedDataParallel measured about its own steps, as model.stats() returns it.
// The C++ counterpart of what PyTorch's DDP logs (model._get_ddp_logging_data()), with names that
// say what each number is.
//
// A step is one DDP forward followed by a synchronized backward: forwards under no_sync(), under
// torch::NoGradGuard or not followed by a backward, and ddp::Join's shadow iterations on a rank
// that finished, are not counted. Times are taken with std::chrono::steady_clock on the host, with
// no synchronization; the three phases of a step follow each other without a gap:
//
//   forward start         forward end            last gradient ready        reducer done
//   |---- forward_ms -----|-- backward_compute_ms --|-- exposed_communication_ms --|
//                                    |------------ communication_ms --------------|
//                             first bucket handed to the backend
//
//   forward_ms                 From the call of model(x) (DDP's bookkeeping before the wrapped
//                              module's forward: the buffer broadcast included) until DDP's work
//                              after it is done (with find_unused_parameters, the graph walk).
//   backward_compute_ms        From the end of forward until the gradient of the last parameter
//                              is ready (accumulated by autograd): the loss and whatever the
//                              program does between forward and backward count here, as in
//                              PyTorch's avg_backward_compute_time.
//   exposed_communication_ms   From that instant until the reducer has waited for every bucket's
//                              reduction and handed the averaged gradients to .grad: the part of
//                              communication that backward did not hide. It also holds whatever
//                              autograd still computes after the last parameter's gradient
//                              (usually nothing).
//   communication_ms           From the first bucket handed to the process group (or comm hook)
//                              until the same end: the whole communication, hidden or not.
//
// The first step reduces only once backward has ended, in buckets rebuilt from the order in which
// its gradients became ready: nothing of it is hidden, and its exposed_communication_ms also holds
// the rebuild (rank 0's order broadcast, the gradients moved into the new buckets), which comes
// before the first bucket is handed over.
//
// So forward_ms + backward_compute_ms + exposed_communication_ms is the time from the call of
// model(x) until backward's gradients are averaged. On CUDA these are the host's times: kernels
// still running on the device when an instant is read are not waited for.
//
// bytes_reduced counts what the reducer hands to the process group for the gradient buckets: each
// bucket's bytes (in the buckets' dtype: mixed precision's reduce_dtype), or, where the backend
// reduces gradients where autograd left them (shm), the same bytes as a list. With a comm hook it
// is the bucket's bytes handed to the hook, before the hook compresses them (fp16_compress sends
// half of them). The map of used parameters that find_unused_parameters reduces is not counted.
//
// A plain value type; copy it freely.
#pragma once

#include <cstdint>
#include <vector>

namespace ddp {

/// The measurements of one step (or their mean over several: DDPStats::average).
struct DDPStepStats {
  double forward_ms = 0;
  double backward_compute_ms = 0;
  double exposed_communication_ms = 0;
  double communication_ms = 0;
  /// Bytes of gradient buckets handed to the process group (or the comm hook).
  int64_t bytes_reduced = 0;
  /// Buckets whose reduction the step started.
  int64_t buckets_reduced = 0;
  /// With find_unused_parameters: parameters this rank's forward did not reach (0 otherwise).
  int64_t unused_parameters = 0;
};

struct DDPStats {
  /// The last step counted; all zeros before the first.
  DDPStepStats last_step;
  /// The mean over the steps counted since construction or reset_stats() (bytes_reduced,
  /// buckets_reduced and unused_parameters rounded down); all zeros before the first.
  DDPStepStats average;
  /// Steps counted since construction or reset_stats().
  int64_t steps = 0;
  /// Bytes reduced over those steps (exact; average.bytes_reduced is this divided by steps).
  int64_t total_bytes_reduced = 0;

  /// The buckets as they are now, in reduction order: their number and sizes in bytes.
  int64_t bucket_count = 0;
  std::vector<int64_t> bucket_sizes_bytes;
  /// Times the buckets were rebuilt since construction (not reset by reset_stats()): DDP
  /// rebuilds them once, in the first synchronized backward, from the order in which gradients
  /// became ready; never with find_unused_parameters unless static_graph is set.
  int64_t rebuilds = 0;

  /// The setup, for logs: parameters that require grad (shared ones once), their bytes, the
  /// group's size and this process's rank in it, and the options that shape the reduction.
  int64_t parameter_count = 0;
  int64_t parameter_bytes = 0;
  int world_size = 0;
  int rank = 0;
  int64_t bucket_cap_bytes = 0;
  bool find_unused_parameters = false;
  bool static_graph = false;
  bool gradient_as_bucket_view = false;
  bool has_comm_hook = false;
};

}  // namespace ddp
