// Process-group setup: init_process_group and the functions that query the default (world) group.
//
// These mirror torch.distributed: one default group per process, created by init_process_group and
// torn down by destroy_process_group, after which init_process_group may be called again.
// Thread-safety: init_process_group, destroy_process_group and new_group must not run concurrently
// with each other or with collectives; the query functions are safe to call from any thread while
// the group exists.
#pragma once

#include <torch/arg.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "ddp/process_group.h"

namespace ddp {

/// Options of init_process_group, with PyTorch's defaults.
///
///   ddp::init_process_group(ddp::InitOptions().backend("gloo").init_method("tcp://10.0.0.1:23456")
///                               .rank(r).world_size(4));
struct InitOptions {
  /// "auto" (shared memory between the ranks of one host, gloo between hosts: see "shm"; NCCL for
  /// CUDA tensors where every rank has a GPU of its own, ddp::set_device), "gloo",
  /// "shm" (ranks of one host exchange through a POSIX shared-memory segment; ranks on several
  /// hosts reduce within each host, then between one leader per host through gloo) or "nccl"
  /// (CUDA builds of libtorch only); case-insensitive. "auto" is "shm" when some host runs two or
  /// more ranks and "gloo" otherwise. Hosts are told apart by hostname, or by the environment
  /// variable DDP_CPP_HOST_ID where set (a testing aid: ranks of one machine can pose as several
  /// hosts). Jobs with Python ranks must use "gloo". Default: "auto".
  TORCH_ARG(std::string, backend) = "auto";
  /// "env://" (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE), "tcp://host:port" or "file:///path".
  /// Default: "env://".
  TORCH_ARG(std::string, init_method) = "env://";
  /// This process's rank; -1 takes it from the init_method query or the environment (torchrun's
  /// RANK, then mpirun's OMPI_COMM_WORLD_RANK, then Slurm's SLURM_PROCID). Default: -1.
  TORCH_ARG(int, rank) = -1;
  /// Number of processes; -1 takes it from the init_method query or the environment (WORLD_SIZE,
  /// OMPI_COMM_WORLD_SIZE, SLURM_NTASKS). Default: -1.
  TORCH_ARG(int, world_size) = -1;
  /// Bounds the rendezvous and every collective of the groups created from it. Default: 30 min.
  TORCH_ARG(std::chrono::milliseconds, timeout) = std::chrono::minutes(30);
  /// Before each collective the ranks compare a fingerprint (collective, dtype, element count,
  /// root) in one tiny extra exchange, so that mismatched calls fail on every rank with an error
  /// naming both sides, instead of corrupting data or aborting the process inside gloo. Turn it
  /// off to save that round trip once a program is known to be correct. DDP's gradient buckets
  /// never pay it: they are verified once, at construction. Default: true.
  TORCH_ARG(bool, verify_collectives) = true;
  /// Raises glibc malloc's mmap and trim thresholds (32 MiB, 256 MiB) for the rest of the
  /// process, so that the memory a training step frees stays in the heap for the next step
  /// instead of going back to the kernel and faulting in again (up to half of a small model's
  /// step). Skipped where the user tunes malloc (GLIBC_TUNABLES with glibc.malloc entries, or a
  /// MALLOC_* variable) and on other C libraries. Default: true.
  TORCH_ARG(bool, tune_allocator) = true;
  /// The flight recorder: every group keeps its last `trace_buffer` collectives (sequence number,
  /// operation, dtype, sizes, backend, the call that issued it, when it was queued, started and
  /// finished, its state), written to trace_dir when this rank raises a TimeoutError,
  /// PeerLostError or MismatchError, or receives SIGUSR1. 0 turns it off. -1 takes the environment
  /// variable DDP_CPP_TRACE_BUFFER where set, else 2000: a value given here wins over the
  /// environment, as rank() wins over RANK. Default: -1 (2000).
  TORCH_ARG(int64_t, trace_buffer) = -1;
  /// The folder where this rank writes its flight record, as rank<R>.json (a temporary file, then
  /// renamed). "" takes DDP_CPP_TRACE_DIR where set (ddprun sets it for each attempt); without
  /// either, nothing is written. A folder given here wins over the environment. Default: "".
  TORCH_ARG(std::string, trace_dir) = "";
  /// The timeline: a folder where this rank writes timeline_rank<R>.json, a Chrome-trace /
  /// Perfetto record of its collectives (queued, running, done), DDP's forward, backward, each
  /// bucket's all-reduce and the wait at the end of backward, checkpoint saves, and the marks of
  /// ddp::timeline (timeline.h), time-aligned with rank 0's clock. ddprun merges the ranks' files
  /// into timeline.json there; open it in ui.perfetto.dev or chrome://tracing. "" takes
  /// DDP_CPP_TIMELINE where set; without either there is no timeline (it costs a little: an event
  /// per collective and per bucket). A folder given here wins over the environment. The
  /// collectives shown are the flight recorder's: with trace_buffer(0) the timeline holds only
  /// DDP's and the user's events. Default: "" (off).
  TORCH_ARG(std::string, timeline_path) = "";
};

/// Creates the default group. Collective: every rank of the job must call it. It also ignores
/// SIGPIPE where the program kept the default action (as Python does), so that a peer that dies
/// mid-write makes the survivors raise an error instead of killing them by signal.
/// REQUIRES: no default group exists (call destroy_process_group first to re-initialise).
void init_process_group(const InitOptions& options = InitOptions());

/// True between init_process_group and destroy_process_group.
bool is_initialized();

/// This process's rank in `group` (the world by default), or -1 when it is not a member.
int get_rank(const ProcessGroup& group = ProcessGroup());

/// The number of ranks of `group` (the world by default), or -1 when this process is not a member.
int get_world_size(const ProcessGroup& group = ProcessGroup());

/// The backend of the default group as resolved at init: "gloo", "shm" or "hierarchical" ("auto"
/// is resolved) for CPU tensors; "nccl" when it was asked for; where "auto" gave CUDA tensors to
/// NCCL, both, as torch.distributed words a backend per device: "cpu:shm,cuda:nccl".
std::string get_backend();

/// Destroys every group; init_process_group may then be called again. Does nothing when no group
/// exists. Not collective, but every rank should call it before exiting.
void destroy_process_group();

/// Creates a group of the given GLOBAL ranks. Collective over the WORLD: every rank calls it, in
/// the same order, members and non-members alike (as in PyTorch). The ranks are sorted; duplicates
/// and ranks outside [0, world_size) are errors. Non-members get a handle whose is_member() is
/// false.
ProcessGroup new_group(const std::vector<int>& ranks);

/// As above, with its own backend ("gloo", "shm", "auto"), as torch.distributed.new_group's
/// `backend` argument; the one-argument form uses the default group's.
ProcessGroup new_group(const std::vector<int>& ranks, const std::string& backend);

}  // namespace ddp
