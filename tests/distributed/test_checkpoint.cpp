// Checkpoints across grids (8 ranks under mpirun): a save under (dp,pp,tp) = (2,2,2) with vp = 2
// and the distributed optimizer loads under (1,1,1), (1,4,1), (4,1,2) and (2,1,1), and the next
// losses and the final weights match the uninterrupted serial run within the parallel
// tolerances; on the same grid a resume is bit-exact, with synchronous and asynchronous saves.
#include <fmt/format.h>

#include <filesystem>

#include "checkpoint/load.h"
#include "harness.h"
#include "test_util.h"

namespace tripod {
namespace {

namespace fs = std::filesystem;

struct Grid {
  int dp, pp, tp, vp;
  std::string str() const { return fmt::format("(dp,pp,tp)=({},{},{}) vp={}", dp, pp, tp, vp); }
};

Config base_config(const Grid& g) {
  Config cfg = test::tiny_config(/*n_layers=*/8, /*d_model=*/32, /*n_heads=*/4, /*seq_len=*/16, /*vocab=*/100);
  cfg.train.micro_batch_size = 1;
  cfg.train.global_batch_size = 8;
  cfg.train.steps = 6;
  cfg.train.lr = 3e-3;
  cfg.train.warmup_steps = 2;
  cfg.train.grad_clip = 0.5;
  cfg.parallel.dp = g.dp;
  cfg.parallel.pp = g.pp;
  cfg.parallel.tp = g.tp;
  cfg.parallel.vp = g.vp;
  cfg.parallel.schedule = g.vp > 1 ? ScheduleKind::Interleaved : ScheduleKind::OneFOneB;
  cfg.parallel.distributed_optimizer = true;
  cfg.parallel.bucket_mb = 0.01;
  return cfg;
}

class CheckpointGrids : public ::testing::Test {
 protected:
  std::unique_ptr<Ops> ops = make_ops(Device::CPU);
  SyntheticSource data{16, 100, 3};
};

TEST_F(CheckpointGrids, SaveOnInterleavedDistOptGridLoadsOnOtherGrids) {
  test::RunResult ref;
  {
    auto self = test::make_selfworld(*ops);
    ref = test::run_training(base_config({1, 1, 1, 1}), *ops, *self.par, data);
  }
  const test::SharedDir dir("ckpt_dist_reshard");
  const Grid save{2, 2, 2, 2};
  {
    auto w = test::make_subworld(*ops, RankGrid(save.tp, save.dp, save.pp));
    Config cfg = base_config(save);
    cfg.checkpoint.dir = dir.path().string();
    validate_layout(cfg, 8);
    Trainer t(cfg, *ops, *w.par, &data);
    for (int s = 0; s < 3; ++s) EXPECT_NEAR(t.step().loss, ref.losses[s], test::kLossTol * ref.losses[s]);
    t.save_checkpoint();
    t.finish_checkpoints();
  }
  MPI_Barrier(MPI_COMM_WORLD);
  for (const Grid& g : std::vector<Grid>{{1, 1, 1, 1}, {1, 4, 1, 1}, {4, 1, 2, 1}, {2, 1, 1, 1}}) {
    SCOPED_TRACE(g.str());
    RankGrid grid(g.tp, g.dp, g.pp);
    auto w = test::make_subworld(*ops, grid);
    if (!w.par) continue;
    Config cfg = base_config(g);
    cfg.checkpoint.load = (dir / "iter_0000003").string();  // load only: this run saves nothing
    validate_layout(cfg, grid.world_size());
    Trainer t(cfg, *ops, *w.par, &data);
    ASSERT_EQ(t.completed_steps(), 3);
    test::RunResult r;
    r.losses = ref.losses;  // steps 1..3 were the saving run's
    for (int s = 3; s < 6; ++s) r.losses[s] = t.step().loss;
    r.params = test::gather_global_params(t.registry(), *w.par, *ops);
    test::expect_matches(r, ref, "saved (2,2,2) vp=2 distopt, loaded " + g.str(), w.par->rank == 0);
  }
}

TEST_F(CheckpointGrids, SameGridResumeIsBitExactSyncAndAsync) {
  const Grid g{2, 2, 2, 2};
  RankGrid grid(g.tp, g.dp, g.pp);
  auto w = test::make_subworld(*ops, grid);
  Config cfg = base_config(g);
  validate_layout(cfg, 8);
  std::vector<double> losses;
  std::map<std::string, std::vector<float>> params;
  {
    Trainer t(cfg, *ops, *w.par, &data);
    for (int s = 0; s < 6; ++s) losses.push_back(t.step().loss);
    params = test::gather_global_params(t.registry(), *w.par, *ops);
  }
  for (bool async : {false, true}) {
    SCOPED_TRACE(async ? "async" : "sync");
    const test::SharedDir dir(async ? "ckpt_dist_async" : "ckpt_dist_sync");
    Config c = cfg;
    c.checkpoint.dir = dir.path().string();
    c.checkpoint.async = async;
    {
      Trainer t(c, *ops, *w.par, &data);
      for (int s = 0; s < 3; ++s) EXPECT_EQ(t.step().loss, losses[s]);
      t.save_checkpoint();
      t.step();  // training goes on while an asynchronous save writes
      t.finish_checkpoints();
    }
    c.checkpoint.load = "latest";
    Trainer t(c, *ops, *w.par, &data);
    ASSERT_EQ(t.completed_steps(), 3);
    for (int s = 3; s < 6; ++s) EXPECT_EQ(t.step().loss, losses[s]) << "step " << s + 1;
    auto p = test::gather_global_params(t.registry(), *w.par, *ops);
    for (const auto& [name, v] : params) EXPECT_TRUE(p[name] == v) << name << " differs after the resume";
  }
}

}  // namespace
}  // namespace tripod
