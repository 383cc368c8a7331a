// Building the per-axis communicators of a grid.
#include "parallel/context.h"

#include <algorithm>

#include "parallel/comm/flight_recorder.h"
#include "parallel/comm/mpi_comm.h"
#ifdef TRIPOD_HAVE_NCCL
#include <spdlog/spdlog.h>

#include "kernels/cuda/cuda_ops.h"
#include "parallel/comm/nccl_comm.h"
#endif

namespace tripod {

namespace cuda {
class CudaOps;
}

namespace {

// The GPU backend when every rank has a GPU of its own, so NCCL can carry the device tensors;
// null for the CPU backend and when ranks share GPUs (NCCL refuses two ranks on one GPU), where
// MPI stages device tensors through pinned host memory instead. Collective over the world.
#ifdef TRIPOD_HAVE_NCCL
cuda::CudaOps* nccl_backend(const MpiComm& world, bool force_mpi) {
  auto* ops = dynamic_cast<cuda::CudaOps*>(world.ops());
  int ok = ops != nullptr && !force_mpi;
  int node_ranks = 1;
  if (ok) {
    MPI_Comm node;
    MPI_Comm_split_type(world.handle(), MPI_COMM_TYPE_SHARED, world.rank(), MPI_INFO_NULL, &node);
    MPI_Comm_size(node, &node_ranks);
    MPI_Comm_free(&node);
    if (node_ranks > cuda_device_count()) ok = 0;
  }
  int all_ok = ok;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, world.handle());
  if (ops && !all_ok && world.rank() == 0 && !force_mpi)
    spdlog::warn("{} ranks share the {} GPU(s) of a node: communication is staged through host memory with MPI, "
                 "which is slow (NCCL needs one GPU per rank); use this for correctness runs",
                 node_ranks, cuda_device_count());
  return all_ok ? ops : nullptr;
}
#endif

std::unique_ptr<Communicator> split(const MpiComm& world, const std::vector<int>& group, int my_rank,
                                    const char* name, cuda::CudaOps* nccl_ops) {
  // Every rank calls MPI_Comm_split once per axis; color = the group's first rank.
  MPI_Comm comm;
  int key = static_cast<int>(std::find(group.begin(), group.end(), my_rank) - group.begin());
  MPI_Comm_split(world.handle(), group.front(), key, &comm);
  auto mpi = std::make_unique<MpiComm>(comm, name, world.ops(), world.timeout_s(), group, world.probe());
  mpi->set_hooks(world.hooks());
#ifdef TRIPOD_HAVE_NCCL
  if (nccl_ops) return std::make_unique<NcclComm>(std::move(mpi), *nccl_ops, group);
#endif
  return mpi;
}

// The communicator as recorded by the flight recorder (when there is one).
std::unique_ptr<Communicator> recorded(std::unique_ptr<Communicator> c, const std::vector<int>& group,
                                       const ContextOptions& options) {
  if (!options.flight) return c;
  return std::make_unique<RecordingComm>(std::move(c), options.flight, group, options.comm_fault);
}

}  // namespace

ParallelContext make_parallel_context(const MpiComm& world, const RankGrid& grid, const ContextOptions& options) {
  TRIPOD_CHECK(world.size() == grid.world_size(), "grid {} needs {} ranks, the world has {}", grid.str(),
               grid.world_size(), world.size());
  ParallelContext ctx;
  ctx.grid = grid;
  ctx.rank = world.rank();
  ctx.coords = grid.coords(ctx.rank);
  ctx.sequence_parallel = options.sequence_parallel;
  cuda::CudaOps* nccl_ops = nullptr;
#ifdef TRIPOD_HAVE_NCCL
  nccl_ops = nccl_backend(world, options.force_mpi);
#endif
  std::vector<int> all(world.size());
  for (int i = 0; i < world.size(); ++i) all[i] = i;
  ctx.flight = options.flight;
  auto axis = [&](const std::vector<int>& group, const char* name) {
    return recorded(split(world, group, ctx.rank, name, nccl_ops), group, options);
  };
  ctx.world = axis(all, "world");
  ctx.tp = axis(grid.group(Axis::TP, ctx.rank), "tp");
  ctx.dp = axis(grid.group(Axis::DP, ctx.rank), "dp");
  ctx.pp = axis(grid.group(Axis::PP, ctx.rank), "pp");
  // Embedding group: first and last stage; the middle stages split with MPI_UNDEFINED.
  auto emb = grid.embedding_group(ctx.rank);
  bool member = grid.pp() > 1 && (ctx.first_stage() || ctx.last_stage());
  MPI_Comm comm;
  MPI_Comm_split(world.handle(), member ? emb.front() : MPI_UNDEFINED, ctx.coords.pp, &comm);
  if (member) {
    auto mpi = std::make_unique<MpiComm>(comm, "embedding", world.ops(), world.timeout_s(), emb, world.probe());
    mpi->set_hooks(world.hooks());
#ifdef TRIPOD_HAVE_NCCL
    if (nccl_ops)
      ctx.embedding = std::make_unique<NcclComm>(std::move(mpi), *nccl_ops, emb);
    else
#endif
      ctx.embedding = std::move(mpi);
    ctx.embedding = recorded(std::move(ctx.embedding), emb, options);
  }
  return ctx;
}

}  // namespace tripod
