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
#include <fmt/format.h>

#include <cstring>
#include <map>

#include "harness.h"
#include "test_util.h"

namespace tripod {
namespace {

struct Layout {
  int tp = 1, dp = 1, pp = 1, cp = 1;
  ScheduleKind schedule = ScheduleKind::OneFOneB;
  int vp = 1;
  bool sp = false, distopt = false;
  std::string str() const {
    return fmt::format("tp={} dp={} pp={} cp={}{}{}{}{}", tp, dp, pp, cp,
                       pp > 1 ? fmt::format(" {}", enum_name(schedule)) : "", vp > 1 ? fmt::format(" vp={}", vp) : "",
                       sp ? " +sp" : "", distopt ? " +distopt" : "");
  }
  RankGrid grid() const { return RankGrid(tp, dp, pp, cp); }
  Config apply(Config c) const {
    c.parallel.tp = tp;
    c.parallel.dp = dp;
    c.parallel.pp = pp;
    c.parallel.cp = cp;
    c.parallel.vp = vp;
    c.parallel.schedule = schedule;
    c.parallel.placement =
        schedule == ScheduleKind::Zbv || schedule == ScheduleKind::DualPipeV ? Placement::V : Placement::Loop;
    c.parallel.sequence_parallel = sp;
    c.parallel.distributed_optimizer = distopt;
    c.parallel.bucket_mb = 0.01;  // several buckets
    return c;
  }
};

Config base_config() {
  Config cfg = test::tiny_config(/*n_layers=*/4, /*d_model=*/32, /*n_heads=*/4, /*seq_len=*/16, /*vocab=*/100);
  cfg.train.micro_batch_size = 1;
  cfg.train.global_batch_size = 8;
  cfg.train.steps = 5;
  cfg.train.lr = 3e-3;
  cfg.train.warmup_steps = 2;
  cfg.train.grad_clip = 0.5;
  return cfg;
}

// Mixtral-like: every layer 4 SwiGLU experts, top 2 renormalised, with Qwen3's q/k norms.
Config mixtral_config() {
  Config cfg = base_config();
  test::make_llama(cfg.model, 2);
  cfg.model.qk_norm = true;
  cfg.model.moe = {.experts = 4, .top_k = 2, .ffn_hidden = 24, .aux_loss_coeff = 0.01, .z_loss_coeff = 0.001};
  return cfg;
}

// DeepSeek-like on GPT-2 (LayerNorm, learned positions, GELU; no biases, as DeepSeek has none: a
// zero-initialised bias element whose gradient cancels is Adam-amplified rounding noise on any
// grid): sigmoid router choosing by score + bias, a shared expert, layer 0 dense, each expert
// taking at most ceil(1.0 * 16 * 2 / 6) = 6 of a micro-batch's 32 pairs.
Config deepseek_config() {
  Config cfg = base_config();
  cfg.model.bias = false;
  cfg.model.moe = {.experts = 6, .top_k = 2, .ffn_hidden = 24, .shared_experts = 1, .router = MoeRouter::Sigmoid,
                   .first_dense = 1, .aux_loss_coeff = 0.001, .bias_update_rate = 0.01, .capacity_factor = 1.0};
  return cfg;
}

// A run's losses, whole weights, selection biases (by name) and last step's MoE metrics.
struct MoeRun {
  test::RunResult r;
  std::map<std::string, std::vector<float>> biases;
  std::vector<MoeLayerRecord> moe;
};

// Every rank's biases are the same bits as every other's holding the same layer: gathered to
// rank 0 of the grid and compared there; the returned map holds them all.
std::map<std::string, std::vector<float>> gather_biases(ParamRegistry& reg, ParallelContext& par) {
  MPI_Comm world = static_cast<MpiComm*>(par.world.get())->handle();
  std::map<std::string, std::vector<float>> out;
  for (int l = 0; l < 64; ++l) {  // every layer's, from whichever ranks hold it
    const std::string name = fmt::format("h.{}.mlp.expert_bias", l);
    Param* p = reg.find(name);
    int64_t n = p ? p->numel() : 0;
    int64_t most = 0;
    MPI_Allreduce(&n, &most, 1, MPI_INT64_T, MPI_MAX, world);
    if (most == 0) continue;
    std::vector<float> mine(most, std::numeric_limits<float>::quiet_NaN()), lo(most), hi(most);
    if (p) std::copy(p->value.data<float>(), p->value.data<float>() + n, mine.begin());
    // NaN where a rank holds none: max and min over the holders must agree bit for bit.
    std::vector<float> for_max = mine, for_min = mine;
    for (float& v : for_max) v = std::isnan(v) ? -INFINITY : v;
    for (float& v : for_min) v = std::isnan(v) ? INFINITY : v;
    MPI_Allreduce(for_max.data(), hi.data(), static_cast<int>(most), MPI_FLOAT, MPI_MAX, world);
    MPI_Allreduce(for_min.data(), lo.data(), static_cast<int>(most), MPI_FLOAT, MPI_MIN, world);
    EXPECT_EQ(0, std::memcmp(lo.data(), hi.data(), most * 4)) << name << " differs between ranks";
    out[name] = hi;
  }
  return out;
}

MoeRun run(Config cfg, Ops& ops, ParallelContext& par, const SampleSource& data) {
  validate_layout(cfg, par.grid.world_size());
  Trainer t(cfg, ops, par, &data);
  MoeRun out;
  for (int64_t s = 0; s < cfg.train.steps; ++s) {
    StepRecord m = t.step();
    out.r.losses.push_back(m.loss);
    out.moe = m.moe;
  }
  out.r.params = test::gather_global_params(t.registry(), par, ops);
  out.biases = gather_biases(t.registry(), par);
  return out;
}

class MoeParallel : public ::testing::Test {
 protected:
  std::unique_ptr<Ops> ops = make_ops(Device::CPU);
  SyntheticSource data{16, 100, 3};

  MoeRun serial(const Config& cfg) {
    auto self = test::make_selfworld(*ops);
    return run(cfg, *ops, *self.par, data);
  }
  void check(const Config& cfg, const MoeRun& ref, const std::vector<Layout>& layouts) {
    for (const Layout& l : layouts) {
      SCOPED_TRACE(l.str());
      auto w = test::make_subworld(*ops, l.grid(), l.sp);
      if (!w.par) continue;
      MoeRun got = run(l.apply(cfg), *ops, *w.par, data);
      test::expect_matches(got.r, ref.r, l.str(), w.par->rank == 0);

      // The selection biases move by the whole batch's counts: the serial run's bits.
      EXPECT_EQ(got.biases.size(), ref.biases.size());
      for (const auto& [name, v] : ref.biases)
        EXPECT_EQ(got.biases[name], v) << name;
      // The step's expert loads (integers) and losses are the serial run's.
      ASSERT_EQ(got.moe.size(), ref.moe.size());
      for (size_t i = 0; i < ref.moe.size(); ++i) {
        EXPECT_EQ(got.moe[i].tokens_per_expert, ref.moe[i].tokens_per_expert) << "layer " << ref.moe[i].layer;
        EXPECT_EQ(got.moe[i].dropped, ref.moe[i].dropped) << "layer " << ref.moe[i].layer;
        EXPECT_NEAR(got.moe[i].load_balancing_loss, ref.moe[i].load_balancing_loss,
                    1e-5 * ref.moe[i].load_balancing_loss);
        EXPECT_NEAR(got.moe[i].z_loss, ref.moe[i].z_loss, 1e-5 * ref.moe[i].z_loss);
      }
    }
  }
};

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
      whole.biases = gather_biases(t.registry(), *w.par);
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
    resumed.biases = gather_biases(t.registry(), *w.par);
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
