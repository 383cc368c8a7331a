// `tripod report` end to end: a real two-rank pipeline run becomes one self-contained HTML page
// with its curves, memory bars and timeline; missing pieces are stated on the page; bad inputs
// fail with one "error:" line; and, where Debian's chromium is installed, the page renders.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <regex>
#include <set>

#include "e2e_test.h"
#include "report/report.h"
#include "train/run_files.h"

namespace tripod {
namespace {

using test::slurp;

namespace fs = std::filesystem;
using test::run_cmd;
using test::run_tripod;

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + 1)) ++n;
  return n;
}

// Every src=, href=, url( and @import of the page: none may leave the file.
void expect_self_contained(const std::string& html) {
  std::regex ref(R"re((?:src|href|xlink:href)\s*=\s*["']?([^"'\s>]*)|url\(\s*["']?([^)"']*)|@import)re",
                 std::regex::icase);
  for (auto it = std::sregex_iterator(html.begin(), html.end(), ref); it != std::sregex_iterator(); ++it) {
    const std::string target = (*it)[1].matched ? (*it)[1].str() : (*it)[2].str();
    EXPECT_EQ(target.find("//"), std::string::npos) << "external reference: " << it->str();
    EXPECT_NE(it->str().rfind("@import", 0), 0u) << "an @import";
  }
  EXPECT_EQ(html.find("http://"), std::string::npos);
  EXPECT_EQ(html.find("https://"), std::string::npos);
}

// The page's embedded chart data (the JSON in <script id="report-data">).
nlohmann::json chart_data(const std::string& html) {
  const std::string open = "<script type=\"application/json\" id=\"report-data\">";
  auto a = html.find(open);
  EXPECT_NE(a, std::string::npos);
  if (a == std::string::npos) return {};
  a += open.size();
  auto b = html.find("</script>", a);
  std::string text = html.substr(a, b - a);
  for (size_t p = text.find("<\\/"); p != std::string::npos; p = text.find("<\\/", p)) text.replace(p, 3, "</");
  return nlohmann::json::parse(text);
}

class Report : public test::E2eTest {};

// One tiny pp=2 training under mpirun, shared by the tests that read its run directory.
class ReportOfRun : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(test::scratch_dir("report_run"));
    test::write_file(*dir_ / "c.toml", test::tiny_config({{"parallel.pp", "2"}, {"train.steps", "4"}}));
    auto r = run_tripod(
        "train --config " + (*dir_ / "c.toml").string() + " --set train.output_dir=" + (*dir_ / "run").string(),
        {.np = 2});
    train_status_ = r.status;
    train_err_ = r.err;
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
  }
  void SetUp() override { ASSERT_EQ(train_status_, 0) << train_err_; }
  static fs::path run() { return *dir_ / "run"; }

  static fs::path* dir_;
  static int train_status_;
  static std::string train_err_;
};
fs::path* ReportOfRun::dir_ = nullptr;
int ReportOfRun::train_status_ = -1;
std::string ReportOfRun::train_err_;

TEST_F(ReportOfRun, PageHoldsCurvesMemoryTimelineAndConfig) {
  std::set<std::string> files_before;
  for (const auto& e : fs::directory_iterator(run())) files_before.insert(e.path().filename().string());

  auto r = run_tripod("report " + run().string());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("wrote " + (run() / "report.html").string()), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("4 logged step(s)"), std::string::npos) << r.out;
  const std::string html = slurp(run() / "report.html");
  expect_self_contained(html);

  // The report writes its page and nothing else into the run directory.
  std::set<std::string> files_after;
  for (const auto& e : fs::directory_iterator(run())) files_after.insert(e.path().filename().string());
  files_before.insert("report.html");
  EXPECT_EQ(files_after, files_before);

  // Header: the grid and the model of the resolved config.
  EXPECT_NE(html.find("<div class=\"v\">dp 1 \u00d7 pp 2 \u00d7 tp 1</div><div class=\"d\">2 ranks; vp 1, 1f1b schedule"),
            std::string::npos);
  EXPECT_NE(html.find("2 layers, d_model 32, 4 heads, seq 16, vocab 64"), std::string::npos);
  EXPECT_NE(html.find("step 4 / 4"), std::string::npos);

  // Curves: one path per series, and the data behind them equal to metrics.jsonl's.
  for (const char* id : {"loss", "throughput", "mfu", "lr", "grad_norm", "straggler_ratio"})
    EXPECT_NE(html.find(fmt::format("<svg class=\"chart\" data-chart=\"{}\"", id)), std::string::npos) << id;
  EXPECT_NE(html.find("<path class=\"series\" data-series=\"train\" d=\"M"), std::string::npos);
  EXPECT_NE(html.find("<path class=\"series\" data-series=\"tokens/s\" d=\"M"), std::string::npos);
  EXPECT_NE(html.find("<path class=\"series\" data-series=\"MFU\" d=\"M"), std::string::npos);
  auto data = chart_data(html);
  std::vector<double> losses, tps;
  for (const auto& j : test::metrics(run())) {
    losses.push_back(j.at("loss").get<double>());
    tps.push_back(j.at("tokens_per_s").get<double>());
  }
  ASSERT_EQ(losses.size(), 4u);
  const auto& loss_series = data["charts"]["loss"]["series"][0];
  ASSERT_EQ(loss_series["y"].size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(loss_series["x"][i].get<int>(), static_cast<int>(i) + 1);
    EXPECT_NEAR(loss_series["y"][i].get<double>(), losses[i], 1e-5 * losses[i]);
    EXPECT_NEAR(data["charts"]["throughput"]["series"][0]["y"][i].get<double>(), tps[i], 1e-5 * tps[i]);
  }
  EXPECT_NE(html.find(fmt::format("<div class=\"v\">{:.4f}</div>", losses.back())), std::string::npos);

  // Memory: a bar per category, rank 0's figures.
  for (const char* cat : {"params", "grads", "optimizer", "activations", "workspace", "comm", "total"})
    EXPECT_NE(html.find(fmt::format("<rect class=\"bar\" data-category=\"{}\"", cat)), std::string::npos) << cat;

  // Timeline: the merged trace's chart with a row per rank, and measured vs ideal idle.
  EXPECT_NE(html.find("<div class=\"trace-svg\"><svg"), std::string::npos);
  EXPECT_NE(html.find("rank 0 (pp 0)"), std::string::npos);
  EXPECT_NE(html.find("rank 1 (pp 1)"), std::string::npos);
  EXPECT_EQ(count(html, "<td class=\"idle\"><span class=\"ib\">"), 4u);  // 2 ranks x (measured, ideal)
  EXPECT_NE(html.find("1f1b schedule, pp=2 vp=1, 4 micro-batches per pipeline"), std::string::npos);
  EXPECT_EQ(html.find("class=\"note\""), std::string::npos) << "nothing is missing from this run";
}

// A cp = 2 training (2 ranks, ring attention): the report's grid, timeline rows and per-rank
// table name the cp coordinate, and the trace holds the ring's exchanges inside the compute.
TEST_F(Report, ContextParallelRunShowsTheAxisAndTheRingExchanges) {
  test::write_file(dir_ / "c.toml", test::tiny_config({{"parallel.cp", "2"}, {"train.steps", "2"}}));
  auto r = run_tripod("train --config " + (dir_ / "c.toml").string() + " --set train.output_dir=" +
                          (dir_ / "run").string(),
                      {.np = 2});
  ASSERT_EQ(r.status, 0) << r.err;
  r = run_tripod("report " + (dir_ / "run").string());
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string html = slurp(dir_ / "run" / "report.html");
  EXPECT_NE(html.find("<div class=\"v\">dp 1 \u00d7 pp 1 \u00d7 cp 2 \u00d7 tp 1</div>"), std::string::npos);
  EXPECT_NE(html.find("rank 0 (pp 0, cp 0)"), std::string::npos);
  EXPECT_NE(html.find("rank 1 (pp 0, cp 1)"), std::string::npos);
  EXPECT_NE(html.find("<th>dp</th><th>cp</th><th>tp</th>"), std::string::npos);
  EXPECT_NE(html.find("<tr><td>1</td><td>0</td><td>0</td><td>1</td><td>0</td>"), std::string::npos)
      << "rank 1: pp 0, dp 0, cp 1, tp 0";
  EXPECT_EQ(count(html, "<td class=\"cp-exchange\">"), 2u);
  EXPECT_NE(html.find("cp K/V exchange</span>"), std::string::npos);

  r = run_tripod("trace merge " + (dir_ / "run").string());
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(slurp(dir_ / "run" / "trace.json"));
  std::set<std::string> processes;
  std::map<int, std::vector<std::pair<double, double>>> compute;  // pid -> [ts, ts + dur)
  std::vector<nlohmann::json> exchanges;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name") processes.insert(e["args"]["name"].get<std::string>());
    if (e["ph"] != "X") continue;
    const std::string cat = e["cat"];
    if (cat == "forward" || cat == "backward")
      compute[e["pid"].get<int>()].push_back({e["ts"].get<double>(), e["ts"].get<double>() + e["dur"].get<double>()});
    if (cat == "cp") exchanges.push_back(e);
  }
  EXPECT_EQ(processes, (std::set<std::string>{"rank 0 (pp 0, dp 0, cp 0, tp 0)", "rank 1 (pp 0, dp 0, cp 1, tp 0)"}));
  // Per rank and step: 4 micro-batches x 2 layers, each with the forward's and the backward's
  // exchanges (at cp = 2: the K/V hop posted, then waited for; backward also the gradient sums'
  // hop, posted with the waits).
  std::map<std::string, int> by_name;
  for (const auto& e : exchanges) {
    ++by_name[e["name"].get<std::string>()];
    const double a = e["ts"].get<double>(), b = a + e["dur"].get<double>();
    const auto& spans = compute[e["pid"].get<int>()];
    EXPECT_TRUE(std::any_of(spans.begin(), spans.end(), [&](const auto& s) { return s.first <= a && b <= s.second; }))
        << "an exchange outside every forward and backward: " << e;
  }
  EXPECT_EQ(by_name, (std::map<std::string, int>{{"cp ring send/recv K/V", 2 * 2 * 4 * 2 * 2},
                                                 {"cp ring send/recv K/V, dK/dV", 2 * 2 * 4 * 2 * 3}}));
}

TEST_F(ReportOfRun, OutWritesElsewhereAndMatchesTheLibrary) {
  auto out = run().parent_path() / "page.html";
  auto r = run_tripod("report " + run().string() + " --out " + out.string());
  ASSERT_EQ(r.status, 0) << r.err;
  ASSERT_TRUE(fs::exists(out));
  ReportInfo info;
  std::string html = render_report(run().string(), &info);
  EXPECT_EQ(info.train_steps, 4);
  EXPECT_TRUE(info.has_trace && info.has_config && info.has_metrics);
  EXPECT_TRUE(info.notes.empty());
  // Equal but for the time it was generated.
  auto strip_time = [](std::string s) { return std::regex_replace(s, std::regex("generated [^&]*&middot;"), ""); };
  EXPECT_EQ(strip_time(slurp(out)), strip_time(html));
}

TEST_F(Report, ValidationRecordsGiveASecondCurveAndLaterRecordsWin) {
  std::string metrics;
  // Steps 1..40, then a resumed session logging steps 31..40 again with other losses.
  for (int s = 1; s <= 40; ++s)
    metrics += fmt::format(R"({{"step":{},"loss":{},"lr":1e-3,"grad_norm":1.5,"step_time_s":0.1,"tokens_per_s":1000,)"
                           R"("mfu":0.01,"consumed_samples":{},"skipped":false,"skipped_total":0}})"
                           "\n",
                           s, 5.0 - 0.05 * s, 8 * s);
  for (int s = 10; s <= 40; s += 10)
    metrics += fmt::format(R"({{"eval":true,"split":"valid","step":{},"loss":{},"perplexity":{}}})"
                           "\n",
                           s, 4.9 - 0.05 * s, std::exp(4.9 - 0.05 * s));
  for (int s = 31; s <= 40; ++s)
    metrics += fmt::format(R"({{"step":{},"loss":{},"lr":1e-3,"grad_norm":null,"step_time_s":0.1,)"
                           R"("tokens_per_s":1000,"mfu":0.01,"skipped":{}}})"
                           "\n",
                           s, s == 35 ? "null" : "1.25", s == 35 ? "true" : "false");
  test::write_file(dir_ / "metrics.jsonl", metrics);
  auto r = run_tripod("report " + dir_.string());
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string html = slurp(dir_ / "report.html");
  expect_self_contained(html);
  auto data = chart_data(html);
  const auto& series = data["charts"]["loss"]["series"];
  ASSERT_EQ(series.size(), 3u);  // train, train (smoothed), validation
  EXPECT_EQ(series[0]["n"], "train");
  EXPECT_EQ(series[1]["n"], "train (smoothed)");
  EXPECT_EQ(series[2]["n"], "validation");
  ASSERT_EQ(series[0]["x"].size(), 40u);
  EXPECT_EQ(series[0]["y"][30].get<double>(), 1.25);  // step 31, from the later session
  EXPECT_TRUE(series[0]["y"][34].is_null());           // step 35: skipped, non-finite
  EXPECT_EQ(series[2]["x"], nlohmann::json({10, 20, 30, 40}));
  EXPECT_NEAR(series[2]["y"][3].get<double>(), 2.9, 1e-9);
  EXPECT_NE(html.find("<path class=\"series\" data-series=\"validation\" d=\"M"), std::string::npos);
  EXPECT_NE(html.find("update skipped"), std::string::npos);
  EXPECT_NE(html.find("Validation loss"), std::string::npos);
  EXPECT_NE(html.find("10 record(s) replaced by a later record of the same step"), std::string::npos);
  // No config, no trace, no memory figures: said on the page.
  EXPECT_NE(html.find("No configuration: "), std::string::npos);
  EXPECT_NE(html.find("No pipeline timeline: "), std::string::npos);
  EXPECT_NE(html.find("No memory figures"), std::string::npos);
}

// FP8 runs' records (train.precision = "fp8"): each layer's scales over the steps (log2 of the
// smallest of its linears', per operand) and the clipped values per linear.
TEST_F(Report, Fp8RecordsGiveScaleChartsAndTheClippedCounts) {
  std::string metrics;
  for (int s = 1; s <= 4; ++s)
    metrics += fmt::format(
        R"({{"step":{},"loss":3,"lr":1e-3,"grad_norm":1,"step_time_s":0.1,"tokens_per_s":1000,"mfu":0.01,"fp8":{{)"
        R"("h.0.attn.qkv":{{"scale":[64,4096,{}],"amax":[7,0.1,1e-6,2],"saturated":[0,0,{}]}},)"
        R"("h.0.mlp.fc":{{"scale":[32,8192,1e9],"amax":[14,0.05,5e-5,3],"saturated":[1,0,0]}},)"
        R"("h.1.attn.qkv":{{"scale":[128,2048,1e8],"amax":[3.5,0.2,5e-4,1],"saturated":[0,0,0]}}}}}})"
        "\n",
        s, 1 << (20 + s), s == 4 ? 5 : 0);
  test::write_file(dir_ / "metrics.jsonl", metrics);
  auto r = run_tripod("report " + dir_.string());
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string html = slurp(dir_ / "report.html");
  auto data = chart_data(html);
  const auto& x = data["charts"]["fp8_scale_0"]["series"];
  ASSERT_EQ(x.size(), 2u);  // layers 0 and 1
  EXPECT_EQ(x[0]["n"], "layer 0");
  EXPECT_EQ(x[0]["y"][0].get<double>(), 5.0);  // log2 of min(64, 32)
  EXPECT_EQ(x[1]["y"][0].get<double>(), 7.0);
  const auto& dy = data["charts"]["fp8_scale_2"]["series"];
  EXPECT_EQ(dy[0]["y"][3].get<double>(), 24.0);  // 2^24 < 1e9
  EXPECT_NE(html.find("values clipped to the largest FP8 value: 9 over the logged steps"), std::string::npos);
  // A malformed record is refused with its line.
  test::write_file(dir_ / "metrics.jsonl", "{\"step\":1,\"loss\":1,\"fp8\":{\"h.0.attn.qkv\":{\"scale\":[1]}}}\n");
  test::expect_refused(run_tripod("report " + dir_.string()),
                       "metrics.jsonl:1: fp8 h.0.attn.qkv: \"scale\" must be a list of 3 numbers");
}

// A mixture of experts' run: a heat map of expert load per MoE layer over the steps, each cell the
// expert's share over the mean share (blue below 1, white at 1, red above); 300 steps binned into
// 240 columns; a dense run's page has no such panel.
TEST_F(Report, ExpertLoadHeatMapPerMoeLayer) {
  std::string metrics;
  for (int s = 1; s <= 300; ++s)  // layer 1: expert 0 takes half of 8 pairs at first, balanced from step 200
    metrics += fmt::format(R"({{"step":{},"loss":3.0,"lr":1e-3,"grad_norm":1.0,"step_time_s":0.1,"tokens_per_s":1000,)"
                           R"("mfu":0.01,"moe":{{"layers":[1,2],"tokens_per_expert":[{},[2,2,2,2]],)"
                           R"("dropped_tokens":[1,0],"load_balancing_loss":[2.1,2.0],"z_loss":[0.1,0.1],)"
                           R"("max_over_mean_load":[2.0,1.0]}}}})"
                           "\n",
                           s, s < 200 ? "[4,2,1,1]" : "[2,2,2,2]");
  test::write_file(dir_ / "metrics.jsonl", metrics);
  auto r = run_tripod("report " + dir_.string());
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string html = slurp(dir_ / "report.html");
  expect_self_contained(html);
  EXPECT_NE(html.find("<h2>Expert load</h2>"), std::string::npos);
  EXPECT_NE(html.find("id=\"expert-load-1\""), std::string::npos);
  EXPECT_NE(html.find("id=\"expert-load-2\""), std::string::npos);
  EXPECT_NE(html.find("layer 1: 4 experts; last step max/mean load 1.00; dropped pairs over the logged steps 300"),
            std::string::npos);
  // Expert 0 at 2x the mean (full red) early on, 0.5x (half blue) for expert 2; white once balanced.
  EXPECT_NE(html.find("fill=\"rgb(255,0,0)\"><title>layer 1 step 1, expert 0: 2.00x the mean load"), std::string::npos);
  EXPECT_NE(html.find("fill=\"rgb(128,128,255)\"><title>layer 1 step 1, expert 2: 0.50x the mean load"),
            std::string::npos);
  EXPECT_NE(html.find("<title>layer 2 steps 299-300, expert 3: 1.00x the mean load"), std::string::npos);
  size_t columns = 0;
  for (size_t at = html.find("<title>layer 2 "); at != std::string::npos; at = html.find("<title>layer 2 ", at + 1))
    ++columns;
  EXPECT_EQ(columns, 240u * 4);  // 240 columns of 4 experts
  // A dense run: no panel.
  test::write_file(dir_ / "metrics.jsonl", R"({"step":1,"loss":3.0,"lr":1e-3,"grad_norm":1.0,"step_time_s":0.1,)"
                                           R"("tokens_per_s":1000,"mfu":0.01})"
                                           "\n");
  r = run_tripod("report " + dir_.string());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(slurp(dir_ / "report.html").find("Expert load"), std::string::npos);
}

TEST_F(Report, EmptyRunDirectoryStatesWhatIsMissing) {
  auto r = run_tripod("report " + dir_.string());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("note: No metrics yet"), std::string::npos) << r.out;
  const std::string html = slurp(dir_ / "report.html");
  expect_self_contained(html);
  EXPECT_NE(html.find("No metrics yet: " + (dir_ / "metrics.jsonl").string() + " does not exist"), std::string::npos);
  EXPECT_NE(html.find("No pipeline timeline: " + (dir_ / "trace").string() + " does not exist"), std::string::npos);
  EXPECT_NE(html.find("No configuration: "), std::string::npos);
  // A trace folder without rank files yet.
  fs::create_directories(dir_ / "trace");
  test::write_file(dir_ / "metrics.jsonl", "\n");
  r = run_tripod("report " + dir_.string());
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string html2 = slurp(dir_ / "report.html");
  EXPECT_NE(html2.find("holds no rank_&lt;R&gt;.jsonl files yet"), std::string::npos);
  EXPECT_NE(html2.find("holds no step records"), std::string::npos);
}

TEST_F(Report, BadInputsExitTwoNamingTheFileAndWriteNothing) {
  // No such directory.
  auto r = run_tripod("report " + (dir_ / "nope").string());
  test::expect_refused(r, (dir_ / "nope").string() + ": no such run directory");
  EXPECT_FALSE(fs::exists(dir_ / "nope"));

  // A line that is not JSON: named with its line number; an existing page is left as it was.
  test::write_file(dir_ / "report.html", "old page");
  test::write_file(dir_ / "metrics.jsonl", "{\"step\":1,\"loss\":2.5}\n\n{\"step\":2,\"loss\":\n");
  test::expect_refused(run_tripod("report " + dir_.string()),
                       (dir_ / "metrics.jsonl").string() + ":3: not a JSON line");
  EXPECT_EQ(slurp(dir_ / "report.html"), "old page");
  // The same line last, without its newline, is one being written: left out, and said so.
  test::write_file(dir_ / "metrics.jsonl", "{\"step\":1,\"loss\":2.5}\n{\"step\":2,\"loss\":");
  r = run_tripod("report " + dir_.string() + " --out " + (dir_ / "live.html").string());
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("1 logged step(s)"), std::string::npos) << r.out;
  EXPECT_NE(slurp(dir_ / "live.html").find("metrics.jsonl is unfinished (being written?)"), std::string::npos);

  struct Case {
    std::string line, expect;
  };
  for (const Case& c : std::vector<Case>{
           {"[1,2]", ":1: expected a JSON object"},
           {"{\"step\":1,\"loss\":\"low\"}", ":1: \"loss\" must be a number, got \"low\""},
           {"{\"step\":-1,\"loss\":1}", ":1: \"step\" must be a non-negative integer"},
           {"{\"step\":1,\"loss\":1,\"mem_peak_bytes\":{\"params\":\"x\"}}", ":1: mem_peak_bytes.params must be"},
           {"{\"eval\":true,\"step\":1,\"split\":3,\"loss\":1}", ":1: \"split\" must be a string"},
       }) {
    test::write_file(dir_ / "metrics.jsonl", c.line + "\n");
    SCOPED_TRACE(c.line);
    test::expect_refused(run_tripod("report " + dir_.string()), "metrics.jsonl" + c.expect);
  }

  // A broken trace file is named as it is in the run directory.
  test::write_file(dir_ / "metrics.jsonl", "");
  fs::create_directories(dir_ / "trace");
  test::write_file(dir_ / "trace" / "rank_0.jsonl", "not json\n");
  r = run_tripod("report " + dir_.string());
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find((dir_ / "trace" / "rank_0.jsonl").string() + ":1:"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("tripod_report_"), std::string::npos) << r.err;
  fs::remove_all(dir_ / "trace");

  // --out into a folder that does not exist.
  r = run_tripod("report " + dir_.string() + " --out " + (dir_ / "no" / "page.html").string());
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find((dir_ / "no" / "page.html").string()), std::string::npos) << r.err;
  EXPECT_EQ(slurp(dir_ / "report.html"), "old page");
}

// The page in a real browser: Debian's chromium renders it headless, its script runs, and the
// screenshot is a full picture (not a blank or error page). Skips where chromium is missing.
TEST_F(ReportOfRun, ChromiumRendersThePage) {
  const std::string chromium = "/usr/bin/chromium";
  if (!fs::exists(chromium)) GTEST_SKIP() << chromium << " not installed (apt-get install chromium)";
  auto r = run_tripod("report " + run().string());
  ASSERT_EQ(r.status, 0) << r.err;
  auto profile = run().parent_path() / "chromium_profile";
  auto png = run().parent_path() / "report.png";
  const std::string flags = "--headless --no-sandbox --disable-gpu --disable-background-networking "
                            "--disable-component-update --disable-sync --no-first-run --disable-dev-shm-usage "
                            "--user-data-dir=" + profile.string() + " --window-size=1400,2000 ";
  const std::string url = "file://" + (run() / "report.html").string();
  // The DOM after the script ran: it marks the root with the number of charts it wired up.
  r = run_cmd(chromium + " " + flags + "--dump-dom " + url, 120);
  ASSERT_EQ(r.status, 0) << r.err;
  // (5 curves, and the stragglers' ratio: the run has 2 ranks)
  EXPECT_NE(r.out.find("data-ready=\"6\""), std::string::npos) << "the page's script did not run to the end";
  // Hovering over the loss chart writes the values under it: a copy of the page with a probe
  // that moves the mouse to the chart's middle and copies the readout into an attribute.
  std::string page = slurp(run() / "report.html");
  const std::string probe =
      "<script>(function(){var svg=document.querySelector('svg.chart[data-chart=\"loss\"]');"
      "var b=svg.getBoundingClientRect();svg.dispatchEvent(new MouseEvent('mousemove',{clientX:b.left+b.width/2,"
      "clientY:b.top+b.height/2,bubbles:true}));document.body.setAttribute('data-probe',"
      "document.getElementById('readout-loss').textContent);})();</script>";
  page.insert(page.rfind("</body>"), probe);
  test::write_file(run().parent_path() / "hover.html", page);
  r = run_cmd(chromium + " " + flags + "--dump-dom file://" + (run().parent_path() / "hover.html").string(), 120);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(std::regex_search(r.out, std::regex("data-probe=\"step [23]:  train [0-9.]+\""))) << r.out.substr(0, 400);

  r = run_cmd(chromium + " " + flags + "--screenshot=" + png.string() + " " + url, 120);
  ASSERT_EQ(r.status, 0) << r.err;
  ASSERT_TRUE(fs::exists(png)) << r.err;
  // A PNG of the window's size, and big enough to hold drawn charts (a blank page of this size
  // compresses to a few KiB).
  std::ifstream in(png, std::ios::binary);
  std::string head(24, '\0');
  in.read(head.data(), 24);
  EXPECT_EQ(head.substr(1, 3), "PNG");
  auto be32 = [&](size_t at) {
    return (uint32_t(uint8_t(head[at])) << 24) | (uint32_t(uint8_t(head[at + 1])) << 16) |
           (uint32_t(uint8_t(head[at + 2])) << 8) | uint32_t(uint8_t(head[at + 3]));
  };
  EXPECT_EQ(be32(16), 1400u);
  EXPECT_EQ(be32(20), 2000u);
  EXPECT_GT(fs::file_size(png), 60u * 1024) << "the screenshot looks empty";
  if (const char* keep = std::getenv("TRIPOD_REPORT_SCREENSHOT")) fs::copy_file(png, keep, fs::copy_options::overwrite_existing);
}

}  // namespace
}  // namespace tripod
