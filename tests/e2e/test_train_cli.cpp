// `tripod train` end to end: a run writes its directory; bad configs and layouts fail cleanly
// (one "error:" line, exit 2, within seconds) alone and under mpirun.
#include "e2e_test.h"

namespace tripod {
namespace {

using test::run_tripod;

class TrainCli : public test::E2eTest {};

std::string train_args(const std::filesystem::path& cfg, const std::string& extra = "") {
  return "train --config " + cfg.string() + " " + extra;
}

TEST_F(TrainCli, RunWritesMetricsAndResolvedConfig) {
  auto r = run_tripod(train_args(write_config(), "--set train.output_dir=" + (dir_ / "run").string()));
  ASSERT_EQ(r.status, 0) << r.err;
  const auto records = test::metrics(dir_ / "run");
  for (const auto& j : records)
    for (const char* k : {"step", "loss", "lr", "grad_norm", "tokens_per_s", "mfu", "mem_peak_bytes"})
      EXPECT_TRUE(j.contains(k)) << k << " missing in " << j.dump();
  EXPECT_EQ(records.size(), 3u);
  EXPECT_TRUE(std::filesystem::exists(dir_ / "run" / "config.toml"));
}

struct BadCase {
  std::string name, config_edit, expect;
};

TEST_F(TrainCli, BadConfigsExitTwoWithOneErrorLine) {
  std::vector<BadCase> cases = {
      {"unknown key", "[recompute]\nmod = \"full\"\n", "unknown key recompute.mod"},
      {"wrong type", "[parallel]\ntp = \"two\"\n", "parallel.tp must be an integer"},
      {"syntax", "[parallel\n", "TOML syntax error"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    test::write_file(dir_ / "c.toml", test::tiny_config() + c.config_edit);
    test::expect_refused(run_tripod(train_args(dir_ / "c.toml")), c.expect);
  }
  auto r = run_tripod(train_args(dir_ / "missing.toml"));
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("missing.toml"), std::string::npos) << r.err;
  r = run_tripod("train");
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find("--config"), std::string::npos) << r.err;
}

TEST_F(TrainCli, BadLayoutsFailOnEveryRankWithinSeconds) {
  const auto cfg = write_config();
  struct L {
    std::string sets, expect;
  };
  for (const L& l : std::vector<L>{
           {"--set parallel.tp=3", "is not a multiple of parallel.tp * parallel.pp"},
           {"--set parallel.tp=2 --set parallel.dp=1", "world size is 4"},
           {"--set parallel.tp=4 --set model.n_heads=2 --set model.d_model=32", "parallel.tp = 4 must divide model.n_heads = 2"},
           {"--set train.global_batch_size=6", "train.global_batch_size = 6"},
       }) {
    SCOPED_TRACE(l.sets);
    auto r = run_tripod(train_args(cfg, l.sets), {.np = 4});
    test::expect_refused(r, l.expect);
    EXPECT_LT(r.seconds, 20.0);
  }
}

TEST_F(TrainCli, FourRanksTrainTensorAndDataParallel) {
  auto r = run_tripod(train_args(write_config(),
                                 "--set parallel.tp=2 --set parallel.sequence_parallel=true "
                                 "--set train.output_dir=" +
                                     (dir_ / "run").string()),
                      {.np = 4});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("grid (dp=2, pp=1, tp=2)"), std::string::npos) << r.err;
  EXPECT_TRUE(std::filesystem::exists(dir_ / "run" / "metrics.jsonl"));
}

}  // namespace
}  // namespace tripod
