// Where `tripod eval` and `tripod generate` get their config and weights: the one spot that
// connects them to the checkpoint reader. --load DIR reads a checkpoint (resharded to this rank's
// grid), and without --config its config too; --init-seed S fills the parameters as training's
// step 0 would (ParamRegistry::initialize, the same values on every grid).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/param_registry.h"
#include "parallel/context.h"
#include "config/config.h"

namespace tripod {

struct WeightOptions {
  std::string load;                    // a checkpoint directory, or "latest" (in checkpoint.dir)
  std::optional<uint64_t> init_seed;   // random weights instead
};

// The files a command reads, which must exist when its config comes from a checkpoint.
struct ConfigFiles {
  bool data = false;       // data.prefixes' .bin and .idx (unless data.synthetic)
  bool tokenizer = false;  // data.tokenizer
};

// The command's config: `config` (a TOML file) when given, else the resolved config that the
// checkpoint of --load was saved with (its metadata's config_toml); `sets` apply on top either
// way. InputError when neither is given, or, from a checkpoint, when a file in `needs` no longer
// exists (naming the key and the path, to fix with --set).
Config load_command_config(const std::string& config, const WeightOptions& w, const std::vector<std::string>& sets,
                           ConfigFiles needs);

// Adds --load and --init-seed to a command.
void add_weight_options(CLI::App* sub, WeightOptions& w);
// InputError unless exactly one of --load and --init-seed is given.
void check_weight_options(const WeightOptions& w);
// With --load: InputError when the checkpoint records another tokenizer than cfg's data.tokenizer
// (its kind and the fingerprint of its files), naming both. Nothing to check without --load,
// data.tokenizer (or its files: a warning) or a record.
void check_checkpoint_tokenizer(const WeightOptions& w, const Config& cfg);
// Fills every parameter of `reg` (allocated) from the chosen source. Collective over the world.
void load_weights(const WeightOptions& w, const Config& cfg, ParamRegistry& reg, Ops& ops, ParallelContext& par);

}  // namespace tripod
