// Building the per-axis communicators of a grid.
#include "parallel/context.h"

#include <algorithm>

#include "parallel/comm/device_comm.h"
#include "parallel/comm/mpi_comm.h"

namespace tripod {

namespace {

std::unique_ptr<Communicator> split(const MpiComm& world, const std::vector<int>& group, int my_rank,
                                    const char* name, const DeviceCommFactory& device) {
  // Every rank calls MPI_Comm_split once per axis; color = the group's first rank.
  MPI_Comm comm;
  int key = static_cast<int>(std::find(group.begin(), group.end(), my_rank) - group.begin());
  MPI_Comm_split(world.handle(), group.front(), key, &comm);
  auto mpi = std::make_unique<MpiComm>(comm, name, world.ops(), world.timeout_s(), group, world.probe());
  if (device) return device(std::move(mpi), group);
  return mpi;
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
  const DeviceCommFactory device = device_comm_factory(world, options.force_mpi);
  std::vector<int> all(world.size());
  for (int i = 0; i < world.size(); ++i) all[i] = i;
  ctx.world = split(world, all, ctx.rank, "world", device);
  ctx.tp = split(world, grid.group(Axis::TP, ctx.rank), ctx.rank, "tp", device);
  ctx.dp = split(world, grid.group(Axis::DP, ctx.rank), ctx.rank, "dp", device);
  ctx.pp = split(world, grid.group(Axis::PP, ctx.rank), ctx.rank, "pp", device);
  // Embedding group: first and last stage; the middle stages split with MPI_UNDEFINED.
  auto emb = grid.embedding_group(ctx.rank);
  bool member = grid.pp() > 1 && (ctx.first_stage() || ctx.last_stage());
  MPI_Comm comm;
  MPI_Comm_split(world.handle(), member ? emb.front() : MPI_UNDEFINED, ctx.coords.pp, &comm);
  if (member) {
    auto mpi = std::make_unique<MpiComm>(comm, "embedding", world.ops(), world.timeout_s(), emb, world.probe());
    if (device)
      ctx.embedding = device(std::move(mpi), emb);
    else
      ctx.embedding = std::move(mpi);
  }
  return ctx;
}

}  // namespace tripod
