// The measured timeline: the recorder's files, and the merge into a Chrome trace and an SVG
// with measured idle fractions beside the simulator's.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "cli_util.h"

#include "core/error.h"
#include "parallel/pipeline/schedules.h"
#include "parallel/pipeline/simulate.h"
#include "report/trace_merge.h"

namespace tripod {
namespace {

using test::slurp;

namespace fs = std::filesystem;
using nlohmann::json;

class Trace : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("tripod_trace_test_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(Trace, DisabledRecorderRecordsNothing) {
  TraceRecorder t;
  EXPECT_FALSE(t.enabled());
  { auto s = t.span("F0.0", TraceCategory::Forward, 0, 0); }
  EXPECT_EQ(t.buffered(), 0u);
  t.flush();
  EXPECT_FALSE(fs::exists(dir_ / "trace"));
}

TEST_F(Trace, RecorderWritesHeaderAndEvents) {
  Schedule s = build_schedule("1f1b", 2, 1, 2);
  {
    TraceRecorder t(dir_.string(), 1, 2, Coords{.tp = 0, .dp = 0, .pp = 1, .cp = 0}, s);
    t.start();
    t.set_step(3);
    {
      auto span = t.span("F0.0", TraceCategory::Forward, 0, 0);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    auto r = t.span("allreduce", TraceCategory::Reduce);
    r.end();
    t.span("cp ring send/recv K/V", TraceCategory::ContextParallel).end();
    EXPECT_EQ(t.buffered(), 3u);
    t.flush();
    EXPECT_EQ(t.buffered(), 0u);
  }
  std::istringstream lines(slurp(dir_ / "trace" / "rank_1.jsonl"));
  std::string line;
  std::getline(lines, line);
  json h = json::parse(line);
  EXPECT_EQ(h["tripod_trace"], 1);
  EXPECT_EQ(h["rank"], 1);
  EXPECT_EQ(h["coords"]["pp"], 1);
  EXPECT_EQ(h["coords"]["cp"], 0);
  EXPECT_EQ(h["schedule"]["kind"], "1f1b");
  EXPECT_EQ(h["schedule"]["actions"], json({"F0.0", "B0.0", "F1.0", "B1.0"}));  // pipeline rank 1's list
  EXPECT_TRUE(h.contains("origin_unix_us"));
  std::getline(lines, line);
  json e = json::parse(line);
  EXPECT_EQ(e["name"], "F0.0");
  EXPECT_EQ(e["cat"], "forward");
  EXPECT_EQ(e["step"], 3);
  EXPECT_GE(e["dur"].get<double>(), 2000.0);
  EXPECT_GE(e["ts"].get<double>(), 0.0);
  std::getline(lines, line);
  EXPECT_EQ(json::parse(line)["cat"], "reduce");
  std::getline(lines, line);
  EXPECT_EQ(json::parse(line)["cat"], "cp");
}

// Writes rank files whose compute events follow the simulated timeline (one time unit = 1 ms),
// for steps 0 and 1, plus communication events, as a traced run would.
void write_simulated_run(const fs::path& dir, const Schedule& s, double step0_stretch) {
  Simulation sim = simulate(s, PipeCosts{1, 2, 0});
  fs::create_directories(dir / "trace");
  for (int r = 0; r < s.pp; ++r) {
    std::ofstream out(dir / "trace" / ("rank_" + std::to_string(r) + ".jsonl"));
    json actions = json::array();
    for (const Action& a : s.ranks[r]) actions.push_back(a.str());
    out << json({{"tripod_trace", 1}, {"rank", r}, {"world", s.pp}, {"coords", {{"tp", 0}, {"dp", 0}, {"pp", r}}},
                 {"origin_unix_us", 1000},
                 {"schedule", {{"kind", enum_name(s.kind)}, {"pp", s.pp}, {"vp", s.vp}, {"microbatches", s.microbatches},
                               {"actions", actions}}}})
               .dump()
        << "\n";
    for (int step = 0; step < 2; ++step) {
      const double base = step * 100000.0, k = step == 0 ? step0_stretch : 1.0;
      for (const auto& t : sim.ranks[r].timeline) {
        out << json({{"step", step}, {"name", t.action.str()}, {"cat", t.action.forward() ? "forward" : "backward"},
                     {"mb", t.action.mb}, {"chunk", t.action.chunk}, {"ts", base + 1000 * k * t.start},
                     {"dur", 1000 * k * (t.end - t.start)}})
                   .dump()
            << "\n";
        // Receive waits happen in the gaps; they do not count as compute.
        out << json({{"step", step}, {"name", "recv " + t.action.str()}, {"cat", "recv"}, {"mb", t.action.mb},
                     {"chunk", t.action.chunk}, {"ts", base + 1000 * k * t.start - 1}, {"dur", 1}})
                   .dump()
            << "\n";
      }
      out << json({{"step", step}, {"name", "optimizer"}, {"cat", "optimizer"}, {"mb", -1}, {"chunk", -1},
                   {"ts", base + 1000 * sim.makespan + 10}, {"dur", 500}})
                 .dump()
          << "\n";
    }
  }
}

TEST_F(Trace, MergeMeasuresIdleAndComparesWithTheSimulator) {
  Schedule s = build_schedule("1f1b", 3, 1, 4);
  // Step 0 ran 3x slower (warm-up); it is left out of the averages.
  write_simulated_run(dir_, s, 3.0);
  TraceSummary sum = merge_traces(dir_.string());
  EXPECT_EQ(sum.kind, ScheduleKind::OneFOneB);
  EXPECT_EQ(sum.steps, 2);
  EXPECT_EQ(sum.steps_used, 1);
  EXPECT_EQ(sum.drawn_step, 1);
  EXPECT_NEAR(sum.mean_forward_us, 1000, 1e-6);
  EXPECT_NEAR(sum.mean_backward_us, 2000, 1e-6);
  ASSERT_EQ(sum.ranks.size(), 3u);
  for (const auto& r : sum.ranks) {
    EXPECT_NEAR(r.measured_idle, 2.0 / 6, 1e-9) << r.rank;  // (p-1)/(m+p-1)
    EXPECT_NEAR(r.ideal_idle, 2.0 / 6, 1e-9) << r.rank;
  }
  json j = json::parse(slurp(dir_ / "trace.json"));
  int complete = 0, names = 0;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "X") {
      ++complete;
      EXPECT_TRUE(e.contains("ts") && e.contains("dur") && e.contains("pid"));
    }
    if (e["ph"] == "M" && e["name"] == "process_name") ++names;
  }
  EXPECT_EQ(complete, 3 * 2 * (2 * 8 + 1));
  EXPECT_EQ(names, 3);
  // Headers without a cp coordinate (and runs without context parallelism) name three axes.
  EXPECT_EQ(sum.cp, 1);
  EXPECT_EQ(j["traceEvents"][0]["args"]["name"], "rank 0 (pp 0, dp 0, tp 0)");
  std::string svg = slurp(dir_ / "trace.svg");
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("idle 33.3%  (ideal 33.3%)"), std::string::npos);
  EXPECT_NE(svg.find("step 1"), std::string::npos);
}

// A cp = 2 run (2 ranks, pp = 1): per step and rank, forward F0.0 over [0, 1) ms and backward
// B0.0 over [1, 3) ms, with the cp attention's exchanges inside them: 0.1 ms in the forward,
// 0.3 ms in the backward.
void write_cp_run(const fs::path& dir) {
  const Schedule s = build_schedule("1f1b", 1, 1, 1);
  fs::create_directories(dir / "trace");
  for (int r = 0; r < 2; ++r) {
    std::ofstream out(dir / "trace" / ("rank_" + std::to_string(r) + ".jsonl"));
    out << json({{"tripod_trace", 1}, {"rank", r}, {"world", 2},
                 {"coords", {{"tp", 0}, {"dp", 0}, {"pp", 0}, {"cp", r}}}, {"origin_unix_us", 1000},
                 {"schedule", {{"kind", enum_name(s.kind)}, {"pp", 1}, {"vp", 1}, {"microbatches", 1},
                               {"actions", {"F0.0", "B0.0"}}}}})
               .dump()
        << "\n";
    auto event = [&](int step, const std::string& name, const std::string& cat, double ts, double dur) {
      out << json({{"step", step}, {"name", name}, {"cat", cat}, {"mb", cat == "cp" ? -1 : 0},
                   {"chunk", cat == "cp" ? -1 : 0}, {"ts", step * 10000.0 + ts}, {"dur", dur}})
                 .dump()
          << "\n";
    };
    for (int step = 0; step < 3; ++step) {
      // As the recorder writes them: a span when it ends, so the nested exchanges come first.
      event(step, "cp ring send/recv K/V", "cp", 100, 40);
      event(step, "cp ring send/recv K/V", "cp", 800, 60);
      event(step, "F0.0", "forward", 0, 1000);
      event(step, "cp ring send/recv K/V, dK/dV", "cp", 1200, 300);
      event(step, "B0.0", "backward", 1000, 2000);
    }
  }
}

TEST_F(Trace, ContextParallelRunsShowTheAxisAndTheExchanges) {
  write_cp_run(dir_);
  const MergedTrace merged = merge_rank_traces(read_traces(dir_.string()));
  const TraceSummary& sum = merged.summary;
  EXPECT_EQ(sum.cp, 2);
  ASSERT_EQ(sum.ranks.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    const TraceRankSummary& rs = sum.ranks[r];
    EXPECT_EQ(rs.coords, (Coords{.tp = 0, .dp = 0, .pp = 0, .cp = r}));
    EXPECT_NEAR(rs.cp_us_per_step, 400, 1e-9);
    EXPECT_NEAR(rs.cp_fraction, 400.0 / 3000, 1e-12);
    EXPECT_NEAR(rs.measured_idle, 0, 1e-12) << "the exchanges lie inside compute: no idle of their own";
  }
  // Forward and backward costs are the compute events' alone.
  EXPECT_NEAR(sum.mean_forward_us, 1000, 1e-9);
  EXPECT_NEAR(sum.mean_backward_us, 2000, 1e-9);

  // trace.json: processes named with the cp coordinate, the exchanges as their own events.
  json j = json::parse(render_trace_json(merged));
  std::vector<std::string> names;
  int cp_events = 0;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name") names.push_back(e["args"]["name"]);
    if (e["ph"] == "X" && e["cat"] == "cp") {
      ++cp_events;
      EXPECT_EQ(e["name"].get<std::string>().rfind("cp ring send/recv K/V", 0), 0u) << e;
    }
  }
  EXPECT_EQ(names, (std::vector<std::string>{"rank 0 (pp 0, dp 0, cp 0, tp 0)", "rank 1 (pp 0, dp 0, cp 1, tp 0)"}));
  EXPECT_EQ(cp_events, 2 * 3 * 3);

  // trace.svg: rows named with cp; each exchange a band drawn after (over) the compute boxes.
  const GanttChart chart = trace_chart(merged);
  EXPECT_EQ(chart.row_labels, (std::vector<std::string>{"rank 0 (pp 0, cp 0)", "rank 1 (pp 0, cp 1)"}));
  int inner = 0;
  for (const GanttBox& b : chart.boxes) {
    inner += b.inner;
    EXPECT_EQ(b.inner, b.fill == "#1a9e8f") << b.tooltip;
  }
  EXPECT_EQ(inner, 2 * 3);  // the drawn step's
  const std::string svg = render_gantt_svg(chart);
  const size_t last_compute = svg.rfind("B0.0 (backward)"), first_band = svg.find("cp ring send/recv");
  ASSERT_NE(first_band, std::string::npos);
  EXPECT_LT(last_compute, first_band);
  EXPECT_NE(svg.find("teal band: context-parallel K/V exchange"), std::string::npos);

  // `tripod trace merge`: a cp column and the exchanges' time per step.
  tripod::test::CmdResult r = tripod::test::run_cmd(tripod::test::tripod_bin() + " trace merge " + dir_.string());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("  cp   tp"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("cp ms/step"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("0.400\n"), std::string::npos) << r.out;
}

TEST_F(Trace, MergingIsPureAndTheWriterWritesWhatTheRenderersReturn) {
  Schedule s = build_schedule("gpipe", 2, 1, 3);
  write_simulated_run(dir_, s, 1.0);
  const std::map<int, RankTrace> files = read_traces(dir_.string());
  ASSERT_EQ(files.size(), 2u);
  // Nothing is written until merge_traces: the summary and both renderings come from memory.
  const MergedTrace merged = merge_rank_traces(files);
  EXPECT_FALSE(fs::exists(dir_ / "trace.json"));
  EXPECT_FALSE(fs::exists(dir_ / "trace.svg"));
  ASSERT_EQ(merged.ranks.size(), 2u);
  EXPECT_EQ(merged.summary.steps, 2);
  const std::string json_text = render_trace_json(merged);
  const GanttChart chart = trace_chart(merged);
  // The drawn step's boxes start at 0 and its time axis ends where the last event ends: the
  // optimizer, 10 us after the simulated makespan, for 500 us.
  const double makespan_ms = simulate(s, PipeCosts{1, 2, 0}).makespan;
  double first = 1e300, last = 0;
  for (const GanttBox& b : chart.boxes) {
    first = std::min(first, b.start);
    last = std::max(last, b.end);
  }
  EXPECT_NEAR(first, 0, 1e-9);
  EXPECT_NEAR(last, makespan_ms + 0.010 + 0.5 + 0.001, 1e-9);  // from the first receive, 1 us before t = 0
  const std::string svg = render_gantt_svg(chart);
  EXPECT_NE(svg.find(fmt::format(">{:g}</text>", std::floor(last))), std::string::npos) << "a tick near the end";

  TraceSummary written = merge_traces(dir_.string());
  EXPECT_EQ(slurp(dir_ / "trace.json"), json_text);
  EXPECT_EQ(slurp(dir_ / "trace.svg"), svg);
  EXPECT_EQ(written.json_path, (dir_ / "trace.json").string());
}

TEST_F(Trace, MergeReadsTheLastSessionAndIgnoresRanksOfOlderRuns) {
  // An older run with 3 ranks, then a new 2-rank run in the same folder.
  write_simulated_run(dir_, build_schedule("gpipe", 3, 1, 2), 1.0);
  {
    std::ofstream(dir_ / "trace" / "rank_0.jsonl", std::ios::trunc);
    std::ofstream(dir_ / "trace" / "rank_1.jsonl", std::ios::trunc);
  }
  fs::path newer = dir_ / "newer";
  write_simulated_run(newer, build_schedule("1f1b", 2, 1, 4), 1.0);
  for (int r = 0; r < 2; ++r) {
    std::string text = slurp(newer / "trace" / ("rank_" + std::to_string(r) + ".jsonl"));
    // Make this the most recent session.
    auto at = text.find("\"origin_unix_us\":1000");
    ASSERT_NE(at, std::string::npos);
    text.replace(at, 21, "\"origin_unix_us\":9000");
    std::ofstream(dir_ / "trace" / ("rank_" + std::to_string(r) + ".jsonl"), std::ios::app) << text;
  }
  TraceSummary sum = merge_traces(dir_.string());
  EXPECT_EQ(sum.kind, ScheduleKind::OneFOneB);
  EXPECT_EQ(sum.ranks.size(), 2u);
  EXPECT_NEAR(sum.ranks[0].measured_idle, 1.0 / 5, 1e-9);
}

TEST_F(Trace, MergeRefusesBadInputNamingIt) {
  auto error_of = [](const std::string& d) -> std::string {
    try {
      merge_traces(d);
    } catch (const InputError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(error_of((dir_ / "nope").string()).find("no such run directory"), std::string::npos);
  EXPECT_NE(error_of(dir_.string()).find("no trace folder"), std::string::npos);
  fs::create_directories(dir_ / "trace");
  EXPECT_NE(error_of(dir_.string()).find("no rank_<R>.jsonl trace files"), std::string::npos);
  write_simulated_run(dir_, build_schedule("1f1b", 2, 1, 2), 1.0);
  std::ofstream(dir_ / "trace" / "rank_1.jsonl", std::ios::app) << "{\"step\":1,\"name\":\"F0.0\"\n";
  std::string e = error_of(dir_.string());
  EXPECT_NE(e.find("rank_1.jsonl:"), std::string::npos) << e;
  EXPECT_NE(e.find("not a JSON trace line"), std::string::npos) << e;
}

// `tripod trace merge RUN_DIR`: the table on stdout, one "error:" line and exit 2 on bad input.
TEST_F(Trace, MergeCommand) {
  const std::string bin = tripod::test::tripod_bin();
  ASSERT_TRUE(fs::exists(bin)) << bin;
  auto run = [&](const std::string& args, std::string& out, std::string& err) {
    tripod::test::CmdResult r = tripod::test::run_cmd(bin + " trace merge " + args);
    out = r.out;
    err = r.err;
    return r.status;
  };
  fs::path run_dir = dir_ / "run";
  write_simulated_run(run_dir, build_schedule("interleaved", 2, 2, 2), 1.0);
  std::string out, err;
  ASSERT_EQ(run(run_dir.string(), out, err), 0) << err;
  EXPECT_NE(out.find("interleaved schedule, pp=2 vp=2 microbatches=2"), std::string::npos) << out;
  EXPECT_NE(out.find("trace.json"), std::string::npos) << out;
  EXPECT_TRUE(fs::exists(run_dir / "trace.json"));
  EXPECT_TRUE(fs::exists(run_dir / "trace.svg"));
  EXPECT_EQ(run((dir_ / "missing").string(), out, err), 2);
  EXPECT_EQ(out, "");
  EXPECT_EQ(err, "error: " + (dir_ / "missing").string() + ": no such run directory\n");
  EXPECT_EQ(run("", out, err), 2);  // RUN_DIR is required
  EXPECT_EQ(err.rfind("error: ", 0), 0u) << err;
}

}  // namespace
}  // namespace tripod
