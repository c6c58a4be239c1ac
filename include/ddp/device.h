// Devices: which one a rank uses, as torch.cuda.set_device(local_rank) decides it in Python.
//
// One process per GPU is the common layout: the launcher gives each process its LOCAL_RANK, and
// the process uses cuda:LOCAL_RANK. set_device() makes that device current, so that the NCCL
// backend and new CUDA tensors use it, and returns it for model->to(...) and DDPOptions's
// device_ids. On a machine (or a libtorch) without CUDA it returns the CPU, so the same program
// runs there unchanged. Thread-safety: the current CUDA device is per thread, as in CUDA; call it
// on the training thread, before init_process_group.
#pragma once

#include <c10/core/Device.h>

namespace ddp {

/// The device of this rank: cuda:local_rank where this process sees GPUs, else the CPU; a CUDA
/// device is made current. local_rank -1 takes the launcher's (LOCAL_RANK from ddprun or
/// torchrun, OMPI_COMM_WORLD_LOCAL_RANK from mpirun, SLURM_LOCALID from Slurm; 0 without any).
/// Throws DistributedError when local_rank is not below the number of GPUs (more ranks on this
/// host than GPUs: start at most one rank per GPU, or use the CPU).
c10::Device set_device(int local_rank = -1);

/// The number of GPUs this process sees (0 on CPU builds of libtorch).
int cuda_device_count();

}  // namespace ddp
