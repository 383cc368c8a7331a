// `tripod schedule`: the table, exactly one JSON object with --json, the SVG chart, custom CSV
// schedules refused before any compute, and bad arguments as one "error:" line with exit 2.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "cli_util.h"

namespace {

using tripod::test::slurp;

namespace fs = std::filesystem;

struct Result {
  int rc = -1;
  std::string out, err;
};

class ScheduleCli : public ::testing::Test {
 protected:
  void SetUp() override {
    bin_ = tripod::test::tripod_bin();
    ASSERT_TRUE(fs::exists(bin_)) << bin_;
    dir_ = fs::temp_directory_path() / ("tripod_schedule_cli_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  Result run(const std::string& args) {
    tripod::test::CmdResult c = tripod::test::run_cmd(bin_ + " schedule " + args);
    return Result{c.status, c.out, c.err};
  }
  fs::path write(const std::string& name, const std::string& text) {
    fs::path p = dir_ / name;
    std::ofstream(p) << text;
    return p;
  }
  // A refusal: exit 2, nothing on stdout, one line on stderr starting "error:" containing `what`.
  void expect_refused(const std::string& args, const std::string& what) {
    Result r = run(args);
    EXPECT_EQ(r.rc, 2) << args << "\n" << r.err;
    EXPECT_EQ(r.out, "") << args;
    EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << args << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find(what), std::string::npos) << args << ": " << r.err;
  }

  std::string bin_;
  fs::path dir_;
};

TEST_F(ScheduleCli, PrintsTheTable) {
  Result r = run("--kind 1f1b --pp 4 --microbatches 8");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("rank 0: F0.0 F1.0 F2.0 F3.0 B0.0 F4.0 B1.0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank 3: F0.0 B0.0 F1.0 B1.0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("bubble 27.3%"), std::string::npos) << r.out;  // 3/11
}

TEST_F(ScheduleCli, JsonIsOneObject) {
  Result r = run("--kind interleaved --pp 4 --vp 2 --microbatches 8 --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.err, "");
  nlohmann::json j = nlohmann::json::parse(r.out);  // throws on anything but one JSON value
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j["kind"], "interleaved");
  EXPECT_EQ(j["pp"], 4);
  EXPECT_EQ(j["vp"], 2);
  EXPECT_EQ(j["microbatches"], 8);
  EXPECT_NEAR(j["bubble"].get<double>(), 3.0 / 19, 1e-12);
  ASSERT_EQ(j["ranks"].size(), 4u);
  EXPECT_EQ(j["ranks"][0]["rank"], 0);
  EXPECT_EQ(j["ranks"][0]["actions"].size(), 32u);
  EXPECT_EQ(j["ranks"][0]["actions"][2], "F2.0");
  EXPECT_EQ(j["ranks"][0]["peak_inflight"], 11);
  EXPECT_EQ(j["ranks"][3]["peak_inflight"], 5);
  EXPECT_NEAR(j["ranks"][2]["bubble"].get<double>(), 3.0 / 19, 1e-12);
}

TEST_F(ScheduleCli, WritesSvgChart) {
  const fs::path svg = dir_ / "s.svg";
  Result r = run("--kind gpipe --pp 3 --microbatches 4 --json --svg " + svg.string());
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_TRUE(nlohmann::json::parse(r.out).is_object());  // still exactly one object on stdout
  std::string s = slurp(svg);
  EXPECT_EQ(s.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_NE(s.find("</svg>"), std::string::npos);
  // One box per action (3 ranks x 8 actions), each with its label as tooltip.
  size_t boxes = 0;
  for (size_t p = s.find("<g><title>"); p != std::string::npos; p = s.find("<g><title>", p + 1)) ++boxes;
  EXPECT_EQ(boxes, 24u);
  EXPECT_NE(s.find(">B3.0 (virtual stage 2)"), std::string::npos);
  expect_refused("--kind gpipe --pp 2 --microbatches 2 --svg /nonexistent/dir/s.svg", "/nonexistent/dir/s.svg");
}

TEST_F(ScheduleCli, CustomCsvValidatesAndRuns) {
  fs::path ok = write("ok.csv", "# eager backward on rank 0\nF0,F1,B0,F2,B1,B2\nF0,B0,F1,B1,F2,B2\n");
  Result r = run("--csv " + ok.string() + " --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["kind"], "custom");
  EXPECT_EQ(j["pp"], 2);
  EXPECT_EQ(j["microbatches"], 3);
}

TEST_F(ScheduleCli, BrokenCsvIsRefusedNamingTheDependency) {
  fs::path bad = write("bad.csv", "F0,F1,F2,B0,B1,B2\nF0,B0,F1,B1,B2,F2\n");
  expect_refused("--csv " + bad.string(), "rank 1 (" + bad.string() + ":2): B2.0 before F2.0");
  fs::path dl = write("dl.csv", "F0,B0,F1,B1\nF0,F1,B0,B1\n");
  expect_refused("--csv " + dl.string(), "schedule deadlocks: rank 0");
  fs::path cell = write("cell.csv", "F0,B0\nF0,X0,B0\n");
  expect_refused("--csv " + cell.string(), cell.string() + ":2 (rank 1): 'X0' is not an action");
  expect_refused("--csv " + (dir_ / "missing.csv").string(), "missing.csv: cannot read");
  expect_refused("--csv " + bad.string() + " --pp 3", "--pp 3: ");
  expect_refused("--csv " + bad.string() + " --kind 1f1b", "give one or the other");
}

TEST_F(ScheduleCli, ZeroBubbleKindsPrintIdleAndMemory) {
  for (const char* kind : {"zb-h1", "zb-h2", "zbv", "dualpipev", "auto"}) {
    Result r = run(std::string("--kind ") + kind + " --pp 4 --microbatches 8 --costs 1,1,1 --json");
    ASSERT_EQ(r.rc, 0) << kind << ": " << r.err;
    nlohmann::json j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["kind"], kind);
    const bool v = std::string(kind) == "zbv" || std::string(kind) == "dualpipev";
    EXPECT_EQ(j["placement"], v ? "v" : "loop") << kind;
    EXPECT_EQ(j["vp"], v ? 2 : 1) << kind;
    EXPECT_EQ(j["costs"]["input"], 1.0);
    EXPECT_EQ(j["costs"]["weight"], 1.0);
    ASSERT_EQ(j["ranks"].size(), 4u);
    for (const auto& rank : j["ranks"]) {
      EXPECT_DOUBLE_EQ(rank["idle"].get<double>(), j["makespan"].get<double>() - rank["busy"].get<double>());
      EXPECT_GT(rank["peak_memory"].get<double>(), 0);
    }
    if (std::string(kind) == "zb-h1") {
      for (const auto& rank : j["ranks"]) EXPECT_DOUBLE_EQ(rank["idle"].get<double>(), 3.0);  // p-1
    }
    if (std::string(kind) == "auto") {
      EXPECT_FALSE(j["auto"]["chosen"].get<std::string>().empty());
      EXPECT_GT(j["auto"]["candidates"].size(), 4u);
    }
  }
  Result t = run("--kind zbv --pp 2 --microbatches 4 --svg " + (dir_ / "v.svg").string());
  ASSERT_EQ(t.rc, 0) << t.err;
  EXPECT_NE(t.out.find("placement=v"), std::string::npos);
  EXPECT_NE(t.out.find("I0.1"), std::string::npos);
  EXPECT_NE(slurp(dir_ / "v.svg").find("W0.1"), std::string::npos);
  Result a = run("--kind auto --pp 4 --microbatches 8 --costs 1,1.5,0.5 --memory-cap 6");
  ASSERT_EQ(a.rc, 0) << a.err;
  EXPECT_NE(a.out.find("auto: chose "), std::string::npos);
}

TEST_F(ScheduleCli, PyTorchCsvRunsAndWritesBack) {
  // A torchtitan-style compute_only CSV (ZB-V order for pp = 2, m = 2, idle steps as empty cells).
  fs::path pt = write("zbv.csv",
                      "0F0,0F1,,3F0,3I0,3W0,3F1,3I1,3W1,0I0,0W0,0I1,0W1\n"
                      ",1F0,2F0,1F1,2F1,2I0,2W0,1I0,1W0,2I1,2W1,1I1,1W1\n");
  Result r = run("--csv " + pt.string() + " --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["placement"], "v");
  EXPECT_EQ(j["vp"], 2);
  EXPECT_EQ(j["ranks"][0]["actions"][2], "F0.1");  // stage 3 is rank 0's chunk 1
  fs::path back = dir_ / "back.csv";
  Result w = run("--csv " + pt.string() + " --save-csv " + back.string() + " --save-format pytorch");
  ASSERT_EQ(w.rc, 0) << w.err;
  EXPECT_EQ(slurp(back), "0F0,0F1,3F0,3I0,3W0,3F1,3I1,3W1,0I0,0W0,0I1,0W1\n"
                         "1F0,2F0,1F1,2F1,2I0,2W0,1I0,1W0,2I1,2W1,1I1,1W1\n");
  fs::path tri = dir_ / "tri.csv";
  ASSERT_EQ(run("--csv " + back.string() + " --save-csv " + tri.string()).rc, 0);
  Result again = run("--csv " + tri.string() + " --json");
  ASSERT_EQ(again.rc, 0) << again.err;
  EXPECT_EQ(nlohmann::json::parse(again.out)["ranks"], j["ranks"]);
  expect_refused("--csv " + pt.string() + " --csv-format tripod", "'0F0' is not an action");
  expect_refused("--csv " + pt.string() + " --save-csv " + back.string() + " --save-format onnx", "--save-format onnx");
}

TEST_F(ScheduleCli, BadSplitBackwardsAreRefusedNamingFileRankAndAction) {
  fs::path wi = write("w_before_i.csv", "F0,W0,I0\n");
  expect_refused("--csv " + wi.string(), "rank 0 (" + wi.string() + ":1): W0.0 before I0.0");
  fs::path nof = write("i_without_f.csv", "F0,F1,I0,W0,I1,W1\nI0,W0,F1,I1,W1\n");
  expect_refused("--csv " + nof.string(), "rank 1 (" + nof.string() + ":2): I0.0 without F0.0");
  fs::path v3 = write("v3.csv", "placement = v\nF0.0,F0.1,F0.2,B0.2,B0.1,B0.0\n");
  expect_refused("--csv " + v3.string(), v3.string() + ":2 (rank 0): F0.2: chunk 2, but placement v");
  fs::path letter = write("letter.csv", "F0,B0\nF0,Z0,B0\n");
  expect_refused("--csv " + letter.string(), letter.string() + ":2 (rank 1): 'Z0' is not an action");
  expect_refused("--kind zbv --pp 2 --vp 3 --microbatches 4", "vp = 3");
  expect_refused("--kind zb-h1 --pp 2 --microbatches 4 --costs 1,1", "F,I,W");
  expect_refused("--kind zb-h1 --pp 2 --microbatches 4 --costs 1,x,1", "'x'");
  expect_refused("--kind auto --pp 4 --microbatches 8 --memory-cap 0.5", "raise the memory cap");
  expect_refused("--kind auto --pp 4 --microbatches 8 --placement w", "--placement w");
}

TEST_F(ScheduleCli, BadArgumentsExit2) {
  expect_refused("--kind interleaved --pp 4 --vp 2 --microbatches 6", "--microbatches = 6 is not a multiple of --pp = 4");
  expect_refused("--kind interleaved --pp 2 --vp 1 --microbatches 4", "vp = 1");
  expect_refused("--kind 1f1b --pp 2 --vp 2 --microbatches 4", "vp = 2");
  expect_refused("--kind 1f1b --pp 0 --microbatches 4", "pp = 0");
  expect_refused("--kind 1f1b --pp -3 --microbatches 4", "pp = -3");
  expect_refused("--kind gpipe --pp 2 --microbatches 0", "microbatches = 0");
  expect_refused("--kind gpipe --pp 2 --vp 0 --microbatches 2", "vp = 0");
  expect_refused("--kind pipedream --pp 2 --microbatches 2", "'pipedream'");
  expect_refused("--kind gpipe --pp 2", "--microbatches is required");
  expect_refused("--pp 2 --microbatches 2", "--kind is required");
  expect_refused("--kind gpipe --pp two --microbatches 2", "--pp");
  expect_refused("--kind gpipe --pp 2 --microbatches 2 --comm-cost -1", "communication -1");
}

}  // namespace
