// The run directory's records (train/run_files.h): what the writer writes is what the readers
// read, field by field, through the files themselves; malformed lines name the file and line.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "cli_util.h"
#include "train/metrics.h"
#include "train/run_files.h"

namespace tripod {
namespace {

namespace fs = std::filesystem;

StepRecord full_step(int64_t step) {
  StepRecord r;
  r.step = step;
  r.loss = 4.25 - 0.01 * static_cast<double>(step);
  r.lr = 3e-4, r.grad_norm = 0.875, r.step_time_s = 0.5, r.tokens_per_s = 8192, r.mfu = 0.375, r.tflops = 12.5;
  r.batch_size = 16, r.consumed_samples = 16 * step, r.skipped_total = 1;
  r.memory = {{{"params", 1000}, {"activations", 2500}, {"total", 4000}}};
  r.moe = {{.layer = 1, .tokens_per_expert = {10, 30, 20, 4}, .dropped = 2, .load_balancing_loss = 1.125,
            .z_loss = 0.25},
           {.layer = 3, .tokens_per_expert = {16, 16, 16, 16}, .dropped = 0, .load_balancing_loss = 1.0,
            .z_loss = 0.5}};
  StragglerSummary s;
  s.step = step;
  s.median_compute_s = 0.25, s.max_compute_s = 0.5, s.median_step_s = 0.5, s.max_rank = 3;
  s.stragglers = {{.rank = 3, .compute_s = 0.5, .ratio = 2.0, .intervals = 4}};
  r.stragglers = s;
  return r;
}

void expect_same(const StepRecord& a, const StepRecord& b) {
  EXPECT_EQ(a.step, b.step);
  for (auto [x, y] : {std::pair{a.loss, b.loss}, {a.lr, b.lr}, {a.grad_norm, b.grad_norm}, {a.step_time_s, b.step_time_s},
                      {a.tokens_per_s, b.tokens_per_s}, {a.mfu, b.mfu}, {a.tflops, b.tflops}})
    EXPECT_TRUE(x == y || (std::isnan(x) && std::isnan(y))) << x << " vs " << y;
  EXPECT_EQ(a.batch_size, b.batch_size);
  EXPECT_EQ(a.consumed_samples, b.consumed_samples);
  EXPECT_EQ(a.skipped, b.skipped);
  EXPECT_EQ(a.skipped_total, b.skipped_total);
  EXPECT_EQ(a.memory, b.memory);
  ASSERT_EQ(a.moe.size(), b.moe.size());
  for (size_t l = 0; l < a.moe.size(); ++l) {
    EXPECT_EQ(a.moe[l].layer, b.moe[l].layer);
    EXPECT_EQ(a.moe[l].tokens_per_expert, b.moe[l].tokens_per_expert);
    EXPECT_EQ(a.moe[l].dropped, b.moe[l].dropped);
    EXPECT_EQ(a.moe[l].load_balancing_loss, b.moe[l].load_balancing_loss);
    EXPECT_EQ(a.moe[l].z_loss, b.moe[l].z_loss);
  }
  ASSERT_EQ(a.stragglers.has_value(), b.stragglers.has_value());
  if (a.stragglers) {
    EXPECT_EQ(a.stragglers->median_compute_s, b.stragglers->median_compute_s);
    EXPECT_EQ(a.stragglers->max_compute_s, b.stragglers->max_compute_s);
    EXPECT_EQ(a.stragglers->median_step_s, b.stragglers->median_step_s);
    EXPECT_EQ(a.stragglers->max_rank, b.stragglers->max_rank);
    ASSERT_EQ(a.stragglers->stragglers.size(), b.stragglers->stragglers.size());
    for (size_t k = 0; k < a.stragglers->stragglers.size(); ++k) {
      const Straggler &x = a.stragglers->stragglers[k], &y = b.stragglers->stragglers[k];
      EXPECT_EQ(x.rank, y.rank);
      EXPECT_EQ(x.compute_s, y.compute_s);
      EXPECT_EQ(x.ratio, y.ratio);
      EXPECT_EQ(x.intervals, y.intervals);
    }
  }
}

class RunFiles : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = test::scratch_dir("run_files"); }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(RunFiles, MetricsLogWritesWhatReadMetricsReads) {
  const StepRecord a = full_step(10);
  StepRecord skipped;  // a skipped step: non-finite loss and grad norm, no straggler summary
  skipped.step = 11, skipped.skipped = true, skipped.lr = 1e-4, skipped.consumed_samples = 176;
  const EvalRecord e{.step = 10, .consumed_samples = 160, .split = "valid", .loss = 3.5, .perplexity = std::exp(3.5),
                     .tokens = 4096, .seconds = 1.25};
  TaskResult mc;
  mc.task = "mc", mc.kind = "multiple_choice", mc.path = "x.jsonl", mc.examples = 40, mc.requests = 160;
  mc.metrics = {{.name = "acc", .value = 0.5, .stderr_of_mean = 0.08}, {.name = "acc_norm", .value = 0.625}};
  mc.seconds = 2.5;
  TaskResult text;
  text.task = "bpb", text.kind = "bits_per_byte", text.path = "t.jsonl", text.examples = 3, text.requests = 7;
  text.metrics = {{.name = "bits_per_byte", .value = 1.75}, {.name = "word_perplexity", .value = 90.5}};
  {
    MetricsLog log(dir_.string());
    log.log_step(a, 100);
    log.log_eval(e);
    log.log_task(task_record(10, 160, mc));
    log.log_task(task_record(10, 160, text));
    log.log_step(skipped, 100);
    log.log_json({{"note", "another kind of record"}});
  }
  const RunMetrics m = read_metrics((dir_ / "metrics.jsonl").string());
  ASSERT_EQ(m.train.size(), 2u);
  expect_same(m.train[0], a);
  expect_same(m.train[1], skipped);
  EXPECT_EQ(m.other_records, 1);
  EXPECT_FALSE(m.unfinished_line);
  ASSERT_EQ(m.eval.size(), 1u);
  EXPECT_EQ(m.eval[0].step, e.step);
  EXPECT_EQ(m.eval[0].split, e.split);
  EXPECT_EQ(m.eval[0].loss, e.loss);
  EXPECT_EQ(m.eval[0].perplexity, e.perplexity);
  EXPECT_EQ(m.eval[0].tokens, e.tokens);
  EXPECT_EQ(m.eval[0].seconds, e.seconds);
  EXPECT_EQ(m.eval[0].consumed_samples, e.consumed_samples);
  ASSERT_EQ(m.tasks.size(), 2u);  // by (task, step): bpb before mc
  const TaskRecord &b = m.tasks[0], &c = m.tasks[1];
  EXPECT_EQ(b.task, "bpb");
  EXPECT_EQ(b.kind, "bits_per_byte");
  ASSERT_EQ(b.metrics.size(), 2u);
  EXPECT_EQ(b.find("bits_per_byte")->value, 1.75);
  EXPECT_FALSE(b.find("bits_per_byte")->stderr_of_mean);
  EXPECT_EQ(c.task, "mc");
  EXPECT_EQ(c.examples, 40);
  EXPECT_EQ(c.requests, 160);
  EXPECT_EQ(c.seconds, 2.5);
  EXPECT_EQ(c.consumed_samples, 160);
  ASSERT_EQ(c.metrics.size(), 2u);
  EXPECT_EQ(c.find("acc")->value, 0.5);
  EXPECT_EQ(c.find("acc")->stderr_of_mean, 0.08);
  EXPECT_EQ(c.find("acc_norm")->value, 0.625);
  EXPECT_FALSE(c.find("acc_norm")->stderr_of_mean);
}

TEST_F(RunFiles, ALaterRecordOfAStepWinsAndAnUnfinishedLastLineIsLeftOut) {
  {
    MetricsLog log(dir_.string());
    log.log_step(full_step(1), 5);
    log.log_step(full_step(2), 5);
    StepRecord again = full_step(2);  // a resumed run logs step 2 again
    again.loss = 1.0;
    log.log_step(again, 5);
  }
  std::ofstream(dir_ / "metrics.jsonl", std::ios::app) << R"({"step": 3, "lo)";
  const RunMetrics m = read_metrics((dir_ / "metrics.jsonl").string());
  ASSERT_EQ(m.train.size(), 2u);
  EXPECT_EQ(m.train[1].loss, 1.0);
  EXPECT_EQ(m.superseded, 1);
  EXPECT_TRUE(m.unfinished_line);
}

TEST_F(RunFiles, AMalformedLineNamesTheFileAndLine) {
  const fs::path p = dir_ / "metrics.jsonl";
  auto message = [&](const std::string& text) {
    std::ofstream(p) << text;
    try {
      read_metrics(p.string());
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message("{\"step\": 1, \"loss\": 2}\nnot json\n{}\n"), p.string() + ":2: not a JSON line");
  EXPECT_EQ(message("{\"step\": 1, \"loss\": \"low\"}\n"),
            p.string() + ":1: \"loss\" must be a number, got \"low\"");
  EXPECT_EQ(message("{\"step\": -1, \"loss\": 2}\n"), p.string() + ":1: \"step\" must be a non-negative integer, got -1");
  EXPECT_EQ(message("{\"eval_task\": true, \"step\": 1, \"kind\": \"x\"}\n"),
            p.string() + ":1: a task record's \"task\" must be a string");
  EXPECT_EQ(message("{\"step\": 1, \"loss\": 2, \"moe\": {\"layers\": [0]}}\n"),
            p.string() + ":1: moe.tokens_per_expert must be a list");
}

TEST_F(RunFiles, RestartsAppendAndReadBack) {
  const RestartRecord a{.attempt = 1, .resumed_from_step = 20, .exit_status = 137, .cause = "killed",
                        .checkpoint = "/ckpt/iter_0000020", .failed_at = 1.5e9, .resumed_at = 1.5e9 + 30,
                        .downtime_s = 30, .time_lost_s = 42.5};
  RestartRecord b = a;
  b.attempt = 2, b.cause = "timeout", b.checkpoint = "";
  append_restart((dir_ / "run").string(), a);
  append_restart((dir_ / "run").string(), b);
  const auto rs = read_restarts((dir_ / "run" / "restarts.jsonl").string());
  ASSERT_EQ(rs.size(), 2u);
  for (size_t k = 0; k < 2; ++k) {
    const RestartRecord& want = k == 0 ? a : b;
    EXPECT_EQ(to_json(rs[k]), to_json(want));
  }
  std::ofstream(dir_ / "run" / "restarts.jsonl", std::ios::app) << "{\"attempt\": \"three\"}\n";
  EXPECT_THROW(read_restarts((dir_ / "run" / "restarts.jsonl").string()), InputError);
}

TEST_F(RunFiles, LaunchStatusIsWrittenWhole) {
  const std::string path = (dir_ / "status").string();
  write_launch_status(path, {.output_dir = "runs/x", .checkpoint_dir = "ck", .state = "running", .step = 7, .steps = 9});
  std::ifstream in(path);
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j, (nlohmann::json{{"output_dir", "runs/x"}, {"checkpoint_dir", "ck"}, {"state", "running"}, {"step", 7},
                               {"steps", 9}}));
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

}  // namespace
}  // namespace tripod
