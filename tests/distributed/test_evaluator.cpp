// Evaluation (train/evaluator) against the training forward and across grids (4 ranks under
// mpirun): (i) evaluating the samples of the next training step gives exactly the loss that step
// reports (its forward runs at the same weights); (ii) the validation loss of one set of trained
// weights is the same, within 1e-6 relative, on every grid, schedule and virtual-stage layout.
#include <fmt/format.h>

#include <cmath>

#include "harness.h"
#include "test_util.h"
#include "train/evaluator.h"

namespace tripod {
namespace {

struct Layout {
  int tp, dp, pp, vp;
  bool sp;
  std::string schedule;
  std::string str() const {
    return fmt::format("tp={} dp={} pp={} vp={}{} {}", tp, dp, pp, vp, sp ? " +sp" : "", schedule);
  }
};

Config base_config() {
  // 4 layers so that pp=2 x vp=2 has a layer per virtual stage; 8 samples per global batch.
  Config cfg = test::tiny_config(4, 32, 4, 16, 100);
  cfg.train.micro_batch_size = 2;
  cfg.train.global_batch_size = 8;
  cfg.train.steps = 4;
  cfg.train.lr = 3e-3;
  return cfg;
}

constexpr int64_t kValidSamples = 20;  // 2.5 global batches: the last one is padded

TEST(Evaluator, MatchesTrainingForwardAndAgreesAcrossGrids) {
  auto ops = make_ops(Device::CPU);
  const Config cfg = base_config();
  SyntheticSource train_data(16, 100, 3);
  auto valid = make_split_source(cfg, Split::Valid, kValidSamples, nullptr);
  const int64_t gb = cfg.train.global_batch_size;

  // Serial: train 3 steps, then hold the evaluator to the 4th step's loss and take the
  // validation loss of the weights.
  std::map<std::string, std::vector<float>> weights;
  EvalResult serial_valid;
  {
    auto self = test::make_selfworld(*ops);
    Config c = cfg;
    validate_layout(c, 1);
    Trainer t(c, *ops, *self.par, &train_data, valid.get());
    for (int s = 0; s < 3; ++s) t.step();
    weights = test::gather_global_params(t.registry(), *self.par, *ops);
    serial_valid = t.evaluator().evaluate(valid.get(), kValidSamples);
    EvalResult next = t.evaluator().evaluate(&train_data, gb, 3 * gb);
    StepRecord m = t.step();
    EXPECT_EQ(next.tokens, gb * 16);
    EXPECT_NEAR(next.loss, m.loss, 1e-6 * m.loss) << "evaluation of step 4's samples vs step 4's loss";
    EXPECT_NEAR(next.perplexity, std::exp(next.loss), 1e-9 * next.perplexity);
    EXPECT_GT(std::abs(serial_valid.loss - next.loss), 1e-4) << "the validation split reads other samples";
    EXPECT_LT(serial_valid.loss, std::log(100.0)) << "trained weights beat a uniform guess";
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0)
      fmt::print("serial: valid loss {:.6f} (ppl {:.3f}); step 4 loss {:.7f}, evaluated {:.7f}\n", serial_valid.loss,
                 serial_valid.perplexity, m.loss, next.loss);
  }

  const std::vector<Layout> layouts = {
      {1, 1, 1, 1, false, "1f1b"},        {1, 1, 2, 1, false, "1f1b"}, {2, 1, 1, 1, false, "1f1b"},
      {1, 2, 1, 1, false, "1f1b"},        {2, 1, 2, 1, false, "gpipe"}, {2, 2, 1, 1, true, "1f1b"},
      {1, 2, 2, 1, false, "1f1b"},        {1, 1, 2, 2, false, "interleaved"}, {1, 1, 4, 1, false, "1f1b"},
  };
  for (const Layout& l : layouts) {
    SCOPED_TRACE(l.str());
    auto w = test::make_subworld(*ops, RankGrid(l.tp, l.dp, l.pp), l.sp);
    if (!w.par) continue;
    Config c = cfg;
    c.parallel.tp = l.tp;
    c.parallel.dp = l.dp;
    c.parallel.pp = l.pp;
    c.parallel.vp = l.vp;
    c.parallel.schedule = *parse_enum<ScheduleKind>(l.schedule);
    c.parallel.sequence_parallel = l.sp;
    validate_layout(c, w.par->grid.world_size());
    Trainer t(c, *ops, *w.par, &train_data, valid.get());
    test::set_global_params(weights, t.registry(), *ops);
    EvalResult v = t.evaluator().evaluate(valid.get(), kValidSamples);
    EXPECT_NEAR(v.loss, serial_valid.loss, 1e-6 * serial_valid.loss);
    // Without TP every token's loss is the serial one bit for bit; only the order of the sums
    // differs, and the sums across ranks are f64 (an f32 all-reduce was off by ~1e-7).
    if (l.tp == 1) {
      EXPECT_NEAR(v.loss, serial_valid.loss, 1e-12 * serial_valid.loss);
    }
    EXPECT_EQ(v.tokens, serial_valid.tokens);
    // (i) on this grid too: step 1's samples evaluated, then step 1 run at the same weights.
    EvalResult first = t.evaluator().evaluate(&train_data, gb, 0);
    StepRecord m = t.step();
    EXPECT_NEAR(first.loss, m.loss, 1e-6 * m.loss);
    if (w.par->rank == 0)
      fmt::print("{:<36} valid loss rel. diff {:.1e}; evaluated vs step loss {:.1e}\n", l.str(),
                 std::abs(v.loss - serial_valid.loss) / serial_valid.loss, std::abs(first.loss - m.loss) / m.loss);
  }
}

}  // namespace
}  // namespace tripod
