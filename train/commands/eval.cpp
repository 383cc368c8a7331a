// `tripod eval --config F.toml (--load DIR | --init-seed S) [--split valid|test] [--samples N] [--json]`
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdlib>
#include <optional>
#include <nlohmann/json.hpp>

#include "core/log.h"
#include "parallel/comm/mpi_comm.h"
#include "train/commands/commands.h"
#include "train/commands/weights.h"
#include "train/evaluator.h"
#include "train/mpi_session.h"

namespace tripod {

namespace {

struct EvalOptions {
  std::string config, split = "valid";
  std::vector<std::string> sets;
  WeightOptions weights;
  std::optional<int64_t> samples;  // absent: train.eval_steps global batches
  bool json = false, verbose = false;
};

int run_eval(const EvalOptions& o) {
  MpiSession mpi;
  init_logging(mpi.rank(), mpi.size(), o.verbose);
  // As in `tripod train`: until the grid exists every rank fails the same way, rank 0 reports.
  Config cfg;
  std::unique_ptr<Ops> ops;
  Split split = Split::Valid;
  int64_t samples = 0;
  try {
    cfg = load_config(o.config, o.sets);
    check_weight_options(o.weights);
    split = parse_eval_split(o.split, "--split");
    TRIPOD_INPUT_CHECK(!o.samples || *o.samples >= 1, "--samples {}: give a positive number of samples (or leave it "
                       "out for train.eval_steps = {} global batches)", o.samples.value_or(0), cfg.train.eval_steps);
    validate_layout(cfg, mpi.size());
    samples = o.samples.value_or(cfg.train.eval_steps * cfg.train.global_batch_size);
    ops = make_rank_ops(cfg);
  } catch (const InputError& e) {
    exit_on_bad_input(mpi, e);
  }
  auto world = mpi_world(ops.get(), cfg.parallel.timeout_s);
  ParallelContext par = make_parallel_context(*world, RankGrid(cfg.parallel.tp, cfg.parallel.dp, cfg.parallel.pp));
  par.sequence_parallel = cfg.parallel.sequence_parallel;
  std::unique_ptr<SampleSource> data = make_split_source(cfg, split, samples, par.world.get());

  ParamRegistry reg;
  auto counts = layers_per_stage(cfg.model.n_layers, cfg.parallel.pp, cfg.parallel.vp, cfg.parallel.layers_per_stage);
  GptModel model(*ops, par, cfg.model, rank_chunks(counts, cfg.parallel.pp, cfg.parallel.vp, par.coords.pp),
                 RecomputeConfig{}, reg);
  reg.allocate(*ops);
  load_weights(o.weights, cfg, reg, *ops, par);
  Evaluator evaluator(cfg, *ops, par, model);
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
  sub->add_option("--config", opts->config, "TOML config file (the model, grid, batch sizes and data)")->required();
  add_weight_options(sub, opts->weights);
  sub->add_option("--split", opts->split, "Split to evaluate: valid (data.split's second part) or test (its third)");
  sub->add_option("--samples", opts->samples, "Samples to evaluate (default: train.eval_steps global batches)");
  sub->add_option("--set", opts->sets, "Override a config value: section.key=value (repeatable)");
  sub->add_flag("--json", opts->json, "Print one JSON object: split, loss, perplexity, tokens, samples");
  sub->add_flag("-v,--verbose", opts->verbose, "Debug logging on every rank");
  return [opts] { return run_eval(*opts); };
}

}  // namespace tripod
