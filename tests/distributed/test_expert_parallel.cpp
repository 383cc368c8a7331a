// Expert parallelism against the single-process run (4 ranks under mpirun), over 10 steps: the
// routed experts split over ep ranks taken from DP x CP, tokens carried by the all-to-all or the
// all-gather dispatcher, expert gradients reduced over the expert-data-parallel group (EDP) and
// the rest over DP x CP. ep = 2 on 2 ranks (EDP of one rank), ep = 2 of dp = 4 (EDP of two: the
// experts' own reduction and, with the distributed optimizer, their own shards), ep = 4 of dp = 4,
// and ep beside tp (+SP), pp (1F1B, interleaved, ZB-H1), cp and full recomputation; the Mixtral-
// like model (dropless) and the DeepSeek-like one (capacity 1 dropping pairs, selection biases
// moved every step); the loss of each step and the final weights within the tolerances every
// layout meets, the biases and expert loads exactly. Evaluation matches; the memory plan counts
// each rank's experts; a checkpoint saved at ep = 2 resumes bit-exactly on its own grid and
// checkpoints reshard across ep (2, 4 <-> 1).
#include "config/memory_plan.h"
#include "moe_util.h"
#include "train/evaluator.h"

namespace tripod {
namespace {

using test::Layout;
using test::MoeRun;
using test::run_moe;

Config steps10(Config c) {
  c.train.steps = 10;
  return c;
}

class ExpertParallel : public test::MoeLayoutTest {};

TEST_F(ExpertParallel, AllToAllDroplessMatchesSerial) {
  const Config cfg = steps10(test::mixtral_config());
  const MoeRun ref = serial(cfg);
  check(cfg, ref,
        {{.dp = 2, .ep = 2}, {.dp = 2, .distopt = true, .ep = 2}, {.dp = 4, .ep = 2},
         {.dp = 4, .distopt = true, .ep = 2}, {.dp = 4, .ep = 4}});
  // Full recomputation replays the router's decision and the dispatch plan: the same run.
  Config full = cfg;
  full.recompute.mode = RecomputeMode::Full;
  check(full, ref, {{.dp = 2, .ep = 2}, {.dp = 2, .pp = 2, .schedule = ScheduleKind::ZbH1, .ep = 2}});
}

TEST_F(ExpertParallel, AllGatherDroplessMatchesSerial) {
  const Config cfg = steps10(test::mixtral_config());
  const MoeRun ref = serial(cfg);
  constexpr auto AG = MoeDispatcher::AllGather;
  check(cfg, ref, {{.dp = 2, .ep = 2, .dispatcher = AG}, {.dp = 4, .distopt = true, .ep = 2, .dispatcher = AG},
                   {.dp = 4, .ep = 4, .dispatcher = AG}});
}

// Expert parallelism beside the other axes: experts column/row-parallel over tp (+SP) inside each
// EP rank, every pipeline stage's MoE layers over their own EP groups (1F1B, and ZB-H1 whose W
// dispatches again), EP groups made of context-parallel ranks, and of DP x CP together.
TEST_F(ExpertParallel, WithTensorPipelineAndContextParallelismMatchesSerial) {
  const Config cfg = steps10(test::mixtral_config());
  const MoeRun ref = serial(cfg);
  using S = ScheduleKind;
  constexpr auto AG = MoeDispatcher::AllGather;
  check(cfg, ref,
        {{.tp = 2, .dp = 2, .ep = 2}, {.tp = 2, .dp = 2, .sp = true, .distopt = true, .ep = 2, .dispatcher = AG},
         {.dp = 2, .pp = 2, .schedule = S::OneFOneB, .ep = 2},
         {.dp = 2, .pp = 2, .schedule = S::ZbH1, .distopt = true, .ep = 2, .dispatcher = AG},
         {.dp = 2, .pp = 2, .schedule = S::Interleaved, .vp = 2, .ep = 2},
         {.cp = 2, .ep = 2}, {.dp = 2, .cp = 2, .ep = 2}, {.dp = 2, .cp = 2, .distopt = true, .ep = 4},
         {.dp = 2, .cp = 2, .ep = 4, .dispatcher = AG}});
}

TEST_F(ExpertParallel, WithCapacityAndSelectionBiasMatchesSerial) {
  const Config cfg = steps10(test::deepseek_config());
  const MoeRun ref = serial(cfg);
  double dropped = 0;
  for (const MoeLayerRecord& m : ref.moe) dropped += m.dropped;
  EXPECT_GT(dropped, 0) << "the capacity must drop pairs in this test";
  check(cfg, ref,
        {{.dp = 2, .ep = 2}, {.dp = 4, .distopt = true, .ep = 2}, {.dp = 2, .ep = 2, .dispatcher = MoeDispatcher::AllGather},
         {.tp = 2, .dp = 2, .sp = true, .ep = 2}, {.dp = 2, .pp = 2, .schedule = ScheduleKind::ZbH1, .ep = 2}});
}

// Evaluation runs the training forward through the same dispatchers: the loss over 16 samples at
// the initial weights is the serial run's on every expert-parallel grid.
TEST_F(ExpertParallel, EvaluationMatchesSerial) {
  const Config cfg = test::mixtral_config();
  double serial_loss = 0;
  {
    auto self = test::make_selfworld(*ops);
    Config c = cfg;
    validate_layout(c, 1);
    Trainer t(c, *ops, *self.par, &data);
    serial_loss = t.evaluator().evaluate(&data, 16, 0).loss;
  }
  for (const Layout& l : {Layout{.dp = 2, .ep = 2}, Layout{.dp = 4, .ep = 4, .dispatcher = MoeDispatcher::AllGather},
                          Layout{.dp = 2, .pp = 2, .ep = 2}}) {
    SCOPED_TRACE(l.str());
    auto w = l.subworld(*ops);
    if (!w.par) continue;
    Config c = l.apply(cfg);
    validate_layout(c, l.grid().world_size());
    Trainer t(c, *ops, *w.par, &data);
    EXPECT_NEAR(t.evaluator().evaluate(&data, 16, 0).loss, serial_loss, 1e-5 * serial_loss);
  }
}

// The memory plan under expert parallelism: parameters, gradients and optimizer state exact (a
// rank holds E/ep experts; with the distributed optimizer its Adam state is 1/(dp x cp) of the
// rest and 1/EDP of its experts), activations within the plan's bound (expert rows counted at
// the most an EP rank can receive), and the expert parameters per rank 1/ep of ep = 1's.
TEST_F(ExpertParallel, MemoryPlanCountsTheExpertsOfEachRank) {
  Config base = test::mixtral_config();
  base.train.steps = 2;
  // Every layer's E SwiGLU experts (gate, up, down: 3 F C each) at ep = 1.
  const ModelConfig& m = base.model;
  const int64_t all_experts = int64_t{m.n_layers} * m.moe.experts * 3 * m.expert_ffn() * m.d_model;
  for (const Layout& l : {Layout{.dp = 2}, Layout{.dp = 2, .ep = 2}, Layout{.dp = 4, .distopt = true, .ep = 2},
                          Layout{.dp = 4, .distopt = true, .ep = 4},
                          Layout{.dp = 4, .ep = 4, .dispatcher = MoeDispatcher::AllGather}}) {
    SCOPED_TRACE(l.str());
    auto w = l.subworld(*ops);
    if (!w.par) continue;
    Config cfg = l.apply(base);
    validate_layout(cfg, l.grid().world_size());
    const RankMemory plan = plan_rank_memory(cfg, w.par->rank);
    Trainer t(cfg, *ops, *w.par, &data);
    t.step();
    const auto mem = t.step().memory.at(0);
    EXPECT_EQ(mem.at("params"), plan.params);
    EXPECT_EQ(mem.at("grads"), plan.grads);
    EXPECT_EQ(mem.at("optimizer"), plan.optimizer);
    EXPECT_LE(mem.at("activations"), plan.activations);
    int64_t experts = 0, others = 0;
    for (const Param& p : t.registry().params()) (p.spec.expert >= 0 ? experts : others) += p.numel();
    EXPECT_EQ(experts * l.ep, all_experts);
    if (w.par->rank == 0)
      fmt::print("{:<40} expert params {:>7}, others {:>7}; optimizer {:>8} B; activations {:>8} B of {:>8} planned\n",
                 l.str(), experts, others, plan.optimizer, mem.at("activations"), plan.activations);
  }
}

// A checkpoint of step 4 on dp = 4, ep = 2 (distributed optimizer: the experts' Adam state
// sharded over EDP) resumes bit-exactly on its own grid, the selection biases included.
TEST_F(ExpertParallel, ResumeIsBitExact) {
  const test::SharedDir dir("ep_resume");
  Config cfg = steps10(test::deepseek_config());
  cfg.train.steps = 8;
  const Layout saver{.dp = 4, .distopt = true, .ep = 2};
  MoeRun whole;
  {
    auto w = saver.subworld(*ops);
    if (w.par) {
      Config c = saver.apply(cfg);
      c.checkpoint.dir = (dir / "ck").string();
      validate_layout(c, 4);
      Trainer t(c, *ops, *w.par, &data);
      for (int s = 0; s < 8; ++s) {
        whole.r.losses.push_back(t.step().loss);
        if (s == 3) {
          t.save_checkpoint();
          t.finish_checkpoints();
        }
      }
      whole.r.params = test::gather_global_params(t.registry(), *w.par, *ops);
      whole.biases = test::gather_biases(t.registry(), *w.par);
    }
  }
  auto w = saver.subworld(*ops);
  if (!w.par) return;
  Config r = saver.apply(cfg);
  r.checkpoint.load = (dir / "ck" / "iter_0000004").string();
  validate_layout(r, 4);
  Trainer t(r, *ops, *w.par, &data);
  ASSERT_EQ(t.completed_steps(), 4);
  for (int s = 4; s < 8; ++s) EXPECT_EQ(t.step().loss, whole.r.losses[s]) << "step " << s + 1;
  const auto params = test::gather_global_params(t.registry(), *w.par, *ops);
  for (const auto& [name, v] : whole.r.params)
    EXPECT_EQ(0, std::memcmp(v.data(), params.at(name).data(), v.size() * 4)) << name;
  const auto biases = test::gather_biases(t.registry(), *w.par);
  for (const auto& [name, v] : whole.biases) EXPECT_EQ(biases.at(name), v) << name;
}

// Checkpoints reshard across ep: each expert's values and Adam state are stored once whatever
// the grid, so a checkpoint of step 4 saved at ep = 2 or 4 resumes at ep = 1 and one saved at
// ep = 1 resumes at ep = 2 and 4 (with and without the distributed optimizer on either side),
// continuing the serial run within the usual tolerance; the selection biases come back with their
// bits. (The DeepSeek-like model's 6 experts divide by 2, not 4: ep = 4 is the Mixtral-like one's.)
TEST_F(ExpertParallel, CheckpointsReshardAcrossEp) {
  auto resume = [&](const Config& cfg, const MoeRun& ref, const Layout& save, const Layout& load) {
    const std::string label = save.str() + " -> " + load.str();
    SCOPED_TRACE(label);
    const test::SharedDir dir("ep_reshard");
    if (auto w = save.subworld(*ops); w.par) {
      Config s = save.apply(cfg);
      s.checkpoint.dir = (dir / "ck").string();
      validate_layout(s, save.grid().world_size());
      Trainer t(s, *ops, *w.par, &data);
      for (int i = 0; i < 4; ++i) t.step();
      t.save_checkpoint();
      t.finish_checkpoints();
    }
    MPI_Barrier(MPI_COMM_WORLD);
    auto w = load.subworld(*ops);
    if (!w.par) return;
    Config r = load.apply(cfg);
    r.checkpoint.load = (dir / "ck" / "iter_0000004").string();
    validate_layout(r, load.grid().world_size());
    Trainer t(r, *ops, *w.par, &data);
    ASSERT_EQ(t.completed_steps(), 4);
    MoeRun resumed;
    resumed.r.losses = std::vector<double>(ref.r.losses.begin(), ref.r.losses.begin() + 4);
    for (int i = 4; i < cfg.train.steps; ++i) resumed.r.losses.push_back(t.step().loss);
    resumed.r.params = test::gather_global_params(t.registry(), *w.par, *ops);
    resumed.biases = test::gather_biases(t.registry(), *w.par);
    test::expect_matches(resumed.r, ref.r, label, w.par->rank == 0);
    for (const auto& [name, v] : ref.biases) EXPECT_EQ(resumed.biases[name], v) << name;
  };
  Config deepseek = test::deepseek_config();
  deepseek.train.steps = 8;
  const MoeRun dref = serial(deepseek);
  resume(deepseek, dref, {.dp = 2, .distopt = true, .ep = 2}, {.dp = 2});
  resume(deepseek, dref, {.dp = 4, .ep = 2}, {});
  resume(deepseek, dref, {.dp = 2}, {.dp = 2, .distopt = true, .ep = 2});
  resume(deepseek, dref, {.dp = 4, .distopt = true}, {.dp = 4, .ep = 2});
  Config mixtral = test::mixtral_config();
  mixtral.train.steps = 8;
  const MoeRun mref = serial(mixtral);
  resume(mixtral, mref, {.dp = 4, .distopt = true, .ep = 4}, {});
  resume(mixtral, mref, {.dp = 2}, {.dp = 4, .distopt = true, .ep = 4});
  resume(mixtral, mref, {.dp = 4, .ep = 4, .dispatcher = MoeDispatcher::AllGather}, {.dp = 2, .ep = 2});
}

}  // namespace
}  // namespace tripod
