// Weights for eval and generate: a checkpoint resharded to this grid, or a random initialisation.
#include "train/commands/weights.h"

#include <spdlog/spdlog.h>

#include <filesystem>

#include "checkpoint/load.h"
#include "checkpoint/metadata.h"
#include "checkpoint/reader.h"
#include "checkpoint/reshard.h"
#include "core/error.h"
#include "data/tokenizer.h"

namespace tripod {

namespace fs = std::filesystem;

Config load_command_config(const std::string& config, const WeightOptions& w, const std::vector<std::string>& sets,
                           ConfigFiles needs) {
  const ConfigUse use{.training = false, .data = needs.data};
  if (!config.empty()) return load_config(config, sets, use);
  TRIPOD_INPUT_CHECK(!w.load.empty(), "give --config F.toml, or --load CKPT (a checkpoint holds its run's config)");
  TRIPOD_INPUT_CHECK(w.load != "latest", "--load latest looks in checkpoint.dir, which needs --config; without it "
                     "give the checkpoint directory (checkpoint.dir or one of its iter_NNNNNNN)");
  const std::string dir = resolve_checkpoint(w.load, "");
  const nlohmann::json meta = CheckpointReader(dir).metadata();
  TRIPOD_INPUT_CHECK(meta.contains("config_toml") && meta["config_toml"].is_string(),
                     "{}/metadata.json holds no config (config_toml); give --config F.toml", dir);
  Config cfg = parse_config(meta["config_toml"].get<std::string>(), dir + "/metadata.json (config_toml)", sets, use);
  auto exists = [&](const std::string& key, const std::string& path) {
    TRIPOD_INPUT_CHECK(fs::exists(path), "{} = \"{}\" (from the config in {}/metadata.json) does not exist; give the "
                       "file with --set {}=PATH or give --config F.toml", key, path, dir, key);
  };
  if (needs.tokenizer && !cfg.data.tokenizer.empty()) exists("data.tokenizer", cfg.data.tokenizer);
  if (needs.data && !cfg.data.synthetic)
    for (const std::string& p : cfg.data.prefixes) {
      exists("data.prefixes", p + ".bin");
      exists("data.prefixes", p + ".idx");
    }
  return cfg;
}

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

void check_checkpoint_tokenizer(const WeightOptions& w, const Config& cfg) {
  if (w.load.empty() || cfg.data.tokenizer.empty()) return;
  const std::string dir = resolve_checkpoint(w.load, cfg.checkpoint.dir);
  const nlohmann::json meta = CheckpointReader(dir).metadata();
  if (!meta.contains("tokenizer")) return;
  Tokenizer::Identity id;
  try {
    id = Tokenizer::identify(cfg.data.tokenizer, cfg.data.tokenizer_pattern);
  } catch (const InputError& e) {
    // eval reads token ids, not the tokenizer: a tokenizer that is gone cannot be compared.
    spdlog::warn("data.tokenizer not compared with the checkpoint's: {}", e.what());
    return;
  }
  check_tokenizer_record(meta["tokenizer"], id, cfg.data.tokenizer, dir);
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
