// Every run checks the planner: `tripod train --profile-steps N` (train.profile_steps) writes the
// profiled steps' measured breakdown beside the cost model's prediction into
// RUN_DIR/plan_check.json, and `tripod plan --check RUN_DIR [--hardware H] [--json]` prints it,
// on real short CPU runs of one rank, of tp = 2 and of a two-stage pipeline; `tripod report`
// shows it. And what the prediction stands on: `tripod calibrate --model` on two ranks; and the
// GPU bundle's plan-check script on CPU files.
#include "e2e_test.h"
#include "plan/hardware.h"
#include "plan/plan_check.h"

namespace tripod {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::run_tripod;

constexpr const char* kFamilies[] = {"gemm", "attention", "elementwise", "communication", "pipeline_idle",
                                     "optimizer", "other"};

class PlanCheckCli : public test::E2eTest {
 protected:
  // Trains the tiny config for 4 steps with `args` added; returns the run directory.
  fs::path train(const std::string& name, const std::string& args, int np = 1) {
    const fs::path run = dir_ / name;
    const auto r = run_tripod("train --config " + write_config({{"train.steps", "4"}, {"train.trace", "false"}}).string() +
                                  " --set train.output_dir=" + run.string() + " " + args,
                              {.np = np});
    EXPECT_EQ(r.status, 0) << r.err;
    return run;
  }
  json check_json(const fs::path& run, const std::string& args = "") {
    const auto r = run_tripod("plan --check " + run.string() + " --json " + args);
    EXPECT_EQ(r.status, 0) << r.err;
    return json::parse(r.out);  // exactly one object on stdout
  }
};

// The parts of a breakdown object add up to its step.
void expect_adds_up(const json& b, const std::string& what) {
  double sum = 0;
  for (const char* f : kFamilies) sum += b.at(f).get<double>();
  EXPECT_NEAR(sum, b.at("step").get<double>(), 1e-9 * b.at("step").get<double>()) << what << ": " << b.dump();
}

TEST_F(PlanCheckCli, OneRankRunChecksItsPrediction) {
  const fs::path run = train("run", "--profile-steps 2");
  ASSERT_TRUE(fs::exists(run / "plan_check.json"));
  EXPECT_NE(test::slurp(run / "config.toml").find("profile_steps = 2"), std::string::npos);
  const json j = check_json(run);
  EXPECT_EQ(j["steps"], json::array({2, 3}));  // the two after the first
  EXPECT_EQ(j["hardware"], "CPU (built-in)");  // no parallel.hardware: the built-in figures of train.device
  EXPECT_EQ(j["layout"]["tp"], 1);
  EXPECT_EQ(j["layout"]["schedule"], "1f1b");
  EXPECT_EQ(j["layout"]["microbatches"], 4);
  double predicted = 0, measured = 0;
  for (const char* f : kFamilies) {
    ASSERT_TRUE(j.contains(f)) << f;
    EXPECT_GE(j[f]["predicted"].get<double>(), 0) << f;
    EXPECT_GE(j[f]["measured"].get<double>(), 0) << f;
    predicted += j[f]["predicted"].get<double>();
    measured += j[f]["measured"].get<double>();
  }
  const double step = j["step"]["measured"].get<double>();
  EXPECT_NEAR(predicted, j["step"]["predicted"].get<double>(), 1e-9 * predicted);
  EXPECT_NEAR(measured, step, 1e-9 * step);
  // The real ops were timed: GEMMs and attention ran in every action; one rank neither
  // communicates nor waits in the prediction.
  EXPECT_GT(j["gemm"]["measured"].get<double>(), 0);
  EXPECT_GT(j["attention"]["measured"].get<double>(), 0);
  EXPECT_GT(j["elementwise"]["measured"].get<double>(), 0);
  EXPECT_GT(j["optimizer"]["measured"].get<double>(), 0);
  EXPECT_EQ(j["communication"]["predicted"].get<double>(), 0);
  EXPECT_EQ(j["other"]["predicted"].get<double>(), 0);
  EXPECT_GT(j["gemm"]["predicted"].get<double>(), 0);
  // Nor does it measure communication: on the CPU that is time in MPI waits, and the host time
  // between the ops (data loading, bookkeeping) is other.
  EXPECT_LT(j["communication"]["measured"].get<double>(), 0.05 * step);
  EXPECT_GT(j["other"]["measured"].get<double>(), 0);
  // The step the run logged is about the profiled steps' (its metrics are the same steps).
  for (const json& m : test::metrics(run)) {
    if (m.value("step", 0) == 2 || m.value("step", 0) == 3) {
      EXPECT_GT(m["step_time_s"].get<double>(), 0.5 * step);
    }
  }
  ASSERT_EQ(j["ranks"].size(), 1u);
  expect_adds_up(j["ranks"][0]["measured"], "rank 0");
  ASSERT_EQ(j["pipeline_ranks"].size(), 1u);
  expect_adds_up(j["pipeline_ranks"][0]["predicted"], "predicted");

  // The table: a row per family and the step, predicted and measured in ms, the error.
  const auto r = run_tripod("plan --check " + run.string());
  ASSERT_EQ(r.status, 0) << r.err;
  for (const char* row : {"\ngemm ", "\nattention ", "\nelementwise ", "\ncommunication ", "\npipeline idle ",
                          "\noptimizer ", "\nother ", "\nstep "})
    EXPECT_NE(r.out.find(row), std::string::npos) << row << "\n" << r.out;
  EXPECT_NE(r.out.find("predicted on CPU (built-in)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("steps 2-3 profiled"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" ms "), std::string::npos) << r.out;

  // --hardware predicts the same run again on another file; what was measured stays.
  const json h = check_json(run, "--hardware " TRIPOD_SOURCE_PATH "/configs/hardware/h100_sxm.toml");
  EXPECT_EQ(h["hardware"], "H100 SXM 80GB (DGX H100)");
  EXPECT_EQ(h["hardware_file"], TRIPOD_SOURCE_PATH "/configs/hardware/h100_sxm.toml");
  EXPECT_EQ(h["step"]["measured"], j["step"]["measured"]);
  EXPECT_LT(h["step"]["predicted"].get<double>(), j["step"]["predicted"].get<double>() / 10);
  // The file itself is read back by the same reader.
  const PlanCheck c = read_plan_check(run.string());
  EXPECT_EQ(c.measured.step, j["step"]["measured"].get<double>());

  // The report shows it: a Planner check panel with a row per family and the step.
  ASSERT_EQ(run_tripod("report " + run.string()).status, 0);
  const std::string page = test::slurp(run / "report.html");
  EXPECT_NE(page.find("<section class=\"panel\" id=\"plan-check\"><h2>Planner check</h2>"), std::string::npos);
  for (const char* row : {"<tr><td>gemm</td>", "<tr><td>pipeline idle</td>", "<tr><td><b>step</b></td>"})
    EXPECT_NE(page.find(row), std::string::npos) << row;
  EXPECT_NE(page.find("on CPU (built-in)"), std::string::npos);

  // Off by default: no profiling, no file, no panel.
  const fs::path plain = train("plain", "");
  EXPECT_FALSE(fs::exists(plain / "plan_check.json"));
  ASSERT_EQ(run_tripod("report " + plain.string()).status, 0);
  EXPECT_EQ(test::slurp(plain / "report.html").find("Planner check"), std::string::npos);
  // A run shorter than the profile times what it has after its first step.
  const fs::path shorter = train("shorter", "--set train.profile_steps=10");
  EXPECT_EQ(check_json(shorter)["steps"], json::array({2, 3, 4}));
}

TEST_F(PlanCheckCli, TensorParallelCollectivesAreCommunication) {
  // tp = 2: each rank's all-reduces inside its actions are its measured communication, as the
  // cost model predicts them; nothing idles in the prediction.
  const fs::path run = train("tp2", "--set parallel.tp=2 --profile-steps 2", 2);
  const json j = check_json(run);
  ASSERT_EQ(j["ranks"].size(), 2u);
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(r);
    const json& m = j["ranks"][r]["measured"];
    expect_adds_up(m, "rank");
    EXPECT_GT(m["communication"].get<double>(), 0);
  }
  EXPECT_GT(j["communication"]["predicted"].get<double>(), 0);
  EXPECT_EQ(j["pipeline_idle"]["predicted"].get<double>(), 0);
}

TEST_F(PlanCheckCli, WaitingForASlowerRankIsIdleNotCommunication) {
  // Ranks of a pipeline stage do the same work and meet in the same collectives: what a rank
  // spends in communication beyond the least of its stage's ranks is waiting for a slower one,
  // and counts as idle. tp = 2 x pp = 2: ranks 0, 1 (stage 0) and 2, 3 (stage 1).
  Config cfg = load_config(write_config({{"parallel.tp", "2"}, {"parallel.pp", "2"}, {"parallel.dp", "1"}}).string(), {},
                           {.training = true, .data = false});
  std::vector<StepBreakdown> ranks(4);
  const double comm[4] = {0.030, 0.010, 0.002, 0.005}, idle[4] = {0.001, 0.002, 0.020, 0.020};
  for (int r = 0; r < 4; ++r) {
    ranks[r].gemm = 0.5;
    ranks[r].communication = comm[r];
    ranks[r].pipeline_idle = idle[r];
    ranks[r].step = ranks[r].parts_sum();
  }
  const PlanCheck c = make_plan_check(cfg, build_schedule("1f1b", 2, 1, 4), default_hardware(Device::CPU), "", {2, 3},
                                      ranks);
  const double want_comm[4] = {0.010, 0.010, 0.002, 0.002}, want_idle[4] = {0.021, 0.002, 0.020, 0.023};
  for (int r = 0; r < 4; ++r) {
    SCOPED_TRACE(r);
    EXPECT_DOUBLE_EQ(c.measured_ranks[r].communication, want_comm[r]);
    EXPECT_DOUBLE_EQ(c.measured_ranks[r].pipeline_idle, want_idle[r]);
    EXPECT_DOUBLE_EQ(c.measured_ranks[r].step, ranks[r].step);  // still adds up
    EXPECT_NEAR(c.measured_ranks[r].parts_sum(), c.measured_ranks[r].step, 1e-15);
  }
  EXPECT_DOUBLE_EQ(c.measured.communication, 0.006);
}

TEST_F(PlanCheckCli, CalibrationOnTwoRanksTimesTheModelsMessages) {
  // `calibrate --model` under mpirun: every collective at the default sizes, the model's
  // activations and its gradient buckets (parallel.bucket_mb), for the ranks there are.
  const fs::path cfg = write_config({{"parallel.bucket_mb", "0.01"}});
  const fs::path out = dir_ / "hw.toml";
  const auto r = run_tripod("calibrate --out " + out.string() + " --model " + cfg.string() +
                                " --micro-batches 2 --repeats 1",
                            {.np = 2});
  ASSERT_EQ(r.status, 0) << r.err;
  const Hardware hw = load_hardware(out.string());
  const int64_t bucket = int64_t{10485} / 4 / 2 * 2 * 4;  // 0.01 MiB, whole f32 elements split over 2 ranks
  const int64_t activations = int64_t{2} * 16 * 32 * 4;  // a micro-batch of 2 x 16 tokens x 32
  for (int64_t bytes : {int64_t{4096}, activations, bucket, int64_t{16} << 20})
    for (Collective op : {Collective::AllReduce, Collective::AllGather, Collective::ReduceScatter, Collective::SendRecv}) {
      SCOPED_TRACE(fmt::format("{} {} bytes", static_cast<int>(op), bytes));
      const auto p = std::find_if(hw.collectives.begin(), hw.collectives.end(),
                                  [&](const CollectivePoint& c) { return c.op == op && c.bytes == bytes; });
      ASSERT_NE(p, hw.collectives.end());
      EXPECT_EQ(p->ranks, 2);
      EXPECT_GT(p->seconds, 0);
    }
}

TEST_F(PlanCheckCli, PipelineRanksWaitAndAreCheckedEach) {
  // Two pipeline stages (1F1B over 4 micro-batches): both ranks idle in the warm-up and drain,
  // measured and predicted; every rank's measured breakdown adds up to its step.
  const fs::path run = train("pp2", "--set parallel.pp=2 --profile-steps 2", 2);
  const json j = check_json(run);
  EXPECT_EQ(j["layout"]["pp"], 2);
  ASSERT_EQ(j["ranks"].size(), 2u);
  ASSERT_EQ(j["pipeline_ranks"].size(), 2u);
  for (int q = 0; q < 2; ++q) {
    SCOPED_TRACE(q);
    EXPECT_EQ(j["ranks"][q]["pp"], q);
    expect_adds_up(j["ranks"][q]["measured"], "rank");
    expect_adds_up(j["pipeline_ranks"][q]["predicted"], "predicted stage");
    EXPECT_GT(j["pipeline_ranks"][q]["measured"]["pipeline_idle"].get<double>(), 0);
    EXPECT_GT(j["pipeline_ranks"][q]["predicted"]["pipeline_idle"].get<double>(), 0);
    EXPECT_GT(j["pipeline_ranks"][q]["measured"]["gemm"].get<double>(), 0);
  }
  const auto r = run_tripod("plan --check " + run.string());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("mean over 2 ranks"), std::string::npos) << r.out;
}

TEST_F(PlanCheckCli, GpuBundleScriptSetsThePlannerBesideTheBenchmarks) {
  // The bundle's plan-check stage (bench/gpu/plan_check.py), here on CPU files: for each
  // tripod_gpu_bench result with the config it trained, the planner's step on the calibrated
  // and the datasheet file beside the measured one, the profiled run's `plan --check` table,
  // and a last line that sums it up; exit 1 when a calibrated prediction is off by more than
  // --tolerance.
  const fs::path cfg = write_config({});
  const fs::path hw = dir_ / "hw.toml";
  auto r = run_tripod("calibrate --out " + hw.string() + " --model " + cfg.string() + " --micro-batches 2 --repeats 1");
  ASSERT_EQ(r.status, 0) << r.err;
  const fs::path run = train("run", "--profile-steps 2 --set parallel.hardware=" + hw.string());
  const std::string config = test::slurp(run / "config.toml");
  const json bench = {{"models",
                       {{{"model", "124M"}, {"micro_batch", 2}, {"step_ms", 50.0}, {"config_toml", config},
                         {"families", {{"gemm", 0.5}, {"attention", 0.2}, {"layernorm", 0.1}, {"optimizer", 0.06}}}},
                        {{"model", "350M"}, {"micro_batch", 2}, {"step_ms", 50.0}, {"precision", "fp8"},
                         {"config_toml", config}},
                        {{"model", "1B"}, {"micro_batch", 2}, {"step_ms", 50.0}}}}};
  const fs::path results = dir_ / "bench.json";
  std::ofstream(results) << bench.dump();
  const std::string script = "python3 " TRIPOD_SOURCE_PATH "/bench/gpu/plan_check.py ";
  const fs::path written = dir_ / "plan_124M.toml";
  r = test::run_cmd(script + "--config-of 124M --out " + written.string() + " " + results.string());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(test::slurp(written), config);
  const std::string args = script + "--tripod " + test::tripod_bin() + " --hardware " + hw.string() +
                           " --base " TRIPOD_SOURCE_PATH "/configs/hardware/h100_sxm.toml --run " + run.string() + " " +
                           results.string() + " --tolerance ";
  r = test::run_cmd(args + "1000");
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("(fp8: the planner times bf16 GEMMs)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(no config in the result"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("plan check of " + run.string()), std::string::npos) << r.out;
  const std::string last = r.out.substr(r.out.rfind("calibrated planner vs measured step: "));
  EXPECT_NE(last.find("124M "), std::string::npos) << last;
  EXPECT_NE(last.find("profiled run "), std::string::npos) << last;
  // The 124M row: measured, then the calibrated and the datasheet prediction, each with its error.
  const size_t row = r.out.find("  124M ");
  ASSERT_NE(row, std::string::npos) << r.out;
  const std::string line = r.out.substr(row, r.out.find('\n', row) - row);
  EXPECT_EQ(std::count(line.begin(), line.end(), '%'), 2) << line;
  // The bench's op families beside the calibrated prediction's: gemm 25 ms, attention 10 ms, the
  // other families' 8 ms, each listed; only the 124M result has them.
  const size_t fam = r.out.find("  124M ", r.out.find("by family"));
  ASSERT_NE(fam, std::string::npos) << r.out;
  const std::string split = r.out.substr(fam, r.out.find('\n', fam) - fam);
  for (const char* want : {"/  25.0", "/  10.0", "/   8.0", "layernorm 5.0, optimizer 3.0"})
    EXPECT_NE(split.find(want), std::string::npos) << want << " in " << split;
  EXPECT_EQ(r.out.find("  1B ", r.out.find("by family")), std::string::npos) << r.out;
  EXPECT_EQ(test::run_cmd(args + "0").status, 1);  // no prediction is exact
}

}  // namespace
}  // namespace tripod
