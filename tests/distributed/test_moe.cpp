// Mixtures of experts on every axis against the single-process run (8 ranks under mpirun), at
// expert parallelism 1: tp = 2 (experts column/row-parallel, +SP), dp = 2 (+ the distributed
// optimizer), pp = 2 under every schedule (1F1B, GPipe, interleaved, zero-bubble ZB-H1, ZB-H2 and
// ZB-V), cp = 2 (alone, with tp and dp), and tp x dp x pp = 2 x 2 x 2; the loss of each step and
// the final weights within the tolerances every dense layout meets. Two models: a Mixtral-like
// Llama (softmax router, renormalised top 2 of 4, q/k norms, balancing and z-losses, dropless) and
// a DeepSeek-like GPT-2 (sigmoid router, selection bias updated every step, a shared expert, a
// dense first layer, capacity 1 dropping pairs). The selection biases are the same bits on every
// rank and equal the serial run's; a checkpoint resumes bit-exactly, the biases included; the
// step's expert loads and losses are the serial run's.
#include "moe_util.h"

namespace tripod {
namespace {

using test::Layout;
using test::MoeRun;
using test::deepseek_config;
using test::mixtral_config;
using test::run_moe;

class MoeParallel : public test::MoeLayoutTest {};

TEST_F(MoeParallel, MixtralLikeOnEveryAxisMatchesSerial) {
  const Config cfg = mixtral_config();
  const MoeRun ref = serial(cfg);
  ASSERT_EQ(ref.moe.size(), 4u);
  EXPECT_GT(ref.moe[0].load_balancing_loss, 1.5);  // top 2: the balanced value is 2
  using S = ScheduleKind;
  check(cfg, ref,
        {{.tp = 2}, {.tp = 2, .sp = true}, {.dp = 2}, {.dp = 2, .distopt = true},
         {.pp = 2, .schedule = S::OneFOneB}, {.pp = 2, .schedule = S::GPipe},
         {.pp = 2, .schedule = S::Interleaved, .vp = 2}, {.pp = 2, .schedule = S::ZbH1},
         {.pp = 2, .schedule = S::ZbH2}, {.pp = 2, .schedule = S::Zbv, .vp = 2},
         {.cp = 2}, {.tp = 2, .cp = 2, .sp = true}, {.tp = 2, .dp = 2, .cp = 2},
         {.tp = 2, .dp = 2, .pp = 2, .schedule = S::Interleaved, .vp = 2, .sp = true, .distopt = true}});
}

TEST_F(MoeParallel, DeepSeekLikeWithCapacityAndSelectionBiasMatchesSerial) {
  const Config cfg = deepseek_config();
  const MoeRun ref = serial(cfg);
  ASSERT_EQ(ref.moe.size(), 3u);  // layer 0 dense
  double dropped = 0;
  for (const MoeLayerRecord& m : ref.moe) dropped += m.dropped;
  EXPECT_GT(dropped, 0) << "the capacity must drop pairs in this test";
  ASSERT_EQ(ref.biases.size(), 3u);
  bool moved = false;
  for (const auto& [name, v] : ref.biases)
    for (float b : v) moved |= b != 0.f;
  EXPECT_TRUE(moved) << "the selection biases never moved";
  // (Under context parallelism each rank's capacity is that of its own tokens, as in Megatron: the
  // run differs from the serial one by design, so cp is left to the dropless model.)
  using S = ScheduleKind;
  check(cfg, ref,
        {{.tp = 2}, {.tp = 2, .sp = true}, {.dp = 2, .distopt = true}, {.pp = 2, .schedule = S::OneFOneB},
         {.pp = 2, .schedule = S::ZbH1}, {.pp = 2, .schedule = S::Zbv, .vp = 2},
         {.tp = 2, .dp = 2, .pp = 2, .schedule = S::OneFOneB, .sp = true}});
}

// A checkpoint of step 3 (on tp x dp x pp = 2 x 2 x 2) resumes bit-exactly on its own grid and,
// within the usual tolerance, on dp = 2; the selection biases (buffers outside the optimizer) come
// back with the same bits.
TEST_F(MoeParallel, ResumeIsBitExactWithTheSelectionBiases) {
  const test::SharedDir dir("moe_resume");
  Config cfg = deepseek_config();
  cfg.train.steps = 6;
  const MoeRun ref = serial(cfg);
  const Layout saver{.tp = 2, .dp = 2, .pp = 2};
  MoeRun whole;  // the uninterrupted run on the saving grid
  {
    auto w = test::make_subworld(*ops, saver.grid());
    if (w.par) {
      Config c = saver.apply(cfg);
      c.checkpoint.dir = (dir / "ck").string();
      validate_layout(c, 8);
      Trainer t(c, *ops, *w.par, &data);
      for (int s = 0; s < 6; ++s) {
        whole.r.losses.push_back(t.step().loss);
        if (s == 2) {
          t.save_checkpoint();
          t.finish_checkpoints();
        }
      }
      whole.r.params = test::gather_global_params(t.registry(), *w.par, *ops);
      whole.biases = test::gather_biases(t.registry(), *w.par);
    }
  }
  for (const Layout& l : {saver, Layout{.dp = 2}}) {
    SCOPED_TRACE(l.str());
    auto w = test::make_subworld(*ops, l.grid());
    if (!w.par) continue;
    Config r = l.apply(cfg);
    r.checkpoint.load = (dir / "ck" / "iter_0000003").string();
    validate_layout(r, l.grid().world_size());
    Trainer t(r, *ops, *w.par, &data);
    ASSERT_EQ(t.completed_steps(), 3);
    MoeRun resumed;
    resumed.r.losses = std::vector<double>(ref.r.losses.begin(), ref.r.losses.begin() + 3);
    for (int s = 3; s < 6; ++s) resumed.r.losses.push_back(t.step().loss);
    resumed.r.params = test::gather_global_params(t.registry(), *w.par, *ops);
    resumed.biases = test::gather_biases(t.registry(), *w.par);
    if (l.tp == 2) {  // the saving grid: bit-exact
      for (int s = 3; s < 6; ++s) EXPECT_EQ(resumed.r.losses[s], whole.r.losses[s]) << "step " << s + 1;
      for (const auto& [name, v] : whole.r.params)
        EXPECT_EQ(0, std::memcmp(v.data(), resumed.r.params[name].data(), v.size() * 4)) << name;
      for (const auto& [name, v] : whole.biases) EXPECT_EQ(resumed.biases[name], v) << name;
    } else {  // another grid: the serial run within tolerance
      test::expect_matches(resumed.r, ref.r, "resumed on dp=2", w.par->rank == 0);
    }
    for (const auto& [name, v] : ref.biases) EXPECT_EQ(resumed.biases[name], v) << name;
  }
}

}  // namespace
}  // namespace tripod
