// The run directory's records and their JSON, both ways.
#include "train/run_files.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>

#include "core/error.h"

namespace tripod {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr double kNaN = StepRecord::kNaN;

// A number field: absent or null is NaN (JSON has no NaN).
double number_field(const json& j, const char* key, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return kNaN;
  TRIPOD_INPUT_CHECK(it->is_number(), "{}: \"{}\" must be a number, got {}", where, key, it->dump());
  return it->get<double>();
}

// A count field: absent or null is `absent`.
int64_t count_field(const json& j, const char* key, const std::string& where, int64_t absent) {
  const double v = number_field(j, key, where);
  return std::isfinite(v) ? static_cast<int64_t>(v) : absent;
}

std::string string_field(const json& j, const char* key, const std::string& where, const char* absent) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return absent;
  TRIPOD_INPUT_CHECK(it->is_string(), "{}: \"{}\" must be a string, got {}", where, key, it->dump());
  return it->get<std::string>();
}

int64_t step_field(const json& j, const std::string& where) {
  auto it = j.find("step");
  TRIPOD_INPUT_CHECK(it != j.end() && it->is_number_integer() && it->get<int64_t>() >= 0,
                     "{}: \"step\" must be a non-negative integer, got {}", where,
                     it == j.end() ? std::string("nothing") : it->dump());
  return it->get<int64_t>();
}

// JSON has no NaN: a non-finite number is written as null.
json number(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

// mem_peak_bytes: {"params": B, ...} (one rank), {"params": [B per rank], ...}, or a list of
// per-rank objects.
std::vector<std::map<std::string, int64_t>> memory_field(const json& j, const std::string& where) {
  std::vector<std::map<std::string, int64_t>> ranks;
  auto it = j.find("mem_peak_bytes");
  if (it == j.end() || it->is_null()) return ranks;
  auto bytes = [&](const json& v, const std::string& cat) {
    TRIPOD_INPUT_CHECK(v.is_number() && v.get<double>() >= 0,
                       "{}: mem_peak_bytes.{} must be a byte count (or a list of them), got {}", where, cat, v.dump());
    return static_cast<int64_t>(v.get<double>());
  };
  auto one_rank = [&](const json& obj) {
    TRIPOD_INPUT_CHECK(obj.is_object(), "{}: mem_peak_bytes must be an object of byte counts per category, got {}",
                       where, obj.dump());
    std::map<std::string, int64_t> m;
    for (const auto& [cat, v] : obj.items()) m[cat] = bytes(v, cat);
    return m;
  };
  if (it->is_array()) {
    for (const auto& r : *it) ranks.push_back(one_rank(r));
    return ranks;
  }
  TRIPOD_INPUT_CHECK(it->is_object(), "{}: mem_peak_bytes must be an object of byte counts per category, got {}",
                     where, it->dump());
  size_t n = 1;
  for (const auto& [cat, v] : it->items())
    if (v.is_array()) n = std::max(n, v.size());
  ranks.resize(n);
  for (const auto& [cat, v] : it->items()) {
    if (v.is_array()) {
      TRIPOD_INPUT_CHECK(v.size() == n, "{}: mem_peak_bytes.{} has {} ranks, other categories {}", where, cat,
                         v.size(), n);
      for (size_t r = 0; r < n; ++r) ranks[r][cat] = bytes(v[r], cat);
    } else {
      TRIPOD_INPUT_CHECK(n == 1, "{}: mem_peak_bytes.{} is one number where other categories list {} ranks", where,
                         cat, n);
      ranks[0][cat] = bytes(v, cat);
    }
  }
  return ranks;
}

// "moe": per layer, in layer order, the expert load table over the step and its losses.
std::vector<MoeLayerRecord> moe_field(const json& j, const std::string& where) {
  std::vector<MoeLayerRecord> out;
  auto it = j.find("moe");
  if (it == j.end() || it->is_null()) return out;
  auto list = [&](const char* key) -> const json& {
    auto l = it->find(key);
    TRIPOD_INPUT_CHECK(it->is_object() && l != it->end() && l->is_array(), "{}: moe.{} must be a list", where, key);
    return *l;
  };
  const json& layers = list("layers");
  const json *tokens = &list("tokens_per_expert"), *dropped = &list("dropped_tokens"),
             *aux = &list("load_balancing_loss"), *z = &list("z_loss");
  for (const json* l : {tokens, dropped, aux, z})
    TRIPOD_INPUT_CHECK(l->size() == layers.size(), "{}: the moe lists must have one entry per layer ({})", where,
                       layers.size());
  auto num = [&](const json& v, const char* key) {
    TRIPOD_INPUT_CHECK(v.is_number() || v.is_null(), "{}: moe.{} must hold numbers, got {}", where, key, v.dump());
    return v.is_null() ? kNaN : v.get<double>();
  };
  for (size_t k = 0; k < layers.size(); ++k) {
    TRIPOD_INPUT_CHECK(layers[k].is_number_integer(), "{}: moe.layers must hold layer numbers", where);
    MoeLayerRecord l{.layer = layers[k].get<int>(), .dropped = num((*dropped)[k], "dropped_tokens"),
                     .load_balancing_loss = num((*aux)[k], "load_balancing_loss"), .z_loss = num((*z)[k], "z_loss")};
    TRIPOD_INPUT_CHECK((*tokens)[k].is_array(), "{}: moe.tokens_per_expert must hold a list per layer", where);
    for (const json& c : (*tokens)[k]) l.tokens_per_expert.push_back(num(c, "tokens_per_expert"));
    out.push_back(std::move(l));
  }
  return out;
}

// The lines of a JSONL file, each parsed, with its "PATH:LINE" (a last line without its newline
// that does not parse is one being written: `unfinished` is set and it is left out).
void for_each_record(const std::string& path, bool* unfinished,
                     const std::function<void(const json&, const std::string&)>& fn) {
  std::ifstream in(path, std::ios::binary);
  TRIPOD_INPUT_CHECK(in.good(), "{}: cannot read ({})", path, std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  size_t pos = 0;
  for (int64_t line_no = 1; pos < text.size(); ++line_no) {
    const size_t end = text.find('\n', pos);
    const bool last_unfinished = end == std::string::npos;
    const std::string line = text.substr(pos, last_unfinished ? std::string::npos : end - pos);
    pos = last_unfinished ? text.size() : end + 1;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = fmt::format("{}:{}", path, line_no);
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded() && last_unfinished) {
      if (unfinished) *unfinished = true;
      break;
    }
    TRIPOD_INPUT_CHECK(!j.is_discarded(), "{}: not a JSON line", where);
    TRIPOD_INPUT_CHECK(j.is_object(), "{}: expected a JSON object, got {}", where,
                       line.size() > 60 ? line.substr(0, 60) + "..." : line);
    fn(j, where);
  }
}

}  // namespace

double MoeLayerRecord::max_over_mean() const {
  double sum = 0, top = 0;
  for (double c : tokens_per_expert) sum += c, top = std::max(top, c);
  return sum > 0 ? top * static_cast<double>(tokens_per_expert.size()) / sum : 0.0;
}

// ---- metrics.jsonl ---------------------------------------------------------------------------

json to_json(const StepRecord& r) {
  json j = {{"step", r.step},
            {"loss", number(r.loss)},
            {"lr", number(r.lr)},
            {"grad_norm", number(r.grad_norm)},
            {"step_time_s", number(r.step_time_s)},
            {"tokens_per_s", number(r.tokens_per_s)},
            {"mfu", number(r.mfu)},
            {"tflops", number(r.tflops)},
            {"batch_size", r.batch_size},
            {"consumed_samples", r.consumed_samples},
            {"skipped", r.skipped},
            {"skipped_total", r.skipped_total}};
  if (r.memory.size() == 1) j["mem_peak_bytes"] = r.memory[0];
  if (r.memory.size() > 1) j["mem_peak_bytes"] = r.memory;
  if (!r.moe.empty()) {
    json layers = json::array(), tokens = json::array(), dropped = json::array(), aux = json::array(),
         z = json::array(), ratio = json::array();
    for (const MoeLayerRecord& l : r.moe) {
      layers.push_back(l.layer);
      json row = json::array();
      for (double c : l.tokens_per_expert) row.push_back(static_cast<int64_t>(std::llround(c)));
      tokens.push_back(std::move(row));
      dropped.push_back(static_cast<int64_t>(std::llround(l.dropped)));
      aux.push_back(number(l.load_balancing_loss));
      z.push_back(number(l.z_loss));
      ratio.push_back(l.max_over_mean());
    }
    j["moe"] = {{"layers", layers}, {"tokens_per_expert", tokens}, {"dropped_tokens", dropped},
                {"load_balancing_loss", aux}, {"z_loss", z}, {"max_over_mean_load", ratio}};
  }
  if (r.stragglers) {
    const StragglerSummary& s = *r.stragglers;
    j["rank_compute_s"] = {{"median", s.median_compute_s}, {"max", s.max_compute_s}, {"max_rank", s.max_rank}};
    j["rank_step_s_median"] = s.median_step_s;
    json list = json::array();
    for (const Straggler& g : s.stragglers)
      list.push_back({{"rank", g.rank}, {"compute_s", g.compute_s}, {"ratio", g.ratio}, {"intervals", g.intervals}});
    j["stragglers"] = std::move(list);
  }
  return j;
}

StepRecord step_record(const json& j, const std::string& where) {
  StepRecord r;
  r.step = step_field(j, where);
  r.loss = number_field(j, "loss", where);
  r.lr = number_field(j, "lr", where);
  r.grad_norm = number_field(j, "grad_norm", where);
  r.step_time_s = number_field(j, "step_time_s", where);
  r.tokens_per_s = number_field(j, "tokens_per_s", where);
  r.mfu = number_field(j, "mfu", where);
  r.tflops = number_field(j, "tflops", where);
  r.batch_size = count_field(j, "batch_size", where, 0);
  r.consumed_samples = count_field(j, "consumed_samples", where, -1);
  auto sk = j.find("skipped");
  TRIPOD_INPUT_CHECK(sk == j.end() || sk->is_boolean(), "{}: \"skipped\" must be true or false, got {}", where,
                     sk->dump());
  r.skipped = (sk != j.end() && sk->get<bool>()) || !std::isfinite(r.loss);
  r.skipped_total = count_field(j, "skipped_total", where, 0);
  r.memory = memory_field(j, where);
  r.moe = moe_field(j, where);
  auto rc = j.find("rank_compute_s");
  auto sg = j.find("stragglers");
  if (rc != j.end() || sg != j.end()) {
    StragglerSummary s;
    s.step = r.step;
    s.median_compute_s = s.max_compute_s = s.median_step_s = kNaN;
    s.max_rank = -1;
    if (rc != j.end()) {
      TRIPOD_INPUT_CHECK(rc->is_object(), "{}: \"rank_compute_s\" must be an object {{median, max, max_rank}}, got {}",
                         where, rc->dump());
      s.median_compute_s = number_field(*rc, "median", where);
      s.max_compute_s = number_field(*rc, "max", where);
      s.max_rank = static_cast<int>(count_field(*rc, "max_rank", where, -1));
    }
    s.median_step_s = number_field(j, "rank_step_s_median", where);
    if (sg != j.end()) {
      TRIPOD_INPUT_CHECK(sg->is_array(), "{}: \"stragglers\" must be a list, got {}", where, sg->dump());
      for (const json& g : *sg) {
        TRIPOD_INPUT_CHECK(g.is_object() && g.contains("rank") && g["rank"].is_number_integer() &&
                               g["rank"].get<int64_t>() >= 0,
                           "{}: a straggler must be an object with a rank >= 0, got {}", where, g.dump());
        s.stragglers.push_back({.rank = g["rank"].get<int>(), .compute_s = number_field(g, "compute_s", where),
                                .ratio = number_field(g, "ratio", where),
                                .intervals = static_cast<int>(count_field(g, "intervals", where, 0))});
      }
    }
    r.stragglers = std::move(s);
  }
  return r;
}

json to_json(const EvalRecord& e) {
  return {{"eval", true},
          {"step", e.step},
          {"split", e.split},
          {"loss", number(e.loss)},
          {"perplexity", number(e.perplexity)},
          {"val_loss", number(e.loss)},
          {"val_ppl", number(e.perplexity)},
          {"tokens", e.tokens},
          {"eval_time_s", e.seconds},
          {"consumed_samples", e.consumed_samples}};
}

EvalRecord eval_record(const json& j, const std::string& where) {
  EvalRecord e;
  e.step = step_field(j, where);
  e.split = string_field(j, "split", where, "valid");
  e.loss = number_field(j, "loss", where);
  e.perplexity = number_field(j, "perplexity", where);
  e.tokens = count_field(j, "tokens", where, 0);
  const double s = number_field(j, "eval_time_s", where);
  e.seconds = std::isfinite(s) ? s : 0;
  e.consumed_samples = count_field(j, "consumed_samples", where, -1);
  return e;
}

const TaskMetric* TaskRecord::find(std::string_view name) const {
  for (const TaskMetric& m : metrics)
    if (m.name == name) return &m;
  return nullptr;
}

TaskRecord task_record(int64_t step, int64_t consumed_samples, const TaskResult& r) {
  return {.step = step, .consumed_samples = consumed_samples, .examples = r.examples, .requests = r.requests,
          .task = r.task, .kind = r.kind, .seconds = r.seconds, .metrics = r.metrics};
}

json to_json(const TaskRecord& t) {
  json j = {{"eval_task", true},   {"step", t.step},         {"consumed_samples", t.consumed_samples},
            {"task", t.task},      {"kind", t.kind},         {"examples", t.examples},
            {"requests", t.requests}, {"eval_time_s", t.seconds}};
  for (const TaskMetric& m : t.metrics) {
    j[m.name] = number(m.value);
    if (t.kind != "bits_per_byte") j[m.name + "_stderr"] = m.stderr_of_mean ? number(*m.stderr_of_mean) : json(nullptr);
  }
  return j;
}

TaskRecord task_record(const json& j, const std::string& where) {
  static const std::set<std::string> fields = {"eval_task", "step", "consumed_samples", "task", "kind",
                                               "examples",  "requests", "eval_time_s"};
  TaskRecord t;
  t.step = step_field(j, where);
  for (const char* key : {"task", "kind"}) {
    auto it = j.find(key);
    TRIPOD_INPUT_CHECK(it != j.end() && it->is_string(), "{}: a task record's \"{}\" must be a string", where, key);
  }
  t.task = j["task"].get<std::string>();
  t.kind = j["kind"].get<std::string>();
  t.consumed_samples = count_field(j, "consumed_samples", where, -1);
  t.examples = count_field(j, "examples", where, 0);
  t.requests = count_field(j, "requests", where, 0);
  const double s = number_field(j, "eval_time_s", where);
  t.seconds = std::isfinite(s) ? s : 0;
  // Every other key is a metric or its standard error (<metric>_stderr).
  for (const auto& [key, value] : j.items()) {
    if (fields.count(key) || (key.size() > 7 && key.ends_with("_stderr"))) continue;
    TaskMetric m{.name = key, .value = number_field(j, key.c_str(), where)};
    const double se = number_field(j, (key + "_stderr").c_str(), where);
    if (std::isfinite(se)) m.stderr_of_mean = se;
    t.metrics.push_back(std::move(m));
  }
  return t;
}

RunMetrics read_metrics(const std::string& path) {
  std::map<int64_t, StepRecord> train;
  std::map<std::pair<std::string, int64_t>, EvalRecord> eval;
  std::map<std::pair<std::string, int64_t>, TaskRecord> tasks;
  RunMetrics m;
  for_each_record(path, &m.unfinished_line, [&](const json& j, const std::string& where) {
    if (j.value("eval", false)) {
      EvalRecord e = eval_record(j, where);
      m.superseded += eval.count({e.split, e.step});
      eval[{e.split, e.step}] = std::move(e);
    } else if (j.value("eval_task", false)) {
      TaskRecord t = task_record(j, where);
      m.superseded += tasks.count({t.task, t.step});
      tasks[{t.task, t.step}] = std::move(t);
    } else if (j.contains("step") && j.contains("loss")) {
      StepRecord r = step_record(j, where);
      m.superseded += train.count(r.step);
      train[r.step] = std::move(r);
    } else {
      ++m.other_records;
    }
  });
  for (auto& [s, r] : train) m.train.push_back(std::move(r));
  for (auto& [k, e] : eval) m.eval.push_back(std::move(e));
  for (auto& [k, t] : tasks) m.tasks.push_back(std::move(t));
  return m;
}

// ---- restarts.jsonl ------------------------------------------------------------------------

json to_json(const RestartRecord& r) {
  return {{"attempt", r.attempt},       {"cause", r.cause},
          {"exit_status", r.exit_status}, {"failed_at", r.failed_at},
          {"resumed_at", r.resumed_at},   {"resumed_from_step", r.resumed_from_step},
          {"checkpoint", r.checkpoint},   {"downtime_s", r.downtime_s},
          {"time_lost_s", r.time_lost_s}};
}

RestartRecord restart_record(const json& j, const std::string& where) {
  auto seconds = [&](const char* key) {
    const double v = number_field(j, key, where);
    return std::isfinite(v) ? v : 0.0;
  };
  return {.attempt = count_field(j, "attempt", where, 0),
          .resumed_from_step = count_field(j, "resumed_from_step", where, 0),
          .exit_status = count_field(j, "exit_status", where, 0),
          .cause = string_field(j, "cause", where, ""),
          .checkpoint = string_field(j, "checkpoint", where, ""),
          .failed_at = seconds("failed_at"),
          .resumed_at = seconds("resumed_at"),
          .downtime_s = seconds("downtime_s"),
          .time_lost_s = seconds("time_lost_s")};
}

void append_restart(const std::string& run_dir, const RestartRecord& r) {
  fs::create_directories(run_dir);
  std::ofstream(fs::path(run_dir) / "restarts.jsonl", std::ios::app) << to_json(r).dump() << '\n';
}

std::vector<RestartRecord> read_restarts(const std::string& path) {
  std::vector<RestartRecord> out;
  for_each_record(path, nullptr, [&](const json& j, const std::string& where) { out.push_back(restart_record(j, where)); });
  return out;
}

// ---- the launcher's status -----------------------------------------------------------------

void write_launch_status(const std::string& path, const LaunchStatus& s) {
  const json j = {{"output_dir", s.output_dir}, {"checkpoint_dir", s.checkpoint_dir}, {"state", s.state},
                  {"step", s.step}, {"steps", s.steps}};
  const std::string tmp = path + ".tmp";
  std::ofstream(tmp) << j.dump() << '\n';
  std::error_code ec;
  fs::rename(tmp, path, ec);
}

}  // namespace tripod
