// Step metrics: a progress line on the console and one JSON object per logged step in
// RUN_DIR/metrics.jsonl (written by world rank 0).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdio>
#include <string>

namespace tripod {

struct StepMetrics {
  int64_t step = 0, steps = 0;
  double loss = 0, lr = 0, grad_norm = 0;
  double step_time_s = 0, tokens_per_s = 0, mfu = 0;
  int64_t consumed_samples = 0;
  bool skipped = false;  // non-finite loss or grad norm: the update was skipped
  int64_t skipped_total = 0;
  nlohmann::json memory;  // peak bytes per category (per rank when gathered)
};

class MetricsLog {
 public:
  // Opens RUN_DIR/metrics.jsonl for appending (resumed runs continue the file).
  explicit MetricsLog(const std::string& run_dir);
  ~MetricsLog();
  void log_step(const StepMetrics& m);
  void log_json(const nlohmann::json& j);  // any other record (eval results)

 private:
  std::FILE* file_ = nullptr;
};

// "1h02m", "3m05s", "12s".
std::string format_duration(double seconds);

}  // namespace tripod
