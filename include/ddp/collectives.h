// The collectives of torch.distributed, as free functions.
//
// Each takes an optional trailing group (the world by default). src and dst are always GLOBAL
// ranks, as in PyTorch. Tensors may be of any dtype the backend supports and need not be
// contiguous (they are copied in and out). Every call is collective over its group: all members
// must make the same calls in the same order. Failures (a peer that died, the group timeout, a
// caller outside the group, mismatched tensors) are thrown as DistributedError.
// Thread-safety: collectives on one group must be issued from one thread at a time.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <vector>

#include "ddp/process_group.h"

namespace ddp {

void all_reduce(at::Tensor& tensor, ReduceOp op = ReduceOp::SUM,
                const ProcessGroup& group = ProcessGroup());
Work all_reduce_async(at::Tensor& tensor, ReduceOp op = ReduceOp::SUM,
                      const ProcessGroup& group = ProcessGroup());

/// Overwrites `tensor` on every rank with its value on global rank `src`.
void broadcast(at::Tensor& tensor, int src, const ProcessGroup& group = ProcessGroup());
Work broadcast_async(at::Tensor& tensor, int src, const ProcessGroup& group = ProcessGroup());

/// Reduces into `tensor` on global rank `dst`; other ranks' tensors are left unspecified (as in
/// PyTorch, they may hold partial results).
void reduce(at::Tensor& tensor, int dst, ReduceOp op = ReduceOp::SUM,
            const ProcessGroup& group = ProcessGroup());

/// One tensor per group rank, in group-rank order.
std::vector<at::Tensor> all_gather(const at::Tensor& tensor,
                                   const ProcessGroup& group = ProcessGroup());
Work all_gather_async(const at::Tensor& tensor, std::vector<at::Tensor>& outputs,
                      const ProcessGroup& group = ProcessGroup());

/// On global rank `dst`: one tensor per group rank; on the other ranks: an empty vector.
std::vector<at::Tensor> gather(const at::Tensor& tensor, int dst,
                               const ProcessGroup& group = ProcessGroup());

/// `inputs` (one tensor per group rank, each shaped like `out`) are read on global rank `src` only.
void scatter(at::Tensor& out, const std::vector<at::Tensor>& inputs, int src,
             const ProcessGroup& group = ProcessGroup());

/// `out` receives the reduction over ranks of inputs[group_rank]; inputs has one tensor per group
/// rank, each shaped like `out`.
void reduce_scatter(at::Tensor& out, const std::vector<at::Tensor>& inputs,
                    ReduceOp op = ReduceOp::SUM, const ProcessGroup& group = ProcessGroup());

/// The flat all-gather (torch.distributed.all_gather_into_tensor): `output` receives every group
/// rank's `input`, in group-rank order; it has group-size times input's elements (any shape: a
/// concatenation along dim 0 or a stack). Both share a dtype and a device.
void all_gather_into_tensor(at::Tensor& output, const at::Tensor& input,
                            const ProcessGroup& group = ProcessGroup());
Work all_gather_into_tensor_async(at::Tensor& output, const at::Tensor& input,
                                  const ProcessGroup& group = ProcessGroup());

/// The flat reduce-scatter (torch.distributed.reduce_scatter_tensor): `input` holds group-size
/// runs of output's element count; `output` receives the reduction over ranks of the run of this
/// group rank. Native on shm and NCCL; elsewhere one all-reduce of a copy of `input` (twice the
/// bytes of a native one).
void reduce_scatter_tensor(at::Tensor& output, const at::Tensor& input, ReduceOp op = ReduceOp::SUM,
                           const ProcessGroup& group = ProcessGroup());
Work reduce_scatter_tensor_async(at::Tensor& output, const at::Tensor& input,
                                 ReduceOp op = ReduceOp::SUM,
                                 const ProcessGroup& group = ProcessGroup());

void send(const at::Tensor& tensor, int dst, const ProcessGroup& group = ProcessGroup(),
          int tag = 0);
void recv(at::Tensor& tensor, int src, const ProcessGroup& group = ProcessGroup(), int tag = 0);

void barrier(const ProcessGroup& group = ProcessGroup());

/// A barrier that reports who is missing: on timeout, rank 0 of the group throws an error naming
/// every rank that did not arrive; the others throw an error saying rank 0 did not release them.
void monitored_barrier(std::chrono::milliseconds timeout,
                       const ProcessGroup& group = ProcessGroup());
void monitored_barrier(const ProcessGroup& group = ProcessGroup());

}  // namespace ddp
