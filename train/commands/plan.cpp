// `tripod plan --config MODEL.toml --hardware H.toml --gpus N [--global-batch B] [--top K]
// [--layout tp=8,...] [--json]`: the fastest layouts that fit, predicted by the cost model.
// `tripod plan --check RUN_DIR [--hardware H.toml] [--json]`: a profiled run's measured step
// beside the prediction, per family.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <nlohmann/json.hpp>

#include <filesystem>

#include "core/error.h"
#include "core/log.h"
#include "config/layout.h"
#include "parallel/pipeline/schedules.h"
#include "plan/plan_check.h"
#include "plan/planner.h"
#include "train/commands/commands.h"

namespace tripod {

namespace {

struct PlanOptions {
  std::string config, hardware, layout, check;
  int gpus = 0, global_batch = 0, top = 10;
  bool json = false;
};

double gib(double b) { return b / (1 << 30); }

// --check RUN_DIR: the run's plan_check.json (train.profile_steps), predicted again on --hardware
// when given: the run's resolved config.toml and the schedule it ran (schedule.csv).
int run_check(const PlanOptions& o) {
  namespace fs = std::filesystem;
  PlanCheck check = read_plan_check(o.check);
  if (!o.hardware.empty()) {
    Config cfg = load_config((fs::path(o.check) / "config.toml").string(), {},
                             ConfigUse{.training = false, .data = false});
    const ParallelConfig& p = cfg.parallel;
    validate_layout(cfg, p.tp * p.pp * p.cp * std::max(1, p.dp));
    const Hardware hw = load_hardware(o.hardware);
    balance_stages(cfg, hw);  // (the run's config.toml holds its resolved split)
    const std::string csv = (fs::path(o.check) / "schedule.csv").string();
    const Schedule schedule = load_schedule_csv(csv);
    check_schedule_shape(schedule, p.pp, p.vp, microbatches_per_rank(cfg), csv);
    predict_plan_check(check, cfg, schedule, hw, o.hardware);
  }
  if (o.json) fmt::print("{}\n", plan_check_json(check).dump());
  else fmt::print("plan check of {}: ", o.check), fmt::print("{}", plan_check_table(check));
  return 0;
}

int run_plan(const PlanOptions& o) {
  init_logging(0, 1);  // (stderr: a hardware file's warnings)
  if (!o.check.empty()) {
    TRIPOD_INPUT_CHECK(o.config.empty() && o.gpus == 0 && o.layout.empty() && o.global_batch == 0,
                       "tripod plan --check RUN_DIR reads the run's own config and layout: give only --hardware and "
                       "--json with it");
    return run_check(o);
  }
  TRIPOD_INPUT_CHECK(!o.config.empty() && !o.hardware.empty() && o.gpus > 0,
                     "tripod plan needs --config F.toml, --hardware H.toml and --gpus N (or --check RUN_DIR)");
  Config base = load_config(o.config, {}, ConfigUse{.training = false, .data = false});  // trains and reads nothing
  Hardware hw = load_hardware(o.hardware);
  if (o.global_batch > 0) base.train.global_batch_size = o.global_batch;
  LayoutFilter fixed = o.layout.empty() ? LayoutFilter{} : parse_layout_filter(o.layout);
  PlanResult r = plan_layouts(base, hw, o.gpus, fixed);
  if (r.layouts.empty()) {
    const PlannedLayout& s = *r.smallest;
    throw InputError(fmt::format(
        "{}: the model fits no layout on {} x {} ({:.1f} GiB each): the smallest needs {:.1f} GiB per GPU (tp={} pp={} "
        "cp={} dp={} micro-batch {} recompute {}{}); add GPUs or use a larger device",
        o.config, o.gpus, hw.name, gib(hw.memory_capacity), gib(s.pred.memory_bytes()), s.cfg.parallel.tp,
        s.cfg.parallel.pp, s.cfg.parallel.cp, s.cfg.parallel.dp, s.cfg.train.micro_batch_size, enum_name(s.cfg.recompute.mode),
        s.cfg.parallel.distributed_optimizer ? ", distributed optimizer" : ""));
  }
  const size_t n = std::min<size_t>(r.layouts.size(), static_cast<size_t>(std::max(1, o.top)));
  if (o.json) {
    nlohmann::json out{{"hardware", hw.name}, {"gpus", o.gpus}, {"global_batch", base.train.global_batch_size},
                       {"valid_layouts", r.valid}, {"fitting_layouts", r.layouts.size()}};
    nlohmann::json list = nlohmann::json::array();
    for (size_t i = 0; i < n; ++i) {
      const Config& c = r.layouts[i].cfg;
      const StepPrediction& p = r.layouts[i].pred;
      list.push_back({{"tp", c.parallel.tp}, {"pp", c.parallel.pp}, {"vp", c.parallel.vp}, {"cp", c.parallel.cp},
                      {"dp", c.parallel.dp}, {"ep", c.parallel.ep}, {"schedule", enum_name(c.parallel.schedule)},
                      {"placement", enum_name(c.parallel.placement)},
                      {"micro_batch", c.train.micro_batch_size}, {"recompute", enum_name(c.recompute.mode)},
                      {"sequence_parallel", c.parallel.sequence_parallel},
                      {"distributed_optimizer", c.parallel.distributed_optimizer}, {"step_time_s", p.step_time_s},
                      {"tokens_per_s", p.tokens_per_s}, {"model_tflops_per_gpu", p.model_tflops_per_gpu},
                      {"mfu", p.mfu}, {"memory_bytes_per_gpu", p.memory_bytes()},
                      {"memory", {{"params", p.memory.params}, {"grads", p.memory.grads},
                                  {"optimizer", p.memory.optimizer}, {"activations", p.memory.activations},
                                  {"workspace", p.workspace_bytes}, {"comm", p.comm_bytes},
                                  {"reserved", p.reserved_bytes}}},
                      {"bubble", p.bubble}, {"exposed_comm", p.exposed_comm},
                      {"layers_per_stage", stage_layers(c)}});
      // The step by family (mean over the ranks), as `plan --check` compares it with a run.
      nlohmann::json families;
      for (int k = 0; k < StepBreakdown::kParts; ++k)
        families[std::string(StepBreakdown::part_name(k))] = p.breakdown.part(k);
      list.back()["breakdown"] = families;
    }
    out["layouts"] = list;
    fmt::print("{}\n", out.dump());
    return 0;
  }
  fmt::print("{} layouts valid, {} fit {} x {} ({:.0f} GiB); global batch {} x {} tokens; fastest first:\n", r.valid,
             r.layouts.size(), o.gpus, hw.name, gib(hw.memory_capacity), base.train.global_batch_size,
             base.model.seq_len);
  // A mixture of experts' table has an ep column after dp; a dense model's is as it always was.
  const bool moe = base.model.moe.enabled();
  auto ep_cell = [&](const std::string& cell) { return moe ? fmt::format(" {:>3}", cell) : std::string(); };
  fmt::print("{:>3} {:>3} {:>3} {:>3} {:>4}{} {:>11} {:>4} {:>9} {:>3} {:>4} {:>9} {:>10} {:>8} {:>6} {:>7} {:>7} {:>7} "
             "{:>7} {:>7} {:>7} {:>7}  {}\n",
             "tp", "pp", "vp", "cp", "dp", ep_cell("ep"), "schedule", "mbs", "recompute", "sp", "dopt", "step(s)", "tokens/s", "TFLOP/s", "MFU",
             "params", "grads", "optim", "acts", "other", "total", "bubble", "layers per stage");
  for (size_t i = 0; i < n; ++i) {
    const Config& c = r.layouts[i].cfg;
    const StepPrediction& p = r.layouts[i].pred;
    fmt::print("{:>3} {:>3} {:>3} {:>3} {:>4}{} {:>11} {:>4} {:>9} {:>3} {:>4} {:>9.4g} {:>10.4g} {:>8.4g} {:>5.1f}% {:>7.2f} "
               "{:>7.2f} {:>7.2f} {:>7.2f} {:>7.2f} {:>7.2f} {:>6.1f}%  {}  comm {:.1f}%\n",
               c.parallel.tp, c.parallel.pp, c.parallel.vp, c.parallel.cp, c.parallel.dp,
               ep_cell(std::to_string(c.parallel.ep)), enum_name(c.parallel.schedule),
               c.train.micro_batch_size,
               enum_name(c.recompute.mode), c.parallel.sequence_parallel ? "y" : "n",
               c.parallel.distributed_optimizer ? "y" : "n", p.step_time_s, p.tokens_per_s, p.model_tflops_per_gpu,
               100 * p.mfu, gib(p.memory.params), gib(p.memory.grads), gib(p.memory.optimizer),
               gib(p.memory.activations), gib(p.workspace_bytes + p.comm_bytes + p.reserved_bytes),
               gib(p.memory_bytes()), 100 * p.bubble, split_str(stage_layers(c)), 100 * p.exposed_comm);
  }
  fmt::print("memory in GiB per GPU (other: backward workspace, DP buckets, reserved); comm: exposed communication "
             "share of the step\n\n# the fastest layout\n{}",
             layout_toml(r.layouts.front().cfg));
  return 0;
}

}  // namespace

CommandFn add_plan_command(CLI::App& app) {
  auto o = std::make_shared<PlanOptions>();
  CLI::App* sub = app.add_subcommand("plan", "Rank the (tp, pp, vp, cp, dp, ep, micro-batch, recompute) layouts of a model on "
                                             "a cluster by predicted step time");
  sub->add_option("--config", o->config, "Model config (TOML): [model] and train.global_batch_size");
  sub->add_option("--hardware", o->hardware, "Hardware file (configs/hardware/*.toml or tripod calibrate's)");
  sub->add_option("--gpus", o->gpus, "Number of GPUs (or CPU ranks)");
  sub->add_option("--check", o->check, "A run directory trained with --profile-steps: its measured step by family "
                                        "beside the prediction (on --hardware when given, else the run's own)");
  sub->add_option("--global-batch", o->global_batch, "Sequences per step (default: the config's)");
  sub->add_option("--top", o->top, "Layouts to print (default 10)");
  sub->add_option("--layout", o->layout, "Fix knobs: tp=8,pp=4,vp=2,mbs=1,recompute=full,sp=true,distopt=true");
  sub->add_flag("--json", o->json, "One JSON object on stdout");
  return [o] { return run_plan(*o); };
}

}  // namespace tripod
