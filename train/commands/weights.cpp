// Weights for eval and generate. The checkpoint reader (checkpoint/load.h) comes from the
// checkpoint branch; until it is in the tree, --load refuses with an error that says so.
#include "train/commands/weights.h"

#include <spdlog/spdlog.h>

#include "core/error.h"

#if __has_include("checkpoint/load.h")
#include "checkpoint/load.h"
#define TRIPOD_HAVE_CHECKPOINT_LOAD 1
#endif

namespace tripod {

void add_weight_options(CLI::App* sub, WeightOptions& w) {
  sub->add_option("--load", w.load, "Checkpoint directory to read the weights from (or \"latest\" in checkpoint.dir)");
  sub->add_option("--init-seed", w.init_seed,
                  "No checkpoint: initialise the weights as training would with this seed (for tests and timing)");
}

void check_weight_options(const WeightOptions& w) {
  TRIPOD_INPUT_CHECK(w.load.empty() != !w.init_seed.has_value(),
                     "give exactly one of --load DIR (a checkpoint) and --init-seed S (random weights){}",
                     w.load.empty() ? "" : "; both were given");
}

void load_weights(const WeightOptions& w, const Config& cfg, ParamRegistry& reg, Ops& ops, ParallelContext& par) {
  if (w.init_seed) {
    reg.initialize(ops, *w.init_seed);
    spdlog::info("weights: random initialisation with seed {} (--init-seed)", *w.init_seed);
    return;
  }
#ifdef TRIPOD_HAVE_CHECKPOINT_LOAD
  // The lead points this at the checkpoint reader's final signature on merge.
  const std::string dir = resolve_checkpoint(w.load, cfg.checkpoint.dir);
  load_param_values(dir, reg, ops, par);
  spdlog::info("weights: {} (resharded to grid {})", dir, par.grid.str());
#else
  (void)cfg;
  (void)reg;
  (void)ops;
  (void)par;
  throw InputError(fmt::format("--load {}: this build has no checkpoint reader (checkpoint/load.h is not in the "
                               "tree yet); use --init-seed S for random weights", w.load));
#endif
}

}  // namespace tripod
