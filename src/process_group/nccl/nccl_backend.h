// The NCCL backend: c10d's ProcessGroupNCCL behind our Backend interface (c10d_backend.h), for
// CUDA tensors. Compiled only where libtorch has CUDA (nccl_backend.cpp); CPU builds compile
// nccl_unavailable.cpp instead, whose answers say so.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "process_group/backend.h"

namespace ddp::detail {

/// True when this build of ddp-cpp has NCCL (libtorch was built with CUDA).
bool nccl_compiled_in();
/// True when NCCL is compiled in and this process sees at least one GPU.
bool nccl_usable();
/// Collective over the group's members (lazily: the communicator is made at the first CUDA
/// collective). Each rank uses the CUDA device current when it makes its first collective
/// (ddp::set_device).
std::shared_ptr<Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                           int group_rank, int group_size,
                                           std::chrono::milliseconds timeout,
                                           const std::string& operation);

}  // namespace ddp::detail
