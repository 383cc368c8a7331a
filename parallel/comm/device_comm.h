// Communicators that carry device tensors natively, provided by the GPU backend's build: the grid
// builder (parallel/context.cpp) asks for a factory and wraps each axis's MPI communicator with
// it, knowing nothing of the backend. CUDA builds implement it with NCCL (nccl_comm.cpp); other
// builds have none (no_device_comm.cpp).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "parallel/comm/communicator.h"
#include "parallel/comm/mpi_comm.h"

namespace tripod {

// Turns the MPI communicator over `group` (world ranks, in order) into a device communicator.
// Collective over the group's members.
using DeviceCommFactory =
    std::function<std::unique_ptr<Communicator>(std::unique_ptr<MpiComm> mpi, const std::vector<int>& group)>;

// The factory for `world`'s backend, or an empty one where MPI carries device tensors (the CPU
// backend; GPUs shared by several ranks, which NCCL refuses, with a warning; `force_mpi`).
// Collective over the world.
DeviceCommFactory device_comm_factory(const MpiComm& world, bool force_mpi);

}  // namespace tripod
