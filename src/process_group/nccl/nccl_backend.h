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
/// The GPUs this process sees; 0 where NCCL is not compiled in.
int visible_gpus();
/// Sets c10d's NCCL error handling (CleanUpOnly) in the environment unless the user set it; a
/// no-op on CPU builds. Call before any thread starts: init_process_group does, first.
void prepare_nccl_error_handling();
/// Collective over the group's members. Each rank uses the CUDA device current when the group
/// is made (ddp::set_device); NCCL's communicator itself is made at the first CUDA collective.
/// `required` (backend "nccl"): checks first that every member has a GPU of its own
/// (gpu_inventory.h), an error naming them otherwise; "auto" decided that before asking.
std::shared_ptr<Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                           int group_rank, int group_size,
                                           std::chrono::milliseconds timeout,
                                           const std::string& operation, bool required);

}  // namespace ddp::detail
