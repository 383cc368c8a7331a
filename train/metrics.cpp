// Console progress lines, metrics.jsonl and the TensorBoard scalars.
#include "train/metrics.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "core/error.h"

namespace tripod {

MetricsLog::MetricsLog(const std::string& run_dir, const std::string& tensorboard_dir) {
  std::filesystem::create_directories(run_dir);
  std::string path = run_dir + "/metrics.jsonl";
  file_ = std::fopen(path.c_str(), "a");
  TRIPOD_INPUT_CHECK(file_, "cannot write {} (train.output_dir)", path);
  if (!tensorboard_dir.empty()) {
    tensorboard_ = std::make_unique<TensorBoardWriter>(tensorboard_dir);
    spdlog::info("TensorBoard: {}", tensorboard_->path());
  }
}

MetricsLog::~MetricsLog() {
  if (file_) std::fclose(file_);
}

void MetricsLog::log_json(const nlohmann::json& j) {
  std::string line = j.dump() + "\n";
  std::fwrite(line.data(), 1, line.size(), file_);
  std::fflush(file_);
}

double MoeLayerMetrics::max_over_mean() const {
  double sum = 0, top = 0;
  for (double c : tokens_per_expert) sum += c, top = std::max(top, c);
  return sum > 0 ? top * static_cast<double>(tokens_per_expert.size()) / sum : 0.0;
}

std::vector<Scalar> tensorboard_scalars(const StepMetrics& m) {
  std::vector<Scalar> s = {{"lm loss", m.loss},
                           {"learning-rate", m.lr},
                           {"grad-norm", m.grad_norm},
                           {"batch-size", static_cast<double>(m.batch_size)},
                           {"iteration-time", m.step_time_s},
                           {"throughput", m.tokens_per_s},
                           {"tflops", m.tflops},
                           {"mfu", m.mfu},
                           {"skipped-iterations", static_cast<double>(m.skipped_total)}};
  if (m.memory.is_object())
    for (const auto& [category, bytes] : m.memory.items())
      if (bytes.is_number()) s.push_back({"mem-peak-bytes/" + category, bytes.get<double>()});
  if (!m.moe.empty()) {
    double aux = 0, z = 0;
    for (const MoeLayerMetrics& l : m.moe) aux += l.load_balancing_loss, z += l.z_loss;
    s.push_back({"load_balancing_loss", aux / static_cast<double>(m.moe.size())});
    s.push_back({"z_loss", z / static_cast<double>(m.moe.size())});
    for (const MoeLayerMetrics& l : m.moe) {
      s.push_back({fmt::format("moe/load_balancing_loss_layer_{}", l.layer), l.load_balancing_loss});
      s.push_back({fmt::format("moe/z_loss_layer_{}", l.layer), l.z_loss});
      s.push_back({fmt::format("moe/dropped_tokens_layer_{}", l.layer), l.dropped});
      s.push_back({fmt::format("moe/max_over_mean_load_layer_{}", l.layer), l.max_over_mean()});
      for (size_t e = 0; e < l.tokens_per_expert.size(); ++e)
        s.push_back({fmt::format("moe/tokens_per_expert_layer_{}/expert_{}", l.layer, e), l.tokens_per_expert[e]});
    }
  }
  return s;
}

std::vector<Scalar> tensorboard_scalars(const EvalMetrics& e) {
  return {{"lm loss validation", e.loss}, {"lm loss validation ppl", e.perplexity}};
}

std::vector<Scalar> tensorboard_scalars(const TaskResult& r) {
  std::vector<Scalar> s;
  for (const TaskMetric& m : r.metrics) s.push_back({r.task + "/" + m.name, m.value});
  return s;
}

void MetricsLog::write_scalars(int64_t step, int64_t samples, const std::vector<Scalar>& scalars) {
  if (!tensorboard_) return;
  tensorboard_->add_scalars(step, scalars);
  std::vector<Scalar> twins;
  twins.reserve(scalars.size());
  for (const auto& [tag, value] : scalars) twins.push_back({tag + " vs samples", value});
  tensorboard_->add_scalars(samples, twins);
  tensorboard_->flush();
}

void MetricsLog::log_step(const StepMetrics& m) {
  nlohmann::json j = {{"step", m.step},
                      {"loss", m.loss},
                      {"lr", m.lr},
                      {"grad_norm", m.grad_norm},
                      {"step_time_s", m.step_time_s},
                      {"tokens_per_s", m.tokens_per_s},
                      {"mfu", m.mfu},
                      {"tflops", m.tflops},
                      {"batch_size", m.batch_size},
                      {"consumed_samples", m.consumed_samples},
                      {"skipped", m.skipped},
                      {"skipped_total", m.skipped_total}};
  if (!m.memory.is_null()) j["mem_peak_bytes"] = m.memory;
  std::string moe_note;
  if (!m.moe.empty()) {
    // Per MoE layer, in layer order: the expert load table over the step and its losses.
    nlohmann::json layers = nlohmann::json::array(), tokens = nlohmann::json::array(),
                   dropped = nlohmann::json::array(), aux = nlohmann::json::array(), z = nlohmann::json::array(),
                   ratio = nlohmann::json::array();
    double worst = 0, aux_mean = 0;
    for (const MoeLayerMetrics& l : m.moe) {
      layers.push_back(l.layer);
      nlohmann::json row = nlohmann::json::array();
      for (double c : l.tokens_per_expert) row.push_back(static_cast<int64_t>(std::llround(c)));
      tokens.push_back(std::move(row));
      dropped.push_back(static_cast<int64_t>(std::llround(l.dropped)));
      aux.push_back(l.load_balancing_loss);
      z.push_back(l.z_loss);
      ratio.push_back(l.max_over_mean());
      worst = std::max(worst, l.max_over_mean());
      aux_mean += l.load_balancing_loss / static_cast<double>(m.moe.size());
    }
    j["moe"] = {{"layers", layers}, {"tokens_per_expert", tokens}, {"dropped_tokens", dropped},
                {"load_balancing_loss", aux}, {"z_loss", z}, {"max_over_mean_load", ratio}};
    moe_note = fmt::format(" | moe balance loss {:.3f}, max/mean load {:.2f}", aux_mean, worst);
  }
  std::string straggler_note;
  if (m.stragglers) {
    const StragglerSummary& s = *m.stragglers;
    j["rank_compute_s"] = {{"median", s.median_compute_s}, {"max", s.max_compute_s}, {"max_rank", s.max_rank}};
    j["rank_step_s_median"] = s.median_step_s;
    nlohmann::json list = nlohmann::json::array();
    for (const Straggler& g : s.stragglers) {
      list.push_back({{"rank", g.rank}, {"compute_s", g.compute_s}, {"ratio", g.ratio}, {"intervals", g.intervals}});
      straggler_note += fmt::format("{}{} ({:.2f}x)", straggler_note.empty() ? " | stragglers: rank " : ", ", g.rank,
                                    g.ratio);
    }
    j["stragglers"] = std::move(list);
  }
  log_json(j);
  write_scalars(m.step, m.consumed_samples, tensorboard_scalars(m));
  double eta = m.step_time_s * static_cast<double>(m.steps - m.step);
  spdlog::info("step {:>6}/{} | loss {:.4f} | lr {:.3e} | grad norm {:.4f} | {:.0f} tok/s | MFU {:.1f}% | ETA {}{}{}{}",
               m.step, m.steps, m.loss, m.lr, m.grad_norm, m.tokens_per_s, 100.0 * m.mfu, format_duration(eta),
               moe_note, m.skipped ? " | SKIPPED (non-finite)" : "", straggler_note);
  if (m.stragglers) {
    const StragglerSummary& s = *m.stragglers;
    for (const Straggler& g : s.stragglers)
      if (std::find(s.named.begin(), s.named.end(), g.rank) != s.named.end())
        spdlog::warn("straggler: rank {} computes {:.2f}x the median of the ranks doing the same work ({:.1f} ms vs "
                     "{:.1f} ms per step) for {} log intervals in a row (train.straggler_factor)",
                     g.rank, g.ratio, 1e3 * g.compute_s, 1e3 * g.compute_s / g.ratio, g.intervals);
    for (int r : s.cleared) spdlog::info("straggler: rank {} is back within the median's bar", r);
  }
}

void MetricsLog::log_eval(const EvalMetrics& e) {
  // The report (train/report.cpp) reads eval records by "eval", "split", "loss", "perplexity";
  // val_loss and val_ppl name the same numbers for readers of the step records.
  log_json({{"eval", true}, {"step", e.step}, {"split", "valid"}, {"loss", e.loss}, {"perplexity", e.perplexity},
            {"val_loss", e.loss}, {"val_ppl", e.perplexity}, {"tokens", e.tokens}, {"eval_time_s", e.seconds},
            {"consumed_samples", e.consumed_samples}});
  write_scalars(e.step, e.consumed_samples, tensorboard_scalars(e));
}

void MetricsLog::log_task(int64_t step, int64_t consumed_samples, const TaskResult& r) {
  nlohmann::json j = task_result_json(r);
  j.erase("seconds");
  j.erase("path");
  j.update({{"eval_task", true}, {"step", step}, {"consumed_samples", consumed_samples}, {"eval_time_s", r.seconds}});
  log_json(j);
  write_scalars(step, consumed_samples, tensorboard_scalars(r));
}

std::string format_duration(double s) {
  if (!(s >= 0)) return "?";
  int64_t t = static_cast<int64_t>(s + 0.5);
  if (t >= 3600) return fmt::format("{}h{:02d}m", t / 3600, (t % 3600) / 60);
  if (t >= 60) return fmt::format("{}m{:02d}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}

}  // namespace tripod
