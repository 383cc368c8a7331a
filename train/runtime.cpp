// The one start-up path of train, eval, generate and the benchmarks.
#include "train/runtime.h"

#include "train/mpi_session.h"

namespace tripod {

std::unique_ptr<Ops> make_rank_ops(const Config& cfg, const DebugOptions& debug) {
  const int gpus = cuda_device_count();
  return make_ops(cfg.train.device,
                  gpus > 0 ? MpiSession::local_rank() % gpus : 0, debug);
}

Runtime make_runtime(const Config& cfg) {
  Runtime rt;
  rt.debug = read_debug_options();
  rt.ops = make_rank_ops(cfg, rt.debug);
  const ParallelConfig& pc = cfg.parallel;
  rt.world = mpi_world(rt.ops.get(), pc.timeout_s);
  rt.par = make_parallel_context(*rt.world, RankGrid(pc.tp, pc.dp, pc.pp),
                                 {.sequence_parallel = pc.sequence_parallel, .force_mpi = rt.debug.force_mpi});
  return rt;
}

}  // namespace tripod
