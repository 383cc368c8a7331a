// `tripod train --config F.toml [--set section.key=value ...]`
#include <spdlog/spdlog.h>

#include <sys/stat.h>

#include <chrono>
#include <optional>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "checkpoint/load.h"

#include "core/heartbeat.h"
#include "core/log.h"
#include "data/gpt_data.h"
#include "data/sample_source.h"
#include "parallel/pipeline/simulate.h"
#include "parallel/pipeline/zero_bubble.h"
#include "plan/hardware.h"
#include "plan/cost_model.h"
#include "plan/plan_check.h"
#include "train/commands/commands.h"
#include "train/evaluator.h"
#include "train/microbatch.h"
#include "config/memory_plan.h"
#include "train/mpi_session.h"
#include "train/run_files.h"
#include "train/runtime.h"
#include "train/task_evaluator.h"
#include "train/trainer.h"

namespace tripod {

namespace {

struct TrainOptions {
  std::string config;
  std::vector<std::string> sets;
  bool verbose = false;
  bool dry_run = false;
  std::optional<int> profile_steps;  // --profile-steps N: train.profile_steps = N
};

// Rank 0 tells the launcher (TRIPOD_LAUNCH_STATUS, see launch/restarts.sh) where the run lives
// and how far it got.
void launch_status(const DebugOptions& debug, const Config& cfg, const std::string& state, int64_t step) {
  if (debug.launch_status.empty()) return;
  write_launch_status(debug.launch_status, {.output_dir = cfg.train.output_dir, .checkpoint_dir = cfg.checkpoint.dir,
                                            .state = state, .step = step, .steps = cfg.train.steps});
}

// After a restart (launch/restarts.sh): its line in output_dir/restarts.jsonl. The work kept ends
// at the loaded checkpoint's commit, or at the failed attempt's start when it saved none.
void log_restart(const DebugOptions& debug, const Config& cfg, int64_t resumed_from) {
  const RestartInfo& r = debug.restart;
  if (r.attempt <= 0 || cfg.train.output_dir.empty()) return;
  namespace fs = std::filesystem;
  double kept_until = r.previous_start;
  std::string checkpoint;
  if (!cfg.checkpoint.load.empty()) {
    try {
      checkpoint = resolve_checkpoint(cfg.checkpoint.load, cfg.checkpoint.dir);
      struct stat st {};
      if (::stat((fs::path(checkpoint) / "metadata.json").c_str(), &st) == 0)
        kept_until = std::max(kept_until, static_cast<double>(st.st_mtim.tv_sec) + 1e-9 * st.st_mtim.tv_nsec);
    } catch (const std::exception&) {
    }
  }
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const RestartRecord rec{.attempt = r.attempt,
                          .resumed_from_step = resumed_from,
                          .exit_status = r.exit_status,
                          .cause = r.cause,
                          .checkpoint = checkpoint,
                          .failed_at = r.failed_at,
                          .resumed_at = now,
                          .downtime_s = r.failed_at > 0 ? now - r.failed_at : 0.0,
                          .time_lost_s = kept_until > 0 ? now - kept_until : 0.0};
  append_restart(cfg.train.output_dir, rec);
  spdlog::info("restart {} after {} (exit status {}): resumed from step {}, {:.1f} s lost", r.attempt, r.cause,
               r.exit_status, resumed_from, rec.time_lost_s);
}

// --dry-run: the schedule's simulated bubble and every rank's memory plan, before any allocation.
// schedule = "auto" is built for the cost model's per-stage F, I and W times on the hardware the
// stages are balanced with (training profiles its own machine at start-up and may choose another).
void print_dry_run(const Config& cfg, const std::string& split) {
  const ParallelConfig& p = cfg.parallel;
  StageCosts costs;  // empty: unit costs
  std::string note;
  if (p.schedule == ScheduleKind::Auto && p.schedule_file.empty()) {
    const Hardware hw = balance_hardware(cfg);
    std::vector<double> f, i, w;
    for (const ChunkTimes& c : stage_times(cfg, hw)) {
      f.push_back(c.forward);
      i.push_back(c.input());
      w.push_back(c.weight);
    }
    costs = stage_costs_fiw(f, i, w, p.pp * p.vp);
  }
  AutoSchedule a;
  const Schedule s = make_schedule(cfg, costs, &a);
  if (!costs.forward.empty())
    note = fmt::format(" ({} for the cost model's times on {}; training profiles its machine at start-up)", a.chosen,
                       balance_hardware(cfg).name);
  const PipePlan plan = plan_pipeline(s);
  const Simulation sim = costs.forward.empty() ? simulate(s, PipeCosts{}) : simulate(s, plan, PipeCosts{}, costs);
  fmt::print("grid {}, vp {}, {} schedule{} over {} micro-batches per step: simulated bubble {:.1f}%\n{}\n{}",
             p.grid().str(), p.vp, enum_name(s.kind), note, s.microbatches, 100 * sim.bubble, split,
             memory_table(cfg, plan_memory(cfg, s)));
}

// The TRIPOD_* switches, read once before MPI starts (the heartbeat needs the launch status);
// invalid ones are reported once MPI runs, by rank 0 (`bad`).
struct EnvOptions {
  DebugOptions debug;
  std::optional<InputError> bad;
};

// Training between MPI_Init and MPI_Finalize; `linger_ms` gets the exit test hook's value.
int train_under_mpi(const TrainOptions& o, const EnvOptions& env, double timeout_s, int& linger_ms) {
  MpiSession mpi(timeout_s);
  init_logging(mpi.rank(), mpi.size(), o.verbose);
  Config cfg;
  Runtime rt;
  std::vector<Task> tasks;
  try {
    if (env.bad) throw *env.bad;
    cfg = load_config(o.config, o.sets);
    if (o.dry_run) {
      // The plan for the grid the config asks for (dp = 1 when not given), before any allocation.
      if (cfg.parallel.dp == 0) cfg.parallel.dp = 1;
      validate_layout(cfg, cfg.parallel.tp * cfg.parallel.pp * cfg.parallel.cp * cfg.parallel.dp);
      const std::string split = resolve_layer_split(cfg);
      if (mpi.rank() == 0) print_dry_run(cfg, split);
      return 0;
    }
    validate_layout(cfg, mpi.size());
    const std::string split = resolve_layer_split(cfg);
    if (cfg.parallel.pp > 1) spdlog::info("{}", split);
    resolve_eod_token(cfg);  // packed documents (data.reset_*, eod_mask_loss) cut at it
    // Downstream tasks are read and tokenized now: a bad task file stops the run before step 1.
    tasks = load_tasks(cfg, cfg.eval.tasks, [](size_t i) { return fmt::format("eval.tasks[{}].path", i); });
    if (!tasks.empty() && cfg.train.eval_interval == 0)
      spdlog::warn("[eval] tasks are set but train.eval_interval = 0: they do not run during training (tripod eval "
                   "--task runs them from a checkpoint)");
    rt = make_runtime(cfg, env.debug, /*flight_recorder=*/true);
  } catch (const InputError& e) {
    rethrow_agreed(e);
  }
  ParallelContext& par = rt.par;
  linger_ms = rt.debug.exit_linger_ms;
  if (mpi.rank() == 0) launch_status(rt.debug, cfg, "starting", 0);

  std::unique_ptr<SampleSource> data = make_split_source(
      cfg, Split::Train, std::max<int64_t>(1, cfg.train.steps * cfg.train.global_batch_size), par.world.get());

  // The validation split, read by the periodic evaluation (train.eval_interval).
  std::unique_ptr<SampleSource> valid;
  if (cfg.train.eval_interval > 0)
    valid = make_split_source(cfg, Split::Valid, cfg.train.eval_steps * cfg.train.global_batch_size, par.world.get());

  Trainer trainer(cfg, *rt.ops, par, data.get(), valid.get(), rt.debug);
  trainer.set_tasks(std::move(tasks));
  // train.profile_steps: the measured breakdown beside the cost model's, on the hardware the
  // stages are balanced with, into output_dir/plan_check.json (rank 0 holds every rank's).
  // Rank 0 alone runs it, while the others train on: a failure is a warning, never an exit.
  trainer.on_profile([&trainer](const std::vector<int64_t>& steps, const std::vector<StepBreakdown>& ranks) {
    const Config& c = trainer.config();
    try {
      const PlanCheck check =
          make_plan_check(c, trainer.schedule(), balance_hardware(c), c.parallel.hardware, steps, ranks);
      write_plan_check(c.train.output_dir, check);
      spdlog::info("plan check of steps {}-{}: step predicted {:.4g} s, measured {:.4g} s ({:+.1f}%) on {}; "
                   "`tripod plan --check {}` compares every family",
                   steps.front(), steps.back(), check.predicted.step, check.measured.step,
                   100 * (check.predicted.step / check.measured.step - 1), check.hardware, c.train.output_dir);
    } catch (const std::exception& e) {
      spdlog::warn("train.profile_steps: no plan check written to {}: {}", c.train.output_dir, e.what());
    }
  });
  if (mpi.rank() == 0) {
    launch_status(rt.debug, cfg, "running", trainer.completed_steps());
    log_restart(rt.debug, cfg, trainer.completed_steps());
  }
  trainer.run();
  if (mpi.rank() == 0) {
    const int64_t last = cfg.train.exit_interval > 0 ? std::min(cfg.train.exit_interval, cfg.train.steps) : cfg.train.steps;
    launch_status(rt.debug, cfg, trainer.completed_steps() < last ? "stopped" : "finished",
                        trainer.completed_steps());
  }
  spdlog::info("done: {} steps; metrics in {}/metrics.jsonl", trainer.completed_steps(), cfg.train.output_dir);
  return 0;
}

int run_train(TrainOptions o) {
  if (o.profile_steps) o.sets.push_back(fmt::format("train.profile_steps={}", *o.profile_steps));
  // parallel.timeout_s bounds MPI's start-up too; a config that does not load is reported after
  // MPI_Init, once.
  double timeout_s = ParallelConfig{}.timeout_s;
  try {
    timeout_s = load_config(o.config, o.sets).parallel.timeout_s;
  } catch (const std::exception&) {
  }
  EnvOptions env;
  try {
    env.debug = read_debug_options();
  } catch (const InputError& e) {
    env.bad = e;
  }
  // Beats for the launcher's watchdog (launch/restarts.sh) from before MPI starts until the exit.
  const Heartbeat heartbeat(o.dry_run ? "" : env.debug.launch_status, timeout_s);
  int linger_ms = 0;
  const int status = train_under_mpi(o, env, timeout_s, linger_ms);
  std::this_thread::sleep_for(std::chrono::milliseconds(linger_ms));
  return status;
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
  sub->add_option("--profile-steps", opts->profile_steps,
                  "Time N steps (after the first) by op family, communication and idle beside the planner's "
                  "prediction, into output_dir/plan_check.json (train.profile_steps; tripod plan --check reads it)");
  return [opts] { return run_train(*opts); };
}

}  // namespace tripod
