// TensorBoard event files and straggler detection, end to end: a run's event files read back by an
// independent reader (tests/e2e/tfevents_reader.js: the npm packages @roboflow/tfrecords and
// protobufjs) hold every scalar of metrics.jsonl, across a SIGTERM and a resume; a rank slowed
// down on purpose is named as a straggler in the log, metrics.jsonl and the report.
#include <fmt/format.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <thread>

#include "e2e/e2e_test.h"
#include "train/run_files.h"

namespace tripod {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::run_tripod;
using test::slurp;

// The npm reader's packages, installed once into the build folder. "" when ready, else why not.
std::string npm_reader_unavailable(fs::path& node_modules) {
  static std::string why = "?";
  const fs::path prefix = fs::path(test::tripod_bin()).parent_path().parent_path() / "npm_test_readers";
  node_modules = prefix / "node_modules";
  if (why != "?") return why;
  if (test::run_cmd("node --version").status != 0) return why = "node is not installed";
  if (fs::exists(node_modules / "@roboflow/tfrecords/src/tensorFlowHelpers.js") &&
      fs::exists(node_modules / "protobufjs/package.json"))
    return why = "";
  fs::create_directories(prefix);
  const auto r = test::run_cmd("npm install --prefix " + test::shell_quote(prefix.string()) +
                                   " --no-audit --no-fund --no-save @roboflow/tfrecords@1.0.4 protobufjs@7",
                               240);
  if (r.status != 0 || !fs::exists(node_modules / "@roboflow/tfrecords/src/tensorFlowHelpers.js"))
    return why = "npm could not install @roboflow/tfrecords and protobufjs (registry unreachable?): " +
                 r.err.substr(0, 300);
  return why = "";
}

// One file's events as the reader decoded them.
struct TbEvent {
  int64_t step = 0;
  double wall_time = 0;
  std::string file_version;
  std::vector<std::pair<std::string, double>> values;  // NaN where the file holds NaN
};
struct TbFile {
  std::string name;
  std::vector<TbEvent> events;
};

std::vector<TbFile> read_events(const fs::path& dir, const fs::path& node_modules) {
  const auto r = test::run_cmd("NODE_PATH=" + test::shell_quote(node_modules.string()) + " node " +
                               test::shell_quote(std::string(TRIPOD_SOURCE_PATH) + "/tests/e2e/tfevents_reader.js") +
                               " " + test::shell_quote(dir.string()));
  EXPECT_EQ(r.status, 0) << r.err;
  if (r.status != 0) return {};
  std::vector<TbFile> out;
  const json doc = json::parse(r.out);
  for (const json& f : doc.at("files")) {
    TbFile file{f["name"].get<std::string>(), {}};
    for (const json& e : f["events"]) {
      TbEvent ev{e["step"].get<int64_t>(), e["wall_time"].get<double>(), e.value("file_version", ""), {}};
      if (e.contains("values"))
        for (const json& v : e["values"])
          ev.values.push_back({v[0].get<std::string>(),
                               v[1].is_null() ? std::numeric_limits<double>::quiet_NaN() : v[1].get<double>()});
      file.events.push_back(std::move(ev));
    }
    out.push_back(std::move(file));
  }
  return out;
}

using ScalarKey = std::pair<std::string, int64_t>;  // (tag, step)

// What TensorBoard shows: every (tag, step) of the files in name order, a later file's value
// replacing an earlier one's (TensorBoard drops a tag's events from a step that comes again).
std::map<ScalarKey, double> scalars_of(const std::vector<TbFile>& files) {
  std::map<ScalarKey, double> out;
  for (const TbFile& f : files)
    for (const TbEvent& e : f.events)
      for (const auto& [tag, v] : e.values) out[{tag, e.step}] = v;
  return out;
}

double number(const json& j) { return j.is_null() ? std::numeric_limits<double>::quiet_NaN() : j.get<double>(); }

// The scalars metrics.jsonl implies (a later record of a step replacing an earlier one), each at
// its step and as "<tag> vs samples" at the consumed samples.
std::map<ScalarKey, double> expected_scalars(const fs::path& run_dir) {
  std::map<ScalarKey, double> out;
  auto put = [&](const std::string& tag, int64_t step, int64_t samples, double v) {
    out[{tag, step}] = v;
    out[{tag + " vs samples", samples}] = v;
  };
  for (const json& j : test::metrics(run_dir)) {
    const int64_t step = j.at("step").get<int64_t>(), samples = j.at("consumed_samples").get<int64_t>();
    if (j.value("eval", false)) {
      put("lm loss validation", step, samples, number(j["loss"]));
      put("lm loss validation ppl", step, samples, number(j["perplexity"]));
      continue;
    }
    put("lm loss", step, samples, number(j["loss"]));
    put("learning-rate", step, samples, number(j["lr"]));
    put("grad-norm", step, samples, number(j["grad_norm"]));
    put("batch-size", step, samples, number(j["batch_size"]));
    put("iteration-time", step, samples, number(j["step_time_s"]));
    put("throughput", step, samples, number(j["tokens_per_s"]));
    put("tflops", step, samples, number(j["tflops"]));
    put("mfu", step, samples, number(j["mfu"]));
    put("skipped-iterations", step, samples, number(j["skipped_total"]));
    for (const auto& [cat, bytes] : j.at("mem_peak_bytes").items()) put("mem-peak-bytes/" + cat, step, samples, number(bytes));
  }
  return out;
}

// The values are written as 32-bit floats: equal means equal to the float of the JSON's double.
bool same(double tb, double jsonl) {
  if (std::isnan(jsonl)) return std::isnan(tb);
  return tb == static_cast<double>(static_cast<float>(jsonl));
}

void expect_same_scalars(const std::map<ScalarKey, double>& tb, const std::map<ScalarKey, double>& want) {
  for (const auto& [key, v] : want) {
    auto it = tb.find(key);
    if (it == tb.end()) {
      ADD_FAILURE() << "TensorBoard lacks " << key.first << " at step " << key.second;
      continue;
    }
    EXPECT_TRUE(same(it->second, v)) << key.first << " at step " << key.second << ": TensorBoard " << it->second
                                     << ", metrics.jsonl " << v;
  }
  for (const auto& [key, v] : tb)
    EXPECT_TRUE(want.count(key)) << "TensorBoard has " << key.first << " at step " << key.second
                                 << ", which metrics.jsonl does not";
}

std::vector<pid_t> children(pid_t parent) {
  std::vector<pid_t> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string n = e.path().filename().string();
    if (n.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string s = slurp(e.path() / "stat");
    const auto rp = s.rfind(')');
    if (rp == std::string::npos) continue;
    std::istringstream rest(s.substr(rp + 2));
    char state;
    pid_t ppid;
    rest >> state >> ppid;
    if (ppid == parent) out.push_back(std::stoi(n));
  }
  return out;
}

bool wait_for(const std::function<bool()>& cond, double seconds) {
  const auto t0 = std::chrono::steady_clock::now();
  while (!cond()) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > seconds) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return true;
}

class TensorBoard : public test::E2eTest {};

TEST_F(TensorBoard, EveryScalarMatchesMetricsAcrossSigtermAndResume) {
  fs::path node_modules;
  if (const std::string why = npm_reader_unavailable(node_modules); !why.empty()) GTEST_SKIP() << why;
  // Two DP ranks, a log record every 2 steps, an evaluation every 10, and a step whose loss is
  // NaN (logged off the interval, skipped): every kind of record the files must mirror.
  const fs::path cfg = write_config({{"train.steps", "400"}, {"train.log_interval", "2"}, {"train.eval_interval", "10"},
                                     {"train.eval_steps", "1"}, {"train.trace", "false"}});
  const fs::path run = dir_ / "run", tb = dir_ / "tb";
  const std::string args = "train --config " + cfg.string() + " --set train.output_dir=" + run.string() +
                           " --set train.tensorboard_dir=" + tb.string() + " --set checkpoint.dir=" +
                           (dir_ / "ck").string();
  const test::RunOptions opt{.np = 2, .env = "TRIPOD_INJECT_NAN=loss@3"};
  {
    test::Background job(test::tripod_cmd(args, opt), dir_ / "log");
    const auto lines = [&] {  // complete records so far
      const std::string text = slurp(run / "metrics.jsonl");
      return std::count(text.begin(), text.end(), '\n');
    };
    ASSERT_TRUE(wait_for([&] { return lines() >= 8; }, 120)) << slurp(dir_ / "log");
    for (pid_t rank : children(job.pid())) kill(rank, SIGTERM);
    ASSERT_EQ(job.wait(300), 0) << slurp(dir_ / "log");
  }
  // The step the run stopped after (not necessarily a logged one): its checkpoint's.
  const std::string latest = slurp(dir_ / "ck" / "latest");
  ASSERT_EQ(latest.rfind("iter_", 0), 0u) << latest;
  const int64_t stopped = std::stoll(latest.substr(5));
  ASSERT_LT(stopped, 400) << "the run ended before the signal";

  // What the killed run logged is in its file, checksums and all.
  auto files = read_events(tb, node_modules);
  ASSERT_EQ(files.size(), 1u);
  expect_same_scalars(scalars_of(files), expected_scalars(run));

  auto r = run_tripod(args + " --set checkpoint.load=latest", opt);
  ASSERT_EQ(r.status, 0) << r.err;
  files = read_events(tb, node_modules);
  ASSERT_EQ(files.size(), 2u) << "a resumed run writes a new file";
  for (const TbFile& f : files) {
    SCOPED_TRACE(f.name);
    EXPECT_EQ(f.name.rfind("events.out.tfevents.", 0), 0u);
    ASSERT_FALSE(f.events.empty());
    EXPECT_EQ(f.events[0].file_version, "brain.Event:2");
    EXPECT_TRUE(f.events[0].values.empty());
    for (size_t i = 1; i < f.events.size(); ++i) {
      EXPECT_EQ(f.events[i].file_version, "");
      EXPECT_FALSE(f.events[i].values.empty());
      EXPECT_GE(f.events[i].wall_time, f.events[i - 1].wall_time);
    }
  }
  // The second file continues the steps: its first logged step follows the stop.
  int64_t first_resumed = -1;
  for (const TbEvent& e : files[1].events)
    for (const auto& [tag, v] : e.values)
      if (tag == "lm loss" && first_resumed < 0) first_resumed = e.step;
  EXPECT_EQ(first_resumed, stopped + 2 - stopped % 2) << "the first step logged after resuming from " << stopped;
  for (const TbEvent& e : files[0].events)
    for (const auto& [tag, v] : e.values)
      if (tag == "lm loss") {
        EXPECT_LE(e.step, stopped);
      }

  const auto tb_scalars = scalars_of(files);
  expect_same_scalars(tb_scalars, expected_scalars(run));
  // The NaN step and the evaluations made it through.
  EXPECT_TRUE(std::isnan(tb_scalars.at({"lm loss", 3})));
  EXPECT_EQ(tb_scalars.at({"skipped-iterations", 400}), 1.0);
  EXPECT_EQ(tb_scalars.at({"batch-size", 400}), 8.0);
  EXPECT_TRUE(tb_scalars.count({"lm loss validation", 400}));
  EXPECT_TRUE(tb_scalars.count({"lm loss validation ppl vs samples", 400 * 8}));
  EXPECT_TRUE(tb_scalars.count({"mem-peak-bytes/total", 400}));

  // And the report reads the same numbers from metrics.jsonl.
  const RunMetrics m = read_metrics((run / "metrics.jsonl").string());
  ASSERT_EQ(m.train.size(), 200u + 1u);  // every other step, and the skipped step 3
  for (const StepRecord& t : m.train) {
    SCOPED_TRACE(t.step);
    EXPECT_TRUE(same(tb_scalars.at({"lm loss", t.step}), t.loss));
    EXPECT_TRUE(same(tb_scalars.at({"learning-rate", t.step}), t.lr));
    EXPECT_TRUE(same(tb_scalars.at({"grad-norm", t.step}), t.grad_norm));
    EXPECT_TRUE(same(tb_scalars.at({"throughput", t.step}), t.tokens_per_s));
    EXPECT_TRUE(same(tb_scalars.at({"mfu", t.step}), t.mfu));
    EXPECT_TRUE(same(tb_scalars.at({"iteration-time", t.step}), t.step_time_s));
  }
  ASSERT_EQ(m.eval.size(), 40u);
  for (const EvalRecord& e : m.eval) EXPECT_TRUE(same(tb_scalars.at({"lm loss validation", e.step}), e.loss));
}

TEST_F(TensorBoard, OffByDefaultAndAnUnwritableFolderIsRefused) {
  const fs::path cfg = write_config();
  auto r = run_tripod("train --config " + cfg.string() + " --set train.output_dir=" + (dir_ / "run").string());
  ASSERT_EQ(r.status, 0) << r.err;
  for (const auto& e : fs::recursive_directory_iterator(dir_))
    EXPECT_EQ(e.path().filename().string().find("tfevents"), std::string::npos) << e.path();

  test::write_file(dir_ / "file", "x");
  r = run_tripod("train --config " + cfg.string() + " --set train.output_dir=" + (dir_ / "run2").string() +
                 " --set train.tensorboard_dir=" + (dir_ / "file" / "tb").string());
  test::expect_refused(r, "train.tensorboard_dir");
  EXPECT_EQ(slurp(dir_ / "file"), "x");
}

TEST_F(TensorBoard, StragglerFactorOutOfRangeIsRefused) {
  const fs::path cfg = write_config();
  for (const char* v : {"1", "0.5", "-2"})
    test::expect_refused(run_tripod("train --config " + cfg.string() + " --set train.straggler_factor=" + v),
                         "train.straggler_factor");
  test::expect_refused(run_tripod("train --config " + cfg.string(), {.env = "TRIPOD_SLOW_RANK=1:x"}),
                       "TRIPOD_SLOW_RANK");
  test::expect_refused(run_tripod("train --config " + cfg.string() + " --set train.output_dir=" + (dir_ / "r").string(),
                                  {.env = "TRIPOD_SLOW_RANK=3:2"}),
                       "TRIPOD_SLOW_RANK");
}

// Four DP ranks, world rank 2 computing at half speed: after three log intervals over the bar it
// is named, and stays named; the report shows it.
TEST_F(TensorBoard, ARankSlowedTwofoldIsNamedAsStraggler) {
  const fs::path cfg = write_config({{"model.d_model", "64"}, {"model.seq_len", "32"}, {"train.steps", "60"},
                                     {"train.log_interval", "3"}, {"train.trace", "false"}});
  const fs::path run = dir_ / "run";
  // Four ranks share this machine's cores: waiting ranks yield instead of spinning, so that they
  // do not eat into the others' compute time.
  auto r = run_tripod("train --config " + cfg.string() + " --set train.output_dir=" + run.string(),
                      {.np = 4, .env = "TRIPOD_SLOW_RANK=2:2 OMPI_MCA_mpi_yield_when_idle=1"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("straggler: rank 2 computes"), std::string::npos) << r.err;
  int named = 0;
  std::string ratios;  // per interval: the slowest rank and its compute over the median
  for (const json& j : test::metrics(run)) {
    if (j.value("eval", false)) continue;
    ASSERT_TRUE(j.contains("stragglers")) << j.dump();  // every record falls on a log interval here
    ASSERT_TRUE(j.contains("rank_compute_s")) << j.dump();
    const json& c = j["rank_compute_s"];
    ratios += fmt::format(" {}:{:.2f}", c["max_rank"].get<int>(), c["max"].get<double>() / c["median"].get<double>());
    for (const json& s : j["stragglers"]) {
      if (s["rank"] != 2) continue;
      ++named;
      EXPECT_GE(s["intervals"].get<int>(), 3);
      EXPECT_GT(s["ratio"].get<double>(), 1.3);
    }
  }
  EXPECT_GE(named, 1) << "slowest rank:ratio per interval:" << ratios;
  r = run_tripod("report " + run.string());
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string html = slurp(run / "report.html");
  EXPECT_NE(html.find("id=\"stragglers\""), std::string::npos);
  EXPECT_NE(html.find("<td>rank 2</td>"), std::string::npos);
}

// pp = 2, dp = 2 with a head 64x the width of the model: the last stage (ranks 2 and 3) computes
// well over 1.3x the first, and is not a straggler; rank 1, slowed twofold, is compared with rank 0
// (its stage's other rank) and alone is named.
TEST_F(TensorBoard, InAPipelineOnlyTheSlowedRankIsNamedNotTheHeavierStage) {
  const fs::path cfg = write_config({{"model.d_model", "64"}, {"model.seq_len", "32"}, {"model.vocab_size", "4096"},
                                     {"parallel.pp", "2"}, {"train.steps", "60"}, {"train.log_interval", "3"},
                                     {"train.trace", "false"}});
  const fs::path run = dir_ / "run";
  auto r = run_tripod("train --config " + cfg.string() + " --set train.output_dir=" + run.string(),
                      {.np = 4, .env = "TRIPOD_SLOW_RANK=1:2 OMPI_MCA_mpi_yield_when_idle=1"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("straggler: rank 1 computes"), std::string::npos) << r.err;
  int named = 0, heavier = 0, intervals = 0;
  for (const json& j : test::metrics(run)) {
    if (j.value("eval", false)) continue;
    for (const json& s : j["stragglers"]) {
      EXPECT_EQ(s["rank"], 1) << j.dump();
      named += s["rank"] == 1;
    }
    // The premise: the head's stage out-computes even the slowed rank (a comparison with every
    // rank would have named ranks 2 and 3, not rank 1).
    ++intervals;
    heavier += j["rank_compute_s"]["max_rank"].get<int>() >= 2;
  }
  EXPECT_GE(named, 1);
  EXPECT_GT(heavier, intervals / 2) << heavier << " of " << intervals << " intervals";
}

// The quick start's grid, (dp, pp, tp) = (2, 2, 2) with interleaved stages, on synthetic data: the
// pipeline's stages differ in work, the ranks of each stage do not, and nobody is named.
TEST_F(TensorBoard, TheQuickStartGridNamesNoStraggler) {
  const fs::path run = dir_ / "run";
  const std::string sets = " --set data.synthetic=true --set data.prefixes=[] --set data.tokenizer='' --set "
                           "train.steps=12 --set train.log_interval=3 --set train.eval_interval=0 --set "
                           "checkpoint.dir='' --set checkpoint.interval=0 --set train.tensorboard_dir='' --set train.output_dir=" + run.string();
  auto r = run_tripod(std::string("train --config ") + TRIPOD_SOURCE_PATH + "/configs/quickstart.toml" + sets,
                      {.np = 8, .env = "OMPI_MCA_mpi_yield_when_idle=1"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err.find("straggler:"), std::string::npos) << r.err;
  int intervals = 0;
  for (const json& j : test::metrics(run)) {
    if (j.value("eval", false)) continue;
    ++intervals;
    EXPECT_TRUE(j["stragglers"].empty()) << j.dump();
  }
  EXPECT_EQ(intervals, 4);  // a straggler is named after 3
}

}  // namespace
}  // namespace tripod
