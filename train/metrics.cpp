// Console progress lines, metrics.jsonl and the TensorBoard scalars.
#include "train/metrics.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "core/error.h"
#include "core/format.h"

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

std::vector<Scalar> tensorboard_scalars(const StepRecord& m) {
  std::vector<Scalar> s = {{"lm loss", m.loss},
                           {"learning-rate", m.lr},
                           {"grad-norm", m.grad_norm},
                           {"batch-size", static_cast<double>(m.batch_size)},
                           {"iteration-time", m.step_time_s},
                           {"throughput", m.tokens_per_s},
                           {"tflops", m.tflops},
                           {"mfu", m.mfu},
                           {"skipped-iterations", static_cast<double>(m.skipped_total)}};
  if (!m.memory.empty())
    for (const auto& [category, bytes] : m.memory[0]) s.push_back({"mem-peak-bytes/" + category, static_cast<double>(bytes)});
  if (!m.moe.empty()) {
    double aux = 0, z = 0;
    for (const MoeLayerRecord& l : m.moe) aux += l.load_balancing_loss, z += l.z_loss;
    s.push_back({"load_balancing_loss", aux / static_cast<double>(m.moe.size())});
    s.push_back({"z_loss", z / static_cast<double>(m.moe.size())});
    for (const MoeLayerRecord& l : m.moe) {
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

std::vector<Scalar> tensorboard_scalars(const EvalRecord& e) {
  return {{"lm loss validation", e.loss}, {"lm loss validation ppl", e.perplexity}};
}

std::vector<Scalar> tensorboard_scalars(const TaskRecord& r) {
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

void MetricsLog::log_step(const StepRecord& m, int64_t steps) {
  std::string moe_note;
  if (!m.moe.empty()) {
    double worst = 0, aux_mean = 0;
    for (const MoeLayerRecord& l : m.moe) {
      worst = std::max(worst, l.max_over_mean());
      aux_mean += l.load_balancing_loss / static_cast<double>(m.moe.size());
    }
    moe_note = fmt::format(" | moe balance loss {:.3f}, max/mean load {:.2f}", aux_mean, worst);
  }
  std::string straggler_note;
  if (m.stragglers)
    for (const Straggler& g : m.stragglers->stragglers)
      straggler_note += fmt::format("{}{} ({:.2f}x)", straggler_note.empty() ? " | stragglers: rank " : ", ", g.rank,
                                    g.ratio);
  log_json(to_json(m));
  write_scalars(m.step, m.consumed_samples, tensorboard_scalars(m));
  double eta = m.step_time_s * static_cast<double>(steps - m.step);
  spdlog::info("step {:>6}/{} | loss {:.4f} | lr {:.3e} | grad norm {:.4f} | {:.0f} tok/s | MFU {:.1f}% | ETA {}{}{}{}",
               m.step, steps, m.loss, m.lr, m.grad_norm, m.tokens_per_s, 100.0 * m.mfu, format_duration(eta),
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

void MetricsLog::log_eval(const EvalRecord& e) {
  log_json(to_json(e));
  write_scalars(e.step, e.consumed_samples, tensorboard_scalars(e));
}

void MetricsLog::log_task(const TaskRecord& t) {
  log_json(to_json(t));
  write_scalars(t.step, t.consumed_samples, tensorboard_scalars(t));
}

}  // namespace tripod
