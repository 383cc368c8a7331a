// `tripod eval [--config F.toml] (--load DIR | --init-seed S) [--split valid|test] [--samples N] [--json]`
//
// Without --config the checkpoint's own config is used. The config's grid when it fits the world
// size; otherwise a grid that does (see fit_eval_grid), unless --set parallel.* asks for one.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <optional>
#include <nlohmann/json.hpp>

#include "core/log.h"
#include "plan/cost_model.h"
#include "train/commands/commands.h"
#include "train/commands/weights.h"
#include "train/evaluator.h"
#include "train/microbatch.h"
#include "train/mpi_session.h"
#include "train/runtime.h"

namespace tripod {

namespace {

struct EvalOptions {
  std::string config, split = "valid";
  std::vector<std::string> sets;
  WeightOptions weights;
  std::optional<int64_t> samples;  // absent: train.eval_steps global batches
  bool json = false, verbose = false;
};

Config refit_grid(const Config& cfg, int world) {
  const ParallelConfig& was = cfg.parallel;
  auto with_grid = [&](int tp, int pp, int cp) {
    Config c = cfg;
    ParallelConfig& p = c.parallel;
    p.tp = tp;
    p.cp = cp;
    p.dp = world / (tp * pp * cp);
    if (pp != was.pp) {
      p.pp = pp;
      p.vp = 1;
      p.schedule = ScheduleKind::OneFOneB;
      p.schedule_file.clear();
      p.placement = Placement::Loop;
      p.layers_per_stage.clear();
      p.balance_layers = false;
    }
    if (tp == 1) p.sequence_parallel = false;
    const int per_step = c.train.micro_batch_size * p.dp;
    if (c.train.global_batch_size % per_step != 0) c.train.global_batch_size = per_step;
    validate_layout(c, world);
    return c;
  };
  if (world % (was.tp * was.pp * was.cp) == 0) {
    try {
      return with_grid(was.tp, was.pp, was.cp);
    } catch (const InputError&) {
    }
  }
  if (was.cp > 1 && world % (was.tp * was.pp) == 0) {
    try {
      return with_grid(was.tp, was.pp, 1);
    } catch (const InputError&) {
    }
  }
  return with_grid(1, 1, 1);
}

// Makes cfg's grid fit `world` ranks (validate_layout): the config's own when it fits; else its
// tp and pp (and vp) with dp = world / (tp * pp); else (dp = world, pp = 1, tp = 1). The global
// batch becomes micro_batch_size * dp when the old one no longer divides (the caller fixes the
// samples evaluated beforehand). Logs the grid chosen; throws the config's own error when no
// grid fits.
void fit_eval_grid(Config& cfg, int world) {
  Config fits = cfg;
  try {
    validate_layout(fits, world);
    cfg = fits;
    return;
  } catch (const InputError& own) {
    try {
      fits = refit_grid(cfg, world);
    } catch (const InputError&) {
      throw own;
    }
  }
  spdlog::info("eval runs on grid (dp={}, pp={}, tp={}), which fits the {} ranks, not the config's (dp={}, pp={}, "
               "tp={}); --set parallel.* picks a grid", fits.parallel.dp, fits.parallel.pp, fits.parallel.tp, world,
               cfg.parallel.dp, cfg.parallel.pp, cfg.parallel.tp);
  cfg = fits;
}

// Whether --set names a key of [parallel]: the grid asked for is then honoured exactly.
bool sets_parallel(const std::vector<std::string>& sets) {
  return std::any_of(sets.begin(), sets.end(), [](const std::string& s) { return s.starts_with("parallel."); });
}

int run_eval(const EvalOptions& o) {
  MpiSession mpi;
  init_logging(mpi.rank(), mpi.size(), o.verbose);
  // As in `tripod train`: until the grid exists every rank fails the same way, rank 0 reports.
  Config cfg;
  Runtime rt;
  Split split = Split::Valid;
  int64_t samples = 0;
  try {
    check_weight_options(o.weights);
    cfg = load_command_config(o.config, o.weights, o.sets, {.data = true});
    split = parse_eval_split(o.split, "--split");
    TRIPOD_INPUT_CHECK(!o.samples || *o.samples >= 1, "--samples {}: give a positive number of samples (or leave it "
                       "out for train.eval_steps = {} global batches)", o.samples.value_or(0), cfg.train.eval_steps);
    const int64_t batch = cfg.train.global_batch_size;  // 0: derived from dp below
    if (sets_parallel(o.sets))
      validate_layout(cfg, mpi.size());
    else
      fit_eval_grid(cfg, mpi.size());
    resolve_layer_split(cfg);  // parallel.layers_per_stage = "auto"
    samples = o.samples.value_or(cfg.train.eval_steps * (batch > 0 ? batch : cfg.train.global_batch_size));
    check_checkpoint_tokenizer(o.weights, cfg);
    resolve_eod_token(cfg);  // packed documents (data.reset_*, eod_mask_loss) cut at it
    rt = make_runtime(cfg);
  } catch (const InputError& e) {
    rethrow_agreed(e);
  }
  Ops& ops = *rt.ops;
  ParallelContext& par = rt.par;
  std::unique_ptr<SampleSource> data = make_split_source(cfg, split, samples, par.world.get());

  const RankLayout layout = make_eval_layout(cfg, par.rank);
  ParamRegistry reg;
  GptModel model(ops, par, cfg.model, layout.chunks, RecomputeConfig{}, reg);
  reg.allocate(ops);
  load_weights(o.weights, cfg, reg, ops, par);
  Evaluator evaluator(cfg, layout, ops, par, model);
  auto t0 = std::chrono::steady_clock::now();
  EvalResult r = evaluator.evaluate(data.get(), samples);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  spdlog::info("evaluated {} samples ({} tokens) on grid {} in {:.2f} s", r.samples, r.tokens, par.grid.str(), seconds);
  if (mpi.rank() == 0) {
    const char* name = split_name(split);
    if (o.json)
      fmt::print("{}\n", nlohmann::json{{"split", name}, {"loss", r.loss}, {"perplexity", r.perplexity},
                                        {"tokens", r.tokens}, {"samples", r.samples}}.dump());
    else
      fmt::print("eval {}: loss {:.6f} | perplexity {:.4f} | {} tokens ({} samples)\n", name, r.loss, r.perplexity,
                 r.tokens, r.samples);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

CommandFn add_eval_command(CLI::App& app) {
  auto opts = std::make_shared<EvalOptions>();
  CLI::App* sub = app.add_subcommand("eval", "Loss and perplexity of a model on a data split (under mpirun for many ranks)");
  sub->add_option("--config", opts->config,
                  "TOML config file (the model, grid, batch sizes and data); default: the --load checkpoint's");
  add_weight_options(sub, opts->weights);
  sub->add_option("--split", opts->split, "Split to evaluate: valid (data.split's second part) or test (its third)");
  sub->add_option("--samples", opts->samples, "Samples to evaluate (default: train.eval_steps global batches)");
  sub->add_option("--set", opts->sets, "Override a config value: section.key=value (repeatable)");
  sub->add_flag("--json", opts->json, "Print one JSON object: split, loss, perplexity, tokens, samples");
  sub->add_flag("-v,--verbose", opts->verbose, "Debug logging on every rank");
  return [opts] { return run_eval(*opts); };
}

}  // namespace tripod
