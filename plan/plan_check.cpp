// RUN_DIR/plan_check.json: a run's measured step breakdown beside the cost model's prediction.
#include "plan/plan_check.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "core/error.h"
#include "parallel/grid.h"
#include "parallel/pipeline/plan.h"
#include "plan/cost_model.h"

namespace tripod {

namespace {

nlohmann::json breakdown_json(const StepBreakdown& b) {
  nlohmann::json j = nlohmann::json::object();
  for (int i = 0; i < StepBreakdown::kParts; ++i) j[std::string(StepBreakdown::part_name(i))] = b.part(i);
  j["step"] = b.step;
  return j;
}

double number_at(const nlohmann::json& j, const std::string& key, const std::string& where) {
  TRIPOD_INPUT_CHECK(j.is_object() && j.contains(key) && j[key].is_number(), "{}: {} must be a number", where, key);
  const double v = j[key].get<double>();
  TRIPOD_INPUT_CHECK(std::isfinite(v) && v >= 0, "{}: {} = {} must be a finite number >= 0", where, key, v);
  return v;
}

StepBreakdown breakdown_of(const nlohmann::json& j, const std::string& where) {
  TRIPOD_INPUT_CHECK(j.is_object(), "{} must be an object of seconds per family", where);
  StepBreakdown b;
  for (int i = 0; i < StepBreakdown::kParts; ++i) b.part(i) = number_at(j, std::string(StepBreakdown::part_name(i)), where);
  b.step = number_at(j, "step", where);
  return b;
}

std::vector<StepBreakdown> mean_by_stage(const std::vector<StepBreakdown>& ranks, const RankGrid& grid) {
  std::vector<StepBreakdown> out(grid.pp());
  std::vector<int> count(grid.pp(), 0);
  for (int r = 0; r < static_cast<int>(ranks.size()); ++r) ++count[grid.coords(r).pp];
  for (int r = 0; r < static_cast<int>(ranks.size()); ++r) {
    StepBreakdown& s = out[grid.coords(r).pp];
    const double w = 1.0 / count[grid.coords(r).pp];
    for (int i = 0; i < StepBreakdown::kParts; ++i) s.part(i) += w * ranks[r].part(i);
    s.step += w * ranks[r].step;
  }
  return out;
}

// The ranks of a pipeline stage do the same work and meet in the same collectives, so each of
// them spends at least the transfers' time in communication; what a rank spent beyond the least
// of its stage's ranks was waiting for a slower one: idle, as the wait for the slowest at the
// grad norm is.
void count_waits_as_idle(std::vector<StepBreakdown>& ranks, const RankGrid& grid) {
  std::vector<double> least(grid.pp(), std::numeric_limits<double>::infinity());
  for (int r = 0; r < static_cast<int>(ranks.size()); ++r)
    least[grid.coords(r).pp] = std::min(least[grid.coords(r).pp], ranks[r].communication);
  for (int r = 0; r < static_cast<int>(ranks.size()); ++r) {
    const double wait = ranks[r].communication - least[grid.coords(r).pp];
    ranks[r].communication -= wait;
    ranks[r].pipeline_idle += wait;
  }
}

StepBreakdown mean(const std::vector<StepBreakdown>& v) {
  StepBreakdown m;
  for (const StepBreakdown& b : v) {
    for (int i = 0; i < StepBreakdown::kParts; ++i) m.part(i) += b.part(i) / v.size();
    m.step += b.step / v.size();
  }
  return m;
}

nlohmann::json compare(double predicted, double measured) {
  return {{"predicted", predicted},
          {"measured", measured},
          {"error", measured > 0 ? nlohmann::json(predicted / measured - 1) : nlohmann::json(nullptr)}};
}

}  // namespace

void predict_plan_check(PlanCheck& c, const Config& cfg, const Schedule& schedule, const Hardware& hw,
                        const std::string& hardware_file) {
  const StepPrediction p = predict_step(cfg, hw, schedule, plan_pipeline(schedule));
  c.hardware = hw.name;
  c.hardware_file = hardware_file;
  c.predicted = p.breakdown;
  c.predicted_stages = p.ranks;
}

PlanCheck make_plan_check(const Config& cfg, const Schedule& schedule, const Hardware& hw,
                          const std::string& hardware_file, std::vector<int64_t> steps,
                          std::vector<StepBreakdown> measured_ranks) {
  const ParallelConfig& p = cfg.parallel;
  const RankGrid grid(p.tp, p.dp, p.pp, p.cp);
  TRIPOD_CHECK(static_cast<int>(measured_ranks.size()) == grid.world_size(), "plan check of {} ranks for a grid of {}",
               measured_ranks.size(), grid.world_size());
  PlanCheck c;
  c.steps = std::move(steps);
  c.layout = {{"tp", p.tp},
              {"pp", p.pp},
              {"vp", p.vp},
              {"cp", p.cp},
              {"dp", p.dp},
              {"schedule", std::string(enum_name(schedule.kind))},
              {"placement", std::string(enum_name(schedule.placement))},
              {"micro_batch", cfg.train.micro_batch_size},
              {"microbatches", schedule.microbatches},
              {"recompute", std::string(enum_name(cfg.recompute.mode))},
              {"sequence_parallel", p.sequence_parallel},
              {"distributed_optimizer", p.distributed_optimizer}};
  c.measured_ranks = std::move(measured_ranks);
  count_waits_as_idle(c.measured_ranks, grid);
  c.measured = mean(c.measured_ranks);
  c.measured_stages = mean_by_stage(c.measured_ranks, grid);
  predict_plan_check(c, cfg, schedule, hw, hardware_file);
  return c;
}

nlohmann::json plan_check_json(const PlanCheck& c) {
  nlohmann::json j = {{"version", 1}, {"hardware", c.hardware}, {"hardware_file", c.hardware_file},
                      {"steps", c.steps}, {"layout", c.layout}};
  j["step"] = compare(c.predicted.step, c.measured.step);
  for (int i = 0; i < StepBreakdown::kParts; ++i)
    j[std::string(StepBreakdown::part_name(i))] = compare(c.predicted.part(i), c.measured.part(i));
  nlohmann::json stages = nlohmann::json::array();
  for (size_t q = 0; q < c.measured_stages.size(); ++q)
    stages.push_back({{"pp", q},
                      {"predicted", q < c.predicted_stages.size() ? breakdown_json(c.predicted_stages[q]) : nullptr},
                      {"measured", breakdown_json(c.measured_stages[q])}});
  j["pipeline_ranks"] = stages;
  const int tp = c.layout.value("tp", 1), dp = c.layout.value("dp", 1), pp = c.layout.value("pp", 1),
            cp = c.layout.value("cp", 1);
  const RankGrid grid(tp, dp, pp, cp);
  nlohmann::json ranks = nlohmann::json::array();
  for (size_t r = 0; r < c.measured_ranks.size(); ++r) {
    const Coords x = grid.coords(static_cast<int>(r));
    ranks.push_back({{"rank", r}, {"pp", x.pp}, {"dp", x.dp}, {"cp", x.cp}, {"tp", x.tp},
                     {"measured", breakdown_json(c.measured_ranks[r])}});
  }
  j["ranks"] = ranks;
  return j;
}

PlanCheck parse_plan_check(const nlohmann::json& j, const std::string& origin) {
  TRIPOD_INPUT_CHECK(j.is_object(), "{}: not a plan check (one JSON object expected)", origin);
  TRIPOD_INPUT_CHECK(j.contains("version") && j["version"] == 1, "{}: version must be 1 (a plan check of this tripod)",
                     origin);
  PlanCheck c;
  TRIPOD_INPUT_CHECK(j.contains("hardware") && j["hardware"].is_string(), "{}: hardware must be a string", origin);
  c.hardware = j["hardware"].get<std::string>();
  TRIPOD_INPUT_CHECK(j.contains("hardware_file") && j["hardware_file"].is_string(), "{}: hardware_file must be a string",
                     origin);
  c.hardware_file = j["hardware_file"].get<std::string>();
  TRIPOD_INPUT_CHECK(j.contains("steps") && j["steps"].is_array() && !j["steps"].empty(),
                     "{}: steps must be a non-empty list of step numbers", origin);
  for (const auto& s : j["steps"]) {
    TRIPOD_INPUT_CHECK(s.is_number_integer() && s.get<int64_t>() >= 1, "{}: steps must hold step numbers >= 1", origin);
    c.steps.push_back(s.get<int64_t>());
  }
  TRIPOD_INPUT_CHECK(j.contains("layout") && j["layout"].is_object(), "{}: layout must be an object", origin);
  c.layout = j["layout"];
  int world = 1;
  for (const char* k : {"tp", "pp", "dp", "cp"}) {
    TRIPOD_INPUT_CHECK(c.layout.contains(k) && c.layout[k].is_number_integer() && c.layout[k].get<int>() >= 1 &&
                           c.layout[k].get<int>() <= 1 << 20,
                       "{}: layout.{} must be an integer >= 1", origin, k);
    world *= c.layout[k].get<int>();
    TRIPOD_INPUT_CHECK(world <= 1 << 20, "{}: layout: more than 2^20 ranks", origin);
  }
  for (const char* k : {"step", "gemm", "attention", "elementwise", "communication", "pipeline_idle", "optimizer", "other"}) {
    TRIPOD_INPUT_CHECK(j.contains(k) && j[k].is_object(), "{}: {} must be an object {{predicted, measured}}", origin, k);
    const std::string where = fmt::format("{}: {}", origin, k);
    const double predicted = number_at(j[k], "predicted", where), measured = number_at(j[k], "measured", where);
    if (std::string(k) == "step") {
      c.predicted.step = predicted;
      c.measured.step = measured;
      continue;
    }
    for (int i = 0; i < StepBreakdown::kParts; ++i)
      if (StepBreakdown::part_name(i) == k) {
        c.predicted.part(i) = predicted;
        c.measured.part(i) = measured;
      }
  }
  TRIPOD_INPUT_CHECK(j.contains("pipeline_ranks") && j["pipeline_ranks"].is_array() &&
                         j["pipeline_ranks"].size() == static_cast<size_t>(c.layout["pp"].get<int>()),
                     "{}: pipeline_ranks must list the {} pipeline ranks", origin, c.layout["pp"].get<int>());
  for (size_t q = 0; q < j["pipeline_ranks"].size(); ++q) {
    const auto& e = j["pipeline_ranks"][q];
    const std::string where = fmt::format("{}: pipeline_ranks[{}]", origin, q);
    TRIPOD_INPUT_CHECK(e.is_object() && e.contains("measured") && e.contains("predicted"),
                       "{} must hold predicted and measured", where);
    c.measured_stages.push_back(breakdown_of(e["measured"], where + ".measured"));
    c.predicted_stages.push_back(breakdown_of(e["predicted"], where + ".predicted"));
  }
  TRIPOD_INPUT_CHECK(j.contains("ranks") && j["ranks"].is_array() && j["ranks"].size() == static_cast<size_t>(world),
                     "{}: ranks must list the {} ranks of the layout", origin, world);
  for (size_t r = 0; r < j["ranks"].size(); ++r) {
    const auto& e = j["ranks"][r];
    const std::string where = fmt::format("{}: ranks[{}]", origin, r);
    TRIPOD_INPUT_CHECK(e.is_object() && e.contains("measured"), "{} must hold measured", where);
    c.measured_ranks.push_back(breakdown_of(e["measured"], where + ".measured"));
  }
  return c;
}

PlanCheck read_plan_check(const std::string& run_dir) {
  const std::string path = (std::filesystem::path(run_dir) / kPlanCheckFile).string();
  std::ifstream in(path);
  TRIPOD_INPUT_CHECK(in, "{} does not exist: the run was not profiled (train it with --profile-steps N or "
                     "train.profile_steps = N, and let it run N + 1 steps)", path);
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::parse_error& e) {
    throw InputError(fmt::format("{}: not JSON (a syntax error at byte {})", path, e.byte));
  }
  return parse_plan_check(j, path);
}

void write_plan_check(const std::string& run_dir, const PlanCheck& check) {
  namespace fs = std::filesystem;
  const fs::path path = fs::path(run_dir) / kPlanCheckFile, tmp = path.string() + ".tmp";
  {
    std::ofstream f(tmp);
    f << plan_check_json(check).dump(1) << '\n';
    TRIPOD_CHECK(f.good(), "cannot write {}", tmp.string());
  }
  fs::rename(tmp, path);
}

std::string plan_check_table(const PlanCheck& c) {
  const nlohmann::json& l = c.layout;
  std::string steps = c.steps.size() == 1 ? fmt::format("step {}", c.steps.front())
                                          : fmt::format("steps {}-{}", c.steps.front(), c.steps.back());
  std::string out = fmt::format(
      "grid tp {} pp {} dp {} cp {} (vp {}), {} schedule over {} micro-batches of {}, recompute {}; {} profiled "
      "(each rank's median step, mean over {} rank{})\npredicted on {}{}\n\n",
      l.value("tp", 1), l.value("pp", 1), l.value("dp", 1), l.value("cp", 1), l.value("vp", 1),
      l.value("schedule", std::string("?")), l.value("microbatches", 0), l.value("micro_batch", 0),
      l.value("recompute", std::string("?")), steps, c.measured_ranks.size(), c.measured_ranks.size() == 1 ? "" : "s",
      c.hardware,
      c.hardware_file.empty() ? " (built-in figures)" : " (" + c.hardware_file + ")");
  out += fmt::format("{:<16} {:>13} {:>13} {:>9} {:>8}\n", "", "predicted", "measured", "error", "of step");
  const double step = c.measured.step;
  auto row = [&](std::string_view name, double p, double m) {
    std::string error = "-";
    if (step > 0 && m >= kSmallShare * step) error = fmt::format("{:+.1f}%", 100 * (p / m - 1));
    else if (step > 0) error = fmt::format("({:+.1f}%)", 100 * (p - m) / step);
    out += fmt::format("{:<16} {:>10.3f} ms {:>10.3f} ms {:>9} {:>7.1f}%\n", name, 1e3 * p, 1e3 * m, error,
                       step > 0 ? 100 * m / step : 0.0);
  };
  for (int i = 0; i < StepBreakdown::kParts; ++i) {
    std::string name(StepBreakdown::part_name(i));
    for (char& ch : name)
      if (ch == '_') ch = ' ';
    row(name, c.predicted.part(i), c.measured.part(i));
  }
  row("step", c.predicted.step, c.measured.step);
  out += fmt::format("\nerror: predicted / measured - 1; in parentheses for a family under {:.0f}% of the step: the "
                     "difference as a share of the step\n",
                     100 * kSmallShare);
  return out;
}

}  // namespace tripod
