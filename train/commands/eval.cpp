// `tripod eval [--config F.toml] (--load DIR | --init-seed S) [--split valid|test] [--samples N] [--json]`
// `tripod eval ... --task NAME [--task-file F] [--tag T] ... [--limit N] [--samples-out F] [--json]`
//
// Without --task: the loss and perplexity on a data split. With --task: downstream tasks
// (train/tasks.h), each from its --task-file or, without one, from the config's [eval] tasks.
// Without --config the checkpoint's own config is used. The config's grid when it fits the world
// size; otherwise a grid that does (see fit_eval_grid), unless --set parallel.* asks for one.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <nlohmann/json.hpp>

#include "core/log.h"
#include "core/output_path.h"
#include "plan/cost_model.h"
#include "train/commands/commands.h"
#include "train/commands/weights.h"
#include "train/evaluator.h"
#include "train/microbatch.h"
#include "train/mpi_session.h"
#include "train/runtime.h"
#include "train/task_evaluator.h"

namespace tripod {

namespace {

struct EvalOptions {
  std::string config, split = "valid";
  std::vector<std::string> sets;
  WeightOptions weights;
  std::optional<int64_t> samples;  // absent: train.eval_steps global batches
  std::vector<std::string> tasks, task_files, tags;  // --task, --task-file, --tag (paired in order)
  std::optional<int64_t> limit;
  std::string samples_out;
  bool json = false, verbose = false;
};

// The tasks --task asks for: each with its --task-file (and --tag), or, without files, the
// config's [eval] task of that name (or tag). --limit applies to all.
std::vector<EvalTaskConfig> command_tasks(const EvalOptions& o, const Config& cfg) {
  TRIPOD_INPUT_CHECK(o.task_files.empty() || o.task_files.size() == o.tasks.size(),
                     "--task-file is given {} time(s) for {} --task: give one file per task, in the same order (or "
                     "none, to use the files of the config's [eval] tasks)", o.task_files.size(), o.tasks.size());
  TRIPOD_INPUT_CHECK(o.tags.empty() || o.tags.size() == o.tasks.size(),
                     "--tag is given {} time(s) for {} --task: give one per task, in the same order", o.tags.size(),
                     o.tasks.size());
  TRIPOD_INPUT_CHECK(!o.limit || *o.limit >= 1, "--limit {}: give a positive number of examples (or leave it out for "
                     "all)", o.limit.value_or(0));
  std::vector<EvalTaskConfig> out;
  for (size_t i = 0; i < o.tasks.size(); ++i) {
    EvalTaskConfig t;
    if (!o.task_files.empty()) {
      const std::optional<TaskKind> kind = parse_enum<TaskKind>(o.tasks[i]);
      TRIPOD_INPUT_CHECK(kind, "--task '{}' is not a task (valid: {})", o.tasks[i], enum_choices<TaskKind>());
      t.name = *kind;
      t.path = o.task_files[i];
    } else {
      std::string configured;
      const EvalTaskConfig* found = nullptr;
      for (const EvalTaskConfig& c : cfg.eval.tasks) {
        configured += fmt::format("{}{}", configured.empty() ? "" : ", ", c.label());
        if (c.label() == o.tasks[i] && !found) found = &c;
      }
      TRIPOD_INPUT_CHECK(found, "--task '{}' without --task-file: the config's [eval] tasks have no task of that name "
                         "({}); give the task's file with --task-file (tasks: {})", o.tasks[i],
                         configured.empty() ? "it has none" : "they are " + configured, enum_choices<TaskKind>());
      t = *found;
    }
    if (!o.tags.empty()) t.tag = o.tags[i];
    if (o.limit) t.limit = *o.limit;
    out.push_back(t);
  }
  Config check;
  check.eval.tasks = out;
  check.eval.validate("the command line (--task, --tag)");
  return out;
}

// The table of `tripod eval --task`: task, metric, value, stderr, examples.
void print_task_table(const std::vector<TaskResult>& results) {
  fmt::print("{:<20} {:<16} {:>10} {:>10} {:>9}\n", "task", "metric", "value", "stderr", "examples");
  for (const TaskResult& r : results)
    for (const TaskMetric& m : r.metrics)
      fmt::print("{:<20} {:<16} {:>10.4f} {:>10} {:>9}\n", r.task, m.name, m.value,
                 m.stderr_of_mean ? fmt::format("{:.4f}", *m.stderr_of_mean) : "-", r.examples);
}

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

// `tripod eval --task`: every task scored on this grid; rank 0 prints the table (or the JSON) and
// writes --samples-out.
int run_tasks(const EvalOptions& o, const Config& cfg, const RankLayout& layout, Ops& ops, ParallelContext& par,
              GptModel& model, ParamRegistry& reg, const std::vector<Task>& tasks) {
  TaskEvaluator scorer(cfg, layout, ops, par, model, reg);
  std::vector<TaskResult> results;
  const auto t0 = std::chrono::steady_clock::now();
  for (const Task& task : tasks) {
    results.push_back(scorer.evaluate(task));
    const TaskResult& r = results.back();
    spdlog::info("{}: {} examples ({} rows) on grid {} in {:.2f} s ({:.1f} examples/s)", r.task, r.examples, r.requests,
                 par.grid.str(), r.seconds, static_cast<double>(r.examples) / std::max(r.seconds, 1e-9));
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (par.rank == 0) {
    if (!o.samples_out.empty()) {
      const std::string tmp = o.samples_out + ".tmp";
      {
        std::ofstream out(tmp);
        for (const TaskResult& r : results)
          for (const nlohmann::json& sample : r.samples) {
            nlohmann::json line = {{"task", r.task}};
            line.update(sample);
            out << line.dump() << '\n';
          }
        TRIPOD_CHECK(out.good(), "writing {}", tmp);
      }
      std::filesystem::rename(tmp, o.samples_out);
    }
    if (o.json) {
      nlohmann::json j = {{"tasks", nlohmann::json::object()}, {"seconds", seconds}};
      for (const TaskResult& r : results) j["tasks"][r.task] = task_result_json(r);
      fmt::print("{}\n", j.dump());
    } else {
      print_task_table(results);
    }
    std::fflush(stdout);
  }
  return 0;
}

int run_eval(const EvalOptions& o) {
  MpiSession mpi;
  init_logging(mpi.rank(), mpi.size(), o.verbose);
  // As in `tripod train`: until the grid exists every rank fails the same way, rank 0 reports.
  Config cfg;
  Runtime rt;
  Split split = Split::Valid;
  int64_t samples = 0;
  std::vector<Task> tasks;
  try {
    check_weight_options(o.weights);
    TRIPOD_INPUT_CHECK(!o.tasks.empty() || (o.task_files.empty() && o.tags.empty() && !o.limit && o.samples_out.empty()),
                       "--task-file, --tag, --limit and --samples-out go with --task NAME (the task to evaluate)");
    TRIPOD_INPUT_CHECK(o.tasks.empty() || !o.samples, "--samples counts samples of a data split; with --task use "
                       "--limit (examples per task)");
    cfg = load_command_config(o.config, o.weights, o.sets, {.data = o.tasks.empty(), .tokenizer = !o.tasks.empty()});
    split = parse_eval_split(o.split, "--split");
    if (!o.tasks.empty()) {
      if (!o.samples_out.empty()) check_output_file(o.samples_out, "--samples-out");
      const std::vector<EvalTaskConfig> asked = command_tasks(o, cfg);
      tasks = load_tasks(cfg, asked, [&](size_t i) {
        return o.task_files.empty() ? fmt::format("--task {} (the config's [eval] task)", o.tasks[i])
                                    : fmt::format("--task-file {}", o.task_files[i]);
      });
    }
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
  std::unique_ptr<SampleSource> data =
      tasks.empty() ? make_split_source(cfg, split, samples, par.world.get()) : nullptr;

  const RankLayout layout = make_eval_layout(cfg, par.rank);
  ParamRegistry reg;
  GptModel model(ops, par, cfg.model, layout.chunks, RecomputeConfig{}, reg);
  reg.allocate(ops);
  load_weights(o.weights, cfg, reg, ops, par);
  if (!tasks.empty()) return run_tasks(o, cfg, layout, ops, par, model, reg, tasks);
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
  CLI::App* sub = app.add_subcommand("eval", "Loss and perplexity on a data split, or downstream tasks (--task), of a model (under mpirun for many ranks)");
  sub->add_option("--config", opts->config,
                  "TOML config file (the model, grid, batch sizes and data); default: the --load checkpoint's");
  add_weight_options(sub, opts->weights);
  sub->add_option("--split", opts->split, "Split to evaluate: valid (data.split's second part) or test (its third)");
  sub->add_option("--samples", opts->samples, "Samples to evaluate (default: train.eval_steps global batches)");
  sub->add_option("--set", opts->sets, "Override a config value: section.key=value (repeatable)");
  sub->add_option("--task", opts->tasks,
                  "A downstream task to evaluate instead of the split's loss (repeatable): hellaswag, multiple_choice "
                  "or bits_per_byte with --task-file, or the name (tag) of one of the config's [eval] tasks");
  sub->add_option("--task-file", opts->task_files, "The file of each --task, in the same order (repeatable)");
  sub->add_option("--tag", opts->tags, "The name each --task's figures get (repeatable; default: the task's name)");
  sub->add_option("--limit", opts->limit, "Evaluate the first N examples (documents) of each task");
  sub->add_option("--samples-out", opts->samples_out,
                  "With --task: write every example's log-likelihoods and outcome to this JSONL file");
  sub->add_flag("--json", opts->json,
                "Print one JSON object: split, loss, perplexity, tokens, samples (with --task: the tasks' figures)");
  sub->add_flag("-v,--verbose", opts->verbose, "Debug logging on every rank");
  return [opts] { return run_eval(*opts); };
}

}  // namespace tripod
