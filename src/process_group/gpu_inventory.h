// Which GPU each rank uses, and whether a group's CUDA tensors can go to NCCL.
//
// NCCL needs a GPU of its own for every member of a communicator: two members on one GPU are
// refused at the first collective (or hang, in some releases), and a member without a GPU cannot
// take part at all. Every rank therefore names the GPU it uses, by UUID, so that ranks that see
// the same GPU under different indices (CUDA_VISIBLE_DEVICES per rank) are still told apart from
// ranks that truly share one. "auto" gives CUDA tensors to NCCL only when every member has its
// own; backend("nccl") refuses the group otherwise, naming the members. Pure functions, apart
// from local_gpu_identity (which asks the CUDA runtime, on CUDA builds).
#pragma once

#include <string>
#include <vector>

namespace ddp::detail {

/// The identity of the GPU this process uses for NCCL, the current CUDA device (which
/// ddp::set_device chose): "<uuid>@cuda:<index>", or "" where it sees none (or libtorch has no
/// CUDA). Defined beside the NCCL backend (nccl_backend.cpp, nccl_unavailable.cpp).
std::string local_gpu_identity();

/// "" when every member (by group rank) has a GPU and no two share one; otherwise why not, in
/// words that name the members and the GPUs.
std::string why_members_lack_own_gpu(const std::vector<std::string>& gpu_by_member);

/// The GPU index that an identity names ("cuda:1"), for messages; "" for none.
std::string gpu_index_of(const std::string& identity);

}  // namespace ddp::detail
