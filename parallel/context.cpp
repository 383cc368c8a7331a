// Building the per-axis communicators of a grid.
#include "parallel/context.h"

#include <algorithm>

#include "parallel/comm/device_comm.h"
#include "parallel/comm/flight_recorder.h"
#include "parallel/comm/mpi_comm.h"
#include "parallel/comm/mpi_deadline.h"

namespace tripod {

namespace {

std::unique_ptr<Communicator> split(const MpiComm& world, const std::vector<int>& group, int my_rank,
                                    const char* name, const DeviceCommFactory& device) {
  // Every rank calls MPI_Comm_split once per axis; color = the group's first rank.
  MPI_Comm comm;
  int key = static_cast<int>(std::find(group.begin(), group.end(), my_rank) - group.begin());
  {
    MpiDeadline deadline(std::string("MPI_Comm_split of the '") + name + "' communicators",
                         MpiDeadline::limit_for(world.timeout_s()));
    MPI_Comm_split(world.handle(), group.front(), key, &comm);
  }
  auto mpi = std::make_unique<MpiComm>(comm, name, world.ops(), world.timeout_s(), group, world.probe());
  mpi->set_hooks(world.hooks());
  if (device) return device(std::move(mpi), group);
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
  ctx.cp_comm = options.cp_comm;
  ctx.moe_dispatcher = options.moe_dispatcher;
  const DeviceCommFactory device = device_comm_factory(world, options.force_mpi);
  std::vector<int> all(world.size());
  for (int i = 0; i < world.size(); ++i) all[i] = i;
  ctx.flight = options.flight;
  auto axis = [&](const std::vector<int>& group, const char* name) {
    return recorded(split(world, group, ctx.rank, name, device), group, options);
  };
  ctx.world = axis(all, "world");
  ctx.tp = axis(grid.group(Axis::TP, ctx.rank), "tp");
  ctx.dp = axis(grid.group(Axis::DP, ctx.rank), "dp");
  ctx.pp = axis(grid.group(Axis::PP, ctx.rank), "pp");
  if (grid.cp() > 1) {
    ctx.cp = axis(grid.group(Axis::CP, ctx.rank), "cp");
    ctx.dpcp_owned = axis(grid.group(Axis::DPCP, ctx.rank), "dpcp");
    ctx.dpcp = ctx.dpcp_owned.get();
  } else {
    ctx.dpcp = ctx.dp.get();
  }
  if (grid.ep() > 1) {
    ctx.ep = axis(grid.group(Axis::EP, ctx.rank), "ep");
    ctx.edp_owned = axis(grid.group(Axis::EDP, ctx.rank), "edp");
    ctx.edp = ctx.edp_owned.get();
  } else {
    ctx.edp = ctx.dpcp;
  }
  // Embedding group: first and last stage; the middle stages split with MPI_UNDEFINED.
  auto emb = grid.embedding_group(ctx.rank);
  bool member = grid.pp() > 1 && (ctx.first_stage() || ctx.last_stage());
  MPI_Comm comm;
  {
    MpiDeadline deadline("MPI_Comm_split of the 'embedding' communicators", MpiDeadline::limit_for(world.timeout_s()));
    MPI_Comm_split(world.handle(), member ? emb.front() : MPI_UNDEFINED, ctx.coords.pp, &comm);
  }
  if (member) {
    auto mpi = std::make_unique<MpiComm>(comm, "embedding", world.ops(), world.timeout_s(), emb, world.probe());
    mpi->set_hooks(world.hooks());
    std::unique_ptr<Communicator> c;
    if (device)
      c = device(std::move(mpi), emb);
    else
      c = std::move(mpi);
    ctx.embedding = recorded(std::move(c), emb, options);
  }
  return ctx;
}

}  // namespace tripod
