// Weights for eval and generate: a checkpoint resharded to this grid, or a random initialisation.
#include "train/commands/weights.h"

#include <spdlog/spdlog.h>

#include "checkpoint/load.h"
#include "checkpoint/metadata.h"
#include "checkpoint/reader.h"
#include "checkpoint/reshard.h"
#include "core/error.h"

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
  std::string dir, error;
  try {
    dir = resolve_checkpoint(w.load, cfg.checkpoint.dir);
    {
      CheckpointReader reader(dir);
      if (reader.metadata().contains("model"))
        check_model_record(reader.metadata()["model"], model_to_json(cfg.model), dir);
    }
    load_param_values(dir, reg, ops);
  } catch (const InputError& e) {
    error = e.what();
  }
  throw_if_any_failed(error, *par.world);
  spdlog::info("weights: {} (resharded to grid {})", dir, par.grid.str());
}

}  // namespace tripod
