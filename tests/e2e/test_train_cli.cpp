// `tripod train` end to end: a run writes its directory; bad configs and layouts fail cleanly
// (one "error:" line, exit 2, within seconds) alone and under mpirun.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cli_util.h"

namespace tripod {
namespace {

using test::run_cmd;

const char* kTiny = R"([model]
n_layers = 2
n_heads = 4
d_model = 32
seq_len = 16
vocab_size = 64
[train]
micro_batch_size = 2
global_batch_size = 8
steps = 3
log_interval = 1
[data]
synthetic = true
)";

std::string train_cmd(const std::filesystem::path& cfg, const std::string& extra = "") {
  return test::tripod_bin() + " train --config " + cfg.string() + " " + extra;
}

TEST(TrainCli, RunWritesMetricsAndResolvedConfig) {
  auto dir = test::scratch_dir("run");
  test::write_file(dir / "c.toml", kTiny);
  auto r = run_cmd(train_cmd(dir / "c.toml", "--set train.output_dir=" + (dir / "run").string()));
  ASSERT_EQ(r.status, 0) << r.err;
  std::ifstream m(dir / "run" / "metrics.jsonl");
  std::string line;
  int n = 0;
  while (std::getline(m, line)) {
    auto j = nlohmann::json::parse(line);
    for (const char* k : {"step", "loss", "lr", "grad_norm", "tokens_per_s", "mfu", "mem_peak_bytes"})
      EXPECT_TRUE(j.contains(k)) << k << " missing in " << line;
    ++n;
  }
  EXPECT_EQ(n, 3);
  EXPECT_TRUE(std::filesystem::exists(dir / "run" / "config.toml"));
  std::filesystem::remove_all(dir);
}

struct BadCase {
  std::string name, config_edit, expect;
};

TEST(TrainCli, BadConfigsExitTwoWithOneErrorLine) {
  auto dir = test::scratch_dir("bad");
  std::vector<BadCase> cases = {
      {"unknown key", "[recompute]\nmod = \"full\"\n", "unknown key recompute.mod"},
      {"wrong type", "[parallel]\ntp = \"two\"\n", "parallel.tp must be an integer"},
      {"syntax", "[parallel\n", "TOML syntax error"},
  };
  for (const auto& c : cases) {
    test::write_file(dir / "c.toml", std::string(kTiny) + c.config_edit);
    auto r = run_cmd(train_cmd(dir / "c.toml"));
    EXPECT_EQ(r.status, 2) << c.name << ": " << r.err;
    EXPECT_EQ(test::count_lines_starting(r.err, "error: "), 1) << c.name << ": " << r.err;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << c.name << ": " << r.err;
  }
  auto r = run_cmd(train_cmd(dir / "missing.toml"));
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("missing.toml"), std::string::npos) << r.err;
  r = run_cmd(test::tripod_bin() + " train");
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find("--config"), std::string::npos) << r.err;
  std::filesystem::remove_all(dir);
}

TEST(TrainCli, BadLayoutsFailOnEveryRankWithinSeconds) {
  auto dir = test::scratch_dir("layout");
  test::write_file(dir / "c.toml", kTiny);
  struct L {
    std::string sets, expect;
  };
  for (const L& l : std::vector<L>{
           {"--set parallel.tp=3", "is not a multiple of parallel.tp * parallel.pp"},
           {"--set parallel.tp=2 --set parallel.dp=1", "world size is 4"},
           {"--set parallel.tp=4 --set model.n_heads=2 --set model.d_model=32", "parallel.tp = 4 must divide model.n_heads = 2"},
           {"--set train.global_batch_size=6", "train.global_batch_size = 6"},
       }) {
    auto r = run_cmd(test::mpirun(4) + train_cmd(dir / "c.toml", l.sets));
    EXPECT_EQ(r.status, 2) << l.sets << ": " << r.err;
    EXPECT_EQ(test::count_lines_starting(r.err, "error: "), 1) << l.sets << ": " << r.err;
    EXPECT_NE(r.err.find(l.expect), std::string::npos) << l.sets << ": " << r.err;
    EXPECT_LT(r.seconds, 20.0) << l.sets;
  }
  std::filesystem::remove_all(dir);
}

TEST(TrainCli, FourRanksTrainTensorAndDataParallel) {
  auto dir = test::scratch_dir("mpi");
  test::write_file(dir / "c.toml", kTiny);
  auto r = run_cmd(test::mpirun(4) + train_cmd(dir / "c.toml", "--set parallel.tp=2 --set parallel.sequence_parallel=true "
                                                                "--set train.output_dir=" + (dir / "run").string()));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("grid (dp=2, pp=1, tp=2)"), std::string::npos) << r.err;
  EXPECT_TRUE(std::filesystem::exists(dir / "run" / "metrics.jsonl"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tripod
