// `tripod train --config F.toml [--set section.key=value ...]`
#include <spdlog/spdlog.h>

#include <cstdlib>

#include "core/log.h"
#include "data/gpt_data.h"
#include "data/sample_source.h"
#include "parallel/pipeline/simulate.h"
#include "train/commands/commands.h"
#include "train/evaluator.h"
#include "config/memory_plan.h"
#include "train/mpi_session.h"
#include "train/runtime.h"
#include "train/trainer.h"

namespace tripod {

namespace {

struct TrainOptions {
  std::string config;
  std::vector<std::string> sets;
  bool verbose = false;
  bool dry_run = false;
};

int run_train(const TrainOptions& o) {
  MpiSession mpi;
  init_logging(mpi.rank(), mpi.size(), o.verbose);
  Config cfg;
  Runtime rt;
  try {
    cfg = load_config(o.config, o.sets);
    if (o.dry_run) {
      // The plan for the grid the config asks for (dp = 1 when not given), before any allocation.
      if (cfg.parallel.dp == 0) cfg.parallel.dp = 1;
      validate_layout(cfg, cfg.parallel.tp * cfg.parallel.pp * cfg.parallel.dp);
      if (mpi.rank() == 0) {
        Schedule s = make_schedule(cfg);
        Simulation sim = simulate(s, PipeCosts{});
        fmt::print("grid (dp={}, pp={}, tp={}), vp {}, {} schedule over {} micro-batches per step: simulated bubble "
                   "{:.1f}%\n{}",
                   cfg.parallel.dp, cfg.parallel.pp, cfg.parallel.tp, cfg.parallel.vp, s.kind, s.microbatches,
                   100 * sim.bubble, memory_table(cfg, plan_memory(cfg)));
      }
      return 0;
    }
    validate_layout(cfg, mpi.size());
    rt = make_runtime(cfg);
  } catch (const InputError& e) {
    rethrow_agreed(e);
  }
  ParallelContext& par = rt.par;

  std::unique_ptr<SampleSource> data = make_split_source(
      cfg, Split::Train, std::max<int64_t>(1, cfg.train.steps * cfg.train.global_batch_size), par.world.get());

  // The validation split, read by the periodic evaluation (train.eval_interval).
  std::unique_ptr<SampleSource> valid;
  if (cfg.train.eval_interval > 0)
    valid = make_split_source(cfg, Split::Valid, cfg.train.eval_steps * cfg.train.global_batch_size, par.world.get());

  Trainer trainer(cfg, *rt.ops, par, data.get(), valid.get(), rt.debug);
  trainer.run();
  spdlog::info("done: {} steps; metrics in {}/metrics.jsonl", trainer.completed_steps(), cfg.train.output_dir);
  return 0;
}

}  // namespace

CommandFn add_train_command(CLI::App& app) {
  auto opts = std::make_shared<TrainOptions>();
  CLI::App* sub = app.add_subcommand("train", "Train a GPT from a TOML config (under mpirun for many ranks)");
  sub->add_option("--config", opts->config, "TOML config file")->required();
  sub->add_option("--set", opts->sets, "Override a config value: section.key=value (repeatable)");
  sub->add_flag("-v,--verbose", opts->verbose, "Debug logging on every rank");
  sub->add_flag("--dry-run", opts->dry_run,
                "Print the schedule's bubble and every rank's memory estimate for the config's grid, then exit");
  return [opts] { return run_train(*opts); };
}

}  // namespace tripod
