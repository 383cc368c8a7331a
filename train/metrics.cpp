// Console progress lines and metrics.jsonl.
#include "train/metrics.h"

#include <spdlog/spdlog.h>

#include <filesystem>

#include "core/error.h"

namespace tripod {

MetricsLog::MetricsLog(const std::string& run_dir) {
  std::filesystem::create_directories(run_dir);
  std::string path = run_dir + "/metrics.jsonl";
  file_ = std::fopen(path.c_str(), "a");
  TRIPOD_INPUT_CHECK(file_, "cannot write {} (train.output_dir)", path);
}

MetricsLog::~MetricsLog() {
  if (file_) std::fclose(file_);
}

void MetricsLog::log_json(const nlohmann::json& j) {
  std::string line = j.dump() + "\n";
  std::fwrite(line.data(), 1, line.size(), file_);
  std::fflush(file_);
}

void MetricsLog::log_step(const StepMetrics& m) {
  nlohmann::json j = {{"step", m.step},
                      {"loss", m.loss},
                      {"lr", m.lr},
                      {"grad_norm", m.grad_norm},
                      {"step_time_s", m.step_time_s},
                      {"tokens_per_s", m.tokens_per_s},
                      {"mfu", m.mfu},
                      {"consumed_samples", m.consumed_samples},
                      {"skipped", m.skipped},
                      {"skipped_total", m.skipped_total}};
  if (!m.memory.is_null()) j["mem_peak_bytes"] = m.memory;
  log_json(j);
  double eta = m.step_time_s * static_cast<double>(m.steps - m.step);
  spdlog::info("step {:>6}/{} | loss {:.4f} | lr {:.3e} | grad norm {:.4f} | {:.0f} tok/s | MFU {:.1f}% | ETA {}{}",
               m.step, m.steps, m.loss, m.lr, m.grad_norm, m.tokens_per_s, 100.0 * m.mfu, format_duration(eta),
               m.skipped ? " | SKIPPED (non-finite)" : "");
}

std::string format_duration(double s) {
  if (!(s >= 0)) return "?";
  int64_t t = static_cast<int64_t>(s + 0.5);
  if (t >= 3600) return fmt::format("{}h{:02d}m", t / 3600, (t % 3600) / 60);
  if (t >= 60) return fmt::format("{}m{:02d}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}

}  // namespace tripod
