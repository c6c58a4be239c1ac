// Allocator tuning: the malloc behaviour a training process needs, given by the library itself.
//
// With glibc's defaults a C++ trainer hands its freed activations back to the kernel at the end
// of every step (the free top of the heap is trimmed once it exceeds a threshold that starts at
// 128 KiB) and page-faults them in again in the next step: up to half of a small ResNet's step
// here (bench/README.md, "Allocator"). Python processes escape it by accident, their imports
// having raised glibc's dynamic thresholds long before training starts. So init_process_group
// raises the thresholds (mmap 32 MiB, trim 256 MiB: what ddprun's GLIBC_TUNABLES say), however
// the process was started: ddprun, torchrun, mpirun, srun or by hand. A user who tunes malloc
// (GLIBC_TUNABLES with a glibc.malloc entry, or a MALLOC_* variable such as
// MALLOC_TRIM_THRESHOLD_) keeps their own settings, and InitOptions().tune_allocator(false) turns
// it off. Not thread-safe with concurrent mallopt calls (glibc's own rule).
#pragma once

#include <string>
#include <vector>

#include "rendezvous/rendezvous_spec.h"

namespace ddp::detail {

/// mallopt's values; equal to ddprun's GLIBC_TUNABLES (tools/ddprun/worker_env.h).
inline constexpr int kMmapThresholdBytes = 32 << 20;
inline constexpr int kTrimThresholdBytes = 256 << 20;

/// Why the allocator is left alone: the user's own tuning, named; empty when it may be tuned.
/// `names` are the process's environment variable names, `env` looks their values up.
std::string user_malloc_tuning(const std::vector<std::string>& names,
                               const rendezvous::EnvLookup& env);

/// Applies the thresholds (glibc only). Returns false where mallopt is unavailable or refused.
bool tune_allocator_for_training();

/// The names of the process environment's variables (the edge: init_process_group).
std::vector<std::string> environment_names();

}  // namespace ddp::detail
