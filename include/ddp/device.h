// Devices: which one a rank uses, as torch.cuda.set_device(local_rank) decides it in Python.
//
// One process per GPU is the common layout, in two shapes: every process sees all of the host's
// GPUs and uses cuda:LOCAL_RANK, or the launcher gives each process one GPU of its own
// (CUDA_VISIBLE_DEVICES per rank, as Slurm and many clusters do) and it uses cuda:0 whatever its
// LOCAL_RANK. set_device() makes that device current, so that the NCCL backend and new CUDA
// tensors use it, and returns it for model->to(...) and DDPOptions's device_ids; "auto" and
// backend("nccl") learn from it which GPU each rank uses. On a machine (or a libtorch) without CUDA
// it returns the CPU, so the same program runs there unchanged. Thread-safety: the current CUDA
// device is per thread, as in CUDA; call it on the training thread, before init_process_group.
#pragma once

#include <c10/core/Device.h>

namespace ddp {

/// The device of this rank: cuda:0 where this process sees exactly one GPU, cuda:local_rank where
/// it sees several, else the CPU; a CUDA device is made current. local_rank -1 takes the launcher's
/// (LOCAL_RANK from ddprun or torchrun, OMPI_COMM_WORLD_LOCAL_RANK from mpirun, SLURM_LOCALID from
/// Slurm; 0 without any). Throws DistributedError when the process sees several GPUs and local_rank
/// is not below their number (more ranks on this host than GPUs: start at most one rank per GPU, or
/// use the CPU).
c10::Device set_device(int local_rank = -1);

/// The index of the GPU that set_device(local_rank) takes when the process sees `visible_gpus`:
/// -1 for none (the CPU); throws as set_device does.
int cuda_device_index_for(int local_rank, int visible_gpus);

/// The number of GPUs this process sees (0 on CPU builds of libtorch).
int cuda_device_count();

}  // namespace ddp
