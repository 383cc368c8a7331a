// Zero-bubble schedules in training (8 ranks under mpirun): zb-h1 and zb-h2 (loop placement, split
// backwards) and zbv and dualpipev (V placement: rank 0 holds the first and the last stage) on
// (dp, pp, tp) grids with sequence parallelism, recompute none/selective/full and the distributed
// optimizer, GPT-2 (tied table) and Llama-family (untied head): the loss of each of 10 steps and
// the final weights match the serial run within the parallel tolerances. Checkpoints: a save on
// the V placement loads on the loop placement and back, continuing as the serial run does, and a
// resume on the same zbv grid is bit-exact.
#include <fmt/format.h>

#include "harness.h"
#include "parallel/pipeline/schedules.h"
#include "test_util.h"

namespace tripod {
namespace {

struct Case {
  int dp, pp, tp;
  std::string schedule;
  RecomputeMode mode = RecomputeMode::None;
  bool sp = false, distopt = false;
  bool v = false;  // the V placement for schedule "auto" (zbv and dualpipev always use it)
  std::string str() const {
    return fmt::format("(dp,pp,tp)=({},{},{}) {}{} recompute={}{}{}", dp, pp, tp, schedule, v ? " (v)" : "",
                       enum_name(mode), sp ? " +sp" : "", distopt ? " +distopt" : "");
  }
};

constexpr int kSteps = 10;

Config base_config(bool llama) {
  Config cfg = test::tiny_config(/*n_layers=*/8, /*d_model=*/32, /*n_heads=*/4, /*seq_len=*/16, /*vocab=*/100);
  if (llama) test::make_llama(cfg.model, /*n_kv_heads=*/2);
  cfg.train.micro_batch_size = 1;
  cfg.train.global_batch_size = 8;
  cfg.train.steps = kSteps;
  cfg.train.lr = 3e-3;
  cfg.train.warmup_steps = 2;
  cfg.train.grad_clip = 0.5;
  return cfg;
}

// The config of `c`: the V schedules get placement v and 2 chunks per rank.
Config case_config(const Case& c, bool llama) {
  Config cfg = base_config(llama);
  ParallelConfig& p = cfg.parallel;
  p.tp = c.tp, p.pp = c.pp, p.dp = c.dp;
  p.schedule = *parse_enum<ScheduleKind>(c.schedule);
  const bool v = c.v || p.schedule == ScheduleKind::Zbv || p.schedule == ScheduleKind::DualPipeV;
  p.vp = v ? 2 : 1;
  p.placement = v ? Placement::V : Placement::Loop;
  p.sequence_parallel = c.sp;
  p.distributed_optimizer = c.distopt;
  p.bucket_mb = 0.01;
  cfg.recompute.mode = c.mode;
  return cfg;
}

class ZeroBubbleTraining : public ::testing::Test {
 protected:
  std::unique_ptr<Ops> ops = make_ops(Device::CPU);
  SyntheticSource data{16, 100, 3};
  test::RunResult serial(bool llama) {
    auto self = test::make_selfworld(*ops);
    return test::run_training(base_config(llama), *ops, *self.par, data);
  }
  void resume(const Case& c);
  void check(const Case& c, const test::RunResult& ref, bool llama) {
    SCOPED_TRACE(c.str());
    auto w = test::make_subworld(*ops, RankGrid(c.tp, c.dp, c.pp), c.sp);
    if (!w.par) return;
    auto r = test::run_training(case_config(c, llama), *ops, *w.par, data);
    test::expect_matches(r, ref, c.str(), w.par->rank == 0);
  }
};

// Each schedule on a plain pipeline, with TP and SP, with DP and the distributed optimizer, and
// under each recompute mode somewhere; dualpipev needs m >= 2pp (m = 8 / dp).
const std::vector<Case> kCases = {
    {1, 2, 1, "zb-h1"},
    {2, 2, 2, "zb-h1", RecomputeMode::Selective, true, true},
    {1, 4, 2, "zb-h2", RecomputeMode::Full},
    {2, 2, 1, "zb-h2", RecomputeMode::None, false, true},
    {1, 2, 1, "zbv"},
    {2, 2, 2, "zbv", RecomputeMode::Full, true, true},
    {1, 4, 1, "zbv", RecomputeMode::Selective},
    {1, 2, 2, "dualpipev", RecomputeMode::None, true},
    {2, 2, 1, "dualpipev", RecomputeMode::Full, false, true},
    // auto: whatever the start-up profile chooses, on both placements.
    {1, 2, 2, "auto", RecomputeMode::None, true},
    {2, 2, 1, "auto", RecomputeMode::Selective, false, true, true},
};

TEST_F(ZeroBubbleTraining, Gpt2EveryScheduleMatchesSerial) {
  test::RunResult ref = serial(false);
  for (const Case& c : kCases) check(c, ref, false);
}

TEST_F(ZeroBubbleTraining, LlamaEveryScheduleMatchesSerial) {
  test::RunResult ref = serial(true);
  for (const Case& c : kCases) check(c, ref, true);
}

// A checkpoint saved after 5 steps on one placement continues on the other as the serial run does.
TEST_F(ZeroBubbleTraining, CheckpointsLoadAcrossPlacements) {
  const test::RunResult ref = serial(false);
  const std::vector<std::pair<Case, Case>> pairs = {
      {{2, 2, 2, "zbv", RecomputeMode::None, false, true}, {1, 4, 2, "1f1b"}},
      {{2, 2, 2, "zb-h1", RecomputeMode::None, false, true}, {1, 4, 1, "zbv", RecomputeMode::None, false, true}},
  };
  for (const auto& [save, load] : pairs) {
    const std::string label = "saved " + save.str() + ", loaded " + load.str();
    SCOPED_TRACE(label);
    const test::SharedDir dir("ckpt_placement");
    {
      auto w = test::make_subworld(*ops, RankGrid(save.tp, save.dp, save.pp));
      Config cfg = case_config(save, false);
      cfg.checkpoint.dir = dir.path().string();
      validate_layout(cfg, 8);
      Trainer t(cfg, *ops, *w.par, &data);
      for (int s = 0; s < 5; ++s) EXPECT_NEAR(t.step().loss, ref.losses[s], test::kLossTol * ref.losses[s]);
      t.save_checkpoint();
      t.finish_checkpoints();
    }
    MPI_Barrier(MPI_COMM_WORLD);
    auto w = test::make_subworld(*ops, RankGrid(load.tp, load.dp, load.pp));
    if (!w.par) continue;
    Config cfg = case_config(load, false);
    cfg.checkpoint.load = (dir / "iter_0000005").string();
    validate_layout(cfg, w.par->grid.world_size());
    Trainer t(cfg, *ops, *w.par, &data);
    ASSERT_EQ(t.completed_steps(), 5);
    test::RunResult r;
    r.losses = ref.losses;  // steps 1..5 were the saving run's
    for (int s = 5; s < kSteps; ++s) r.losses[s] = t.step().loss;
    r.params = test::gather_global_params(t.registry(), *w.par, *ops);
    test::expect_matches(r, ref, label, w.par->rank == 0);
  }
}

// A resume on the same grid continues bit-exactly: zbv, and auto, whose schedule (chosen from
// timings, which differ from run to run) the checkpoint records.
TEST_F(ZeroBubbleTraining, ResumeIsBitExact) {
  for (const Case& c : {Case{2, 2, 2, "zbv", RecomputeMode::Selective, true, true},
                        Case{2, 2, 2, "auto", RecomputeMode::None, false, false, true}})
    resume(c);
}

void ZeroBubbleTraining::resume(const Case& c) {
  SCOPED_TRACE(c.str());
  auto w = test::make_subworld(*ops, RankGrid(c.tp, c.dp, c.pp), c.sp);
  Config cfg = case_config(c, true);
  cfg.train.steps = 6;
  validate_layout(cfg, 8);
  const test::SharedDir dir("ckpt_zb_resume");
  cfg.checkpoint.dir = dir.path().string();
  // The uninterrupted run saves after step 3 and goes on.
  std::vector<double> losses;
  std::map<std::string, std::vector<float>> params;
  std::string schedule;
  {
    Trainer t(cfg, *ops, *w.par, &data);
    schedule = schedule_csv(t.schedule());
    for (int s = 0; s < 3; ++s) t.step();
    t.save_checkpoint();
    t.finish_checkpoints();
    for (int s = 3; s < 6; ++s) losses.push_back(t.step().loss);
    params = test::gather_global_params(t.registry(), *w.par, *ops);
  }
  cfg.checkpoint.load = (dir / "iter_0000003").string();
  cfg.checkpoint.dir.clear();
  Trainer t(cfg, *ops, *w.par, &data);
  ASSERT_EQ(t.completed_steps(), 3);
  EXPECT_EQ(schedule_csv(t.schedule()), schedule) << "the resumed run runs another schedule";
  // Read from the checkpoint, not profiled again (a profile may choose another on a busy machine).
  if (c.schedule == "auto") {
    EXPECT_EQ(t.auto_chosen(), "as in " + (dir / "iter_0000003").string());
  }
  for (int s = 3; s < 6; ++s) EXPECT_EQ(t.step().loss, losses[s - 3]) << "step " << s + 1;
  auto p = test::gather_global_params(t.registry(), *w.par, *ops);
  for (const auto& [name, v] : params) EXPECT_TRUE(p[name] == v) << name << " differs after the resume";
}

}  // namespace
}  // namespace tripod
