// Enumerating layouts, keeping those that fit, ranking them by predicted step time.
#include "plan/planner.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <tuple>
#include <sstream>

#include "config/layout.h"
#include "core/error.h"

namespace tripod {

namespace {

std::vector<int> divisors(int n, int at_most) {
  std::vector<int> out;
  for (int d = 1; d <= std::min(n, at_most); ++d)
    if (n % d == 0) out.push_back(d);
  return out;
}

template <class T>
std::vector<T> pick(const std::optional<T>& fixed, std::vector<T> all) {
  if (fixed) return {*fixed};
  return all;
}

}  // namespace

LayoutFilter parse_layout_filter(const std::string& text) {
  LayoutFilter f;
  std::stringstream ss(text);
  std::string item;
  auto integer = [](const std::string& k, const std::string& v) {
    size_t used = 0;
    int x = 0;
    try {
      x = std::stoi(v, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    TRIPOD_INPUT_CHECK(used == v.size() && !v.empty() && x >= 1, "--layout {}={}: must be a positive integer", k, v);
    return x;
  };
  auto boolean = [](const std::string& k, const std::string& v) {
    TRIPOD_INPUT_CHECK(v == "true" || v == "false", "--layout {}={}: must be true or false", k, v);
    return v == "true";
  };
  while (std::getline(ss, item, ',')) {
    auto eq = item.find('=');
    TRIPOD_INPUT_CHECK(eq != std::string::npos, "--layout '{}': expected key=value (keys: tp, pp, vp, cp, ep, mbs, "
                       "recompute, sp, distopt, split)", item);
    std::string k = item.substr(0, eq), v = item.substr(eq + 1);
    if (k == "tp") f.tp = integer(k, v);
    else if (k == "cp") f.cp = integer(k, v);
    else if (k == "ep") f.ep = integer(k, v);
    else if (k == "pp") f.pp = integer(k, v);
    else if (k == "vp") f.vp = integer(k, v);
    else if (k == "mbs") f.micro_batch = integer(k, v);
    else if (k == "sp") f.sequence_parallel = boolean(k, v);
    else if (k == "distopt") f.distributed_optimizer = boolean(k, v);
    else if (k == "split") {
      TRIPOD_INPUT_CHECK(v == "auto" || v == "even", "--layout split={}: must be auto (balanced stages) or even", v);
      f.balanced = v == "auto";
    }
    else if (k == "recompute") {
      f.recompute = parse_enum<RecomputeMode>(v);
      TRIPOD_INPUT_CHECK(f.recompute, "--layout recompute={}: must be none, selective or full", v);
    } else {
      throw InputError(
          fmt::format("--layout: unknown knob '{}' (valid: tp, pp, vp, cp, ep, mbs, recompute, sp, distopt, split)", k));
    }
  }
  return f;
}

std::vector<ScheduleKind> schedule_candidates(int pp, int vp) {
  // The fixed schedules at 1F1B's activation memory: 1F1B or interleaved, and their zero-bubble
  // counterparts (ZB-H1 for one chunk per rank, ZB-V for two in a V).
  if (vp > 1) {
    std::vector<ScheduleKind> out = {ScheduleKind::Interleaved};
    if (vp == 2) out.push_back(ScheduleKind::Zbv);
    return out;
  }
  if (pp == 1) return {ScheduleKind::OneFOneB};
  return {ScheduleKind::OneFOneB, ScheduleKind::ZbH1};
}

namespace {

// Expert parallelism the search tries: 1 for a dense model; for a mixture of experts every ep
// dividing both the experts and dp x cp (the ranks it is taken from).
std::vector<int> expert_parallel_sizes(const ModelConfig& m, int dpcp) {
  std::vector<int> out = {1};
  if (!m.moe.enabled()) return out;
  for (int ep = 2; ep <= dpcp; ++ep)
    if (dpcp % ep == 0 && m.moe.experts % ep == 0) out.push_back(ep);
  return out;
}

}  // namespace

PlanResult plan_layouts(const Config& base, const Hardware& hw, int gpus, const LayoutFilter& fixed,
                        int max_micro_batch) {
  const int g = hw.gpus_per_node;
  TRIPOD_INPUT_CHECK(gpus >= 1, "--gpus {}: must be at least 1", gpus);
  TRIPOD_INPUT_CHECK(gpus <= g || gpus % g == 0,
                     "--gpus {} is not a multiple of the {} GPUs per node of {} (device.gpus_per_node): use whole "
                     "nodes, or at most one node",
                     gpus, g, hw.name);
  const int B = base.train.global_batch_size;
  TRIPOD_INPUT_CHECK(B >= 1, "the global batch is not set: give --global-batch or train.global_batch_size");
  const ModelConfig& m = base.model;

  PlanResult result;
  bool batch_divides = false;
  // Context parallelism only for long sequences: cp = 2, 4, ... while every rank keeps at least
  // kMinCpTokens tokens of a sequence (below that, attention is not what runs out of memory).
  constexpr int64_t kMinCpTokens = 2048;
  std::vector<int> cps = {1};
  for (int c = 2; c <= gpus && m.seq_len / c >= kMinCpTokens; c *= 2)
    if (m.seq_len % (2 * c) == 0) cps.push_back(c);
  std::map<std::tuple<ScheduleKind, int, int, int>, std::optional<std::pair<Schedule, PipePlan>>> schedules;
  for (int tp : pick(fixed.tp, divisors(std::min(gpus, g), g))) {
    if (m.n_heads % tp != 0 || gpus % tp != 0) continue;
    for (int cp : pick(fixed.cp, cps)) {
    if ((gpus / tp) % cp != 0) continue;
    for (int pp : pick(fixed.pp, divisors(gpus / (tp * cp), m.n_layers))) {
      if ((gpus / (tp * cp)) % pp != 0) continue;
      const int dp = gpus / (tp * pp * cp);
      if (B % dp != 0) continue;
      batch_divides = true;
      std::vector<int> vps = {1};
      for (int v = 2; pp > 1 && v * pp <= m.n_layers; ++v)
        if (m.n_layers % (v * pp) == 0) vps.push_back(v);
      for (int vp : pick(fixed.vp, vps))
       for (ScheduleKind kind : schedule_candidates(pp, vp))
        if (fixed.schedules.empty() || std::find(fixed.schedules.begin(), fixed.schedules.end(), kind) != fixed.schedules.end())
        for (int mbs : pick(fixed.micro_batch, divisors(B / dp, max_micro_batch)))
          for (RecomputeMode rc : pick(fixed.recompute, {RecomputeMode::None, RecomputeMode::Selective,
                                                         RecomputeMode::Full}))
            for (bool sp : pick(fixed.sequence_parallel, tp > 1 ? std::vector<bool>{false, true}
                                                                 : std::vector<bool>{false}))
              for (bool dop : pick(fixed.distributed_optimizer, dp * cp > 1 ? std::vector<bool>{false, true}
                                                                        : std::vector<bool>{false}))
               for (int ep : pick(fixed.ep, expert_parallel_sizes(m, dp * cp))) {
                Config cfg = base;
                cfg.train.device = hw.device;
                ParallelConfig& p = cfg.parallel;
                p.tp = tp;
                p.cp = cp;
                p.pp = pp;
                p.vp = vp;
                p.dp = dp;
                p.schedule = kind;
                p.schedule_file.clear();
                p.placement = default_placement(kind);
                p.layers_per_stage.clear();
                p.balance_layers = fixed.balanced;
                p.sequence_parallel = sp;
                p.distributed_optimizer = dop;
                p.ep = ep;
                cfg.train.micro_batch_size = mbs;
                cfg.recompute.mode = rc;
                cfg.recompute.num_layers = -1;
                PlannedLayout l{cfg, {}};
                try {
                  validate_layout(l.cfg, gpus);
                  balance_stages(l.cfg, hw);
                  // One schedule per pipeline shape, shared by the layouts that differ elsewhere.
                  const auto shape = std::make_tuple(kind, pp, vp, microbatches_per_rank(l.cfg));
                  auto it = schedules.find(shape);
                  if (it == schedules.end()) {
                    std::optional<std::pair<Schedule, PipePlan>> built;
                    try {
                      Schedule sched = make_schedule(l.cfg);
                      PipePlan plan = plan_pipeline(sched);
                      built.emplace(std::move(sched), std::move(plan));
                    } catch (const InputError&) {
                    }
                    it = schedules.emplace(shape, std::move(built)).first;
                  }
                  if (!it->second) continue;  // a schedule these sizes do not allow
                  l.pred = predict_step(l.cfg, hw, it->second->first, it->second->second);
                } catch (const InputError&) {
                  continue;  // a layout tripod refuses (uneven stages, schedule constraints)
                }
                ++result.valid;
                if (!result.smallest || l.pred.memory_bytes() < result.smallest->pred.memory_bytes())
                  result.smallest = l;
                if (static_cast<double>(l.pred.memory_bytes()) <= hw.memory_capacity)
                  result.layouts.push_back(std::move(l));
              }
    }
    }
  }
  TRIPOD_INPUT_CHECK(batch_divides,
                     "global batch {}: no layout on {} GPUs divides it (it must be a multiple of dp = GPUs / (tp * "
                     "pp) for some tp dividing model.n_heads = {} and pp; change --global-batch or --gpus)",
                     B, gpus, m.n_heads);
  TRIPOD_INPUT_CHECK(result.valid > 0,
                     "no layout of the model ({} layers, {} heads) on {} GPUs with global batch {} is valid for tripod "
                     "(check the knobs --layout fixes)",
                     m.n_layers, m.n_heads, gpus, B);
  std::stable_sort(result.layouts.begin(), result.layouts.end(), [](const PlannedLayout& a, const PlannedLayout& b) {
    if (a.pred.step_time_s != b.pred.step_time_s) return a.pred.step_time_s < b.pred.step_time_s;
    return a.pred.memory_bytes() < b.pred.memory_bytes();
  });
  return result;
}

std::string layout_toml(const Config& cfg) {
  const ParallelConfig& p = cfg.parallel;
  return fmt::format(
      "[parallel]\ntp = {}\npp = {}\nvp = {}\ndp = {}\n{}{}schedule = \"{}\"\nplacement = \"{}\"\n{}sequence_parallel = {}\n"
      "distributed_optimizer = {}\n\n[train]\nmicro_batch_size = {}\nglobal_batch_size = {}\n\n[recompute]\n"
      "mode = \"{}\"\n",
      p.tp, p.pp, p.vp, p.dp, p.cp > 1 ? fmt::format("cp = {}\n", p.cp) : std::string(),
      p.ep > 1 ? fmt::format("ep = {}\nmoe_dispatcher = \"{}\"\n", p.ep, enum_name(p.moe_dispatcher)) : std::string(),
      enum_name(p.schedule),
      enum_name(p.placement),
      p.layers_per_stage.empty() ? std::string()
                                 : fmt::format("layers_per_stage = [{}]  # what \"auto\" picks here\n",
                                               fmt::join(p.layers_per_stage, ", ")),
      p.sequence_parallel, p.distributed_optimizer, cfg.train.micro_batch_size,
      cfg.train.global_batch_size, enum_name(cfg.recompute.mode));
}

}  // namespace tripod
