// Connects this process to the job's key-value store, as described by a RendezvousSpec.
//
// env:// and tcp://: rank 0 hosts a c10d TCPStore, the others connect to it (under torchrun's
// static rendezvous every rank is a client of the agent's store instead). file://: a c10d
// FileStore, with the keys of each run under their own generation prefix, so that a file left over
// by a crashed run does not break or hang the next one (file_rendezvous.h).
#pragma once

#include <chrono>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "rendezvous/rendezvous_spec.h"

namespace ddp::rendezvous {

/// The prefix of the default group's keys in the job's store, as torch.distributed names it.
inline constexpr const char* kDefaultGroupPrefix = "default_pg";

/// In the default store (kDefaultGroupPrefix), set by rank 0 once the world is complete: marks a
/// server whose job has started (see connect_store).
inline constexpr const char* kJobStartedKey = "ddp_job_started";

/// Throws DistributedError for a port already in use, an unreachable store and the like.
c10::intrusive_ptr<c10d::Store> connect_store(const RendezvousSpec& spec,
                                              std::chrono::milliseconds timeout);

}  // namespace ddp::rendezvous
