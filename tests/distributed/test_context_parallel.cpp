// Context parallelism against the single-process run (8 ranks under mpirun): cp = 2 and 4, alone
// and with tp = 2 (+SP), pp = 2 and dp = 2 (8 ranks), ring and all-gather, GPT-2 and Llama
// (grouped-query attention, rope): the loss of each of 10 steps and the final weights match the
// serial run within the tolerances every other layout meets; ring and all-gather give the same
// bits at cp = 2; the interleaved and zero-bubble schedules (zb-h1, zbv) under cp = 2 too.
// Checkpoints: a cp = 2 save resumes bit-exactly on its own grid and loads under cp = 1 and
// cp = 4. Evaluation gives the serial loss; the memory plan matches measured peaks; the trace
// records every exchange.
#include <fmt/format.h>

#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "config/memory_plan.h"
#include "harness.h"
#include "test_util.h"
#include "train/evaluator.h"

namespace tripod {
namespace {

struct Layout {
  int cp, tp = 1, pp = 1, dp = 1;
  CpComm comm = CpComm::Ring;
  bool sp = false, distopt = false;
  ScheduleKind schedule = ScheduleKind::OneFOneB;
  RecomputeMode recompute = RecomputeMode::None;
  int vp = 1;  // with zbv and dualpipev, in a V
  std::string str() const {
    return fmt::format("cp={} {} tp={} pp={} dp={}{}{}{}{}{}", cp, enum_name(comm), tp, pp, dp, sp ? " +sp" : "",
                       distopt ? " +distopt" : "",
                       schedule != ScheduleKind::OneFOneB ? fmt::format(" {}", enum_name(schedule)) : "",
                       vp > 1 ? fmt::format(" vp={}", vp) : "",
                       recompute != RecomputeMode::None ? fmt::format(" recompute {}", enum_name(recompute)) : "");
  }
  RankGrid grid() const { return RankGrid(tp, dp, pp, cp); }
  Config apply(Config c) const {
    c.parallel.cp = cp;
    c.parallel.cp_comm = comm;
    c.parallel.tp = tp;
    c.parallel.pp = pp;
    c.parallel.dp = dp;
    c.parallel.sequence_parallel = sp;
    c.parallel.distributed_optimizer = distopt;
    c.parallel.schedule = schedule;
    c.parallel.vp = vp;
    c.parallel.placement =
        schedule == ScheduleKind::Zbv || schedule == ScheduleKind::DualPipeV ? Placement::V : Placement::Loop;
    c.parallel.bucket_mb = 0.01;  // several buckets
    c.recompute.mode = recompute;
    return c;
  }
};

Config base_config() {
  // seq 16: cp = 4 gives chunks of 2 tokens; 4 layers for pp = 2; a global batch of 8 in
  // micro-batches of 2 (gradient accumulation under every grid).
  Config cfg = test::tiny_config(4, 32, 4, 16, 100);
  cfg.train.micro_batch_size = 2;
  cfg.train.global_batch_size = 8;
  cfg.train.steps = 10;
  cfg.train.lr = 3e-3;
  cfg.train.warmup_steps = 2;
  cfg.train.grad_clip = 0.5;
  return cfg;
}

Config llama_config() {
  Config cfg = base_config();
  cfg.model.n_heads = 8;
  test::make_llama(cfg.model, 2);  // 4 query heads per key/value head; tp = 2 holds one each
  return cfg;
}

class ContextParallel : public ::testing::Test {
 protected:
  std::unique_ptr<Ops> ops = make_ops(Device::CPU);
  SyntheticSource data{16, 100, 3};

  test::RunResult serial(const Config& cfg) {
    auto self = test::make_selfworld(*ops);
    return test::run_training(cfg, *ops, *self.par, data);
  }
  // Runs `l` (ranks outside its grid sit out); returns whether this rank took part.
  bool run(const Config& cfg, const Layout& l, test::RunResult& r) {
    auto w = test::make_subworld(*ops, l.grid(), l.sp, l.comm);
    if (!w.par) return false;
    r = test::run_training(l.apply(cfg), *ops, *w.par, data);
    return true;
  }
  void every_layout_matches_serial(const Config& cfg, const std::vector<Layout>& layouts) {
    const test::RunResult ref = serial(cfg);
    for (const Layout& l : layouts) {
      SCOPED_TRACE(l.str());
      test::RunResult r;
      if (!run(cfg, l, r)) continue;
      ASSERT_EQ(r.losses.size(), ref.losses.size());
      int rank = 0;
      MPI_Comm_rank(MPI_COMM_WORLD, &rank);
      test::expect_matches(r, ref, l.str(), rank == 0);
    }
  }
};

TEST_F(ContextParallel, Gpt2EveryLayoutMatchesSerial) {
  every_layout_matches_serial(
      base_config(),
      {{.cp = 2}, {.cp = 4}, {.cp = 4, .comm = CpComm::AllGather}, {.cp = 2, .tp = 2, .sp = true},
       {.cp = 2, .pp = 2, .schedule = ScheduleKind::GPipe}, {.cp = 2, .dp = 2, .distopt = true},
       {.cp = 2, .tp = 2, .pp = 2, .comm = CpComm::AllGather, .recompute = RecomputeMode::Full},
       {.cp = 4, .tp = 2, .comm = CpComm::Ring}});
}

// The schedules with several model chunks per rank (each chunk's layers exchange with the same
// CP group) and split backwards (the exchanges of dK, dV belong to the input-gradient half).
TEST_F(ContextParallel, InterleavedAndZeroBubbleSchedulesMatchSerial) {
  every_layout_matches_serial(base_config(), {{.cp = 2, .pp = 2, .schedule = ScheduleKind::Interleaved, .vp = 2},
                                              {.cp = 2, .pp = 2, .comm = CpComm::AllGather, .schedule = ScheduleKind::Zbv,
                                               .vp = 2},
                                              {.cp = 2, .pp = 2, .schedule = ScheduleKind::ZbH1}});
}

TEST_F(ContextParallel, LlamaEveryLayoutMatchesSerial) {
  every_layout_matches_serial(
      llama_config(),
      {{.cp = 2}, {.cp = 4, .comm = CpComm::AllGather}, {.cp = 2, .tp = 2, .sp = true, .recompute = RecomputeMode::Selective},
       {.cp = 2, .pp = 2, .dp = 2, .distopt = true}, {.cp = 2, .tp = 2, .dp = 2, .comm = CpComm::AllGather}});
}

// Ring and all-gather compute the same blocks in the same order, and at cp = 2 the gradient sum
// of two ranks is the same either way: the same bits.
TEST_F(ContextParallel, RingEqualsAllGather) {
  for (const Config& cfg : {base_config(), llama_config()}) {
    test::RunResult ring, gather;
    const bool in = run(cfg, {.cp = 2, .tp = 2, .dp = 2}, ring);
    run(cfg, {.cp = 2, .tp = 2, .dp = 2, .comm = CpComm::AllGather}, gather);
    if (!in) continue;
    ASSERT_EQ(ring.losses.size(), gather.losses.size());
    for (size_t s = 0; s < ring.losses.size(); ++s) EXPECT_EQ(ring.losses[s], gather.losses[s]) << "step " << s + 1;
    for (const auto& [name, v] : ring.params)
      EXPECT_EQ(0, std::memcmp(v.data(), gather.params.at(name).data(), v.size() * sizeof(float))) << name;
  }
}

// A checkpoint saved under cp = 2 (tp = 2, dp = 2, distributed optimizer) resumes bit-exactly on
// its own grid, and loads under cp = 1 (serial) and cp = 4 (with dp = 2), which continue as the
// uninterrupted serial run within the parallel tolerances.
TEST_F(ContextParallel, CheckpointsDoNotDependOnCp) {
  Config cfg = base_config();
  cfg.train.steps = 6;
  const test::RunResult ref = serial(cfg);
  const test::SharedDir dir("ckpt_cp");
  const Layout save{.cp = 2, .tp = 2, .dp = 2, .distopt = true};
  std::vector<double> straight;
  {
    auto w = test::make_subworld(*ops, save.grid(), save.sp, save.comm);
    Config c = save.apply(cfg);
    c.checkpoint.dir = dir.path().string();
    validate_layout(c, 8);
    Trainer t(c, *ops, *w.par, &data);
    for (int s = 0; s < 3; ++s) EXPECT_NEAR(t.step().loss, ref.losses[s], test::kLossTol * ref.losses[s]);
    t.save_checkpoint();
    t.finish_checkpoints();
    for (int s = 3; s < 6; ++s) straight.push_back(t.step().loss);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  for (const Layout& l : std::vector<Layout>{save, {.cp = 1}, {.cp = 4, .dp = 2, .distopt = true}}) {
    SCOPED_TRACE(l.str());
    auto w = test::make_subworld(*ops, l.grid(), l.sp, l.comm);
    if (!w.par) continue;
    Config c = l.apply(cfg);
    c.checkpoint.load = (dir / "iter_0000003").string();
    validate_layout(c, l.grid().world_size());
    Trainer t(c, *ops, *w.par, &data);
    ASSERT_EQ(t.completed_steps(), 3);
    test::RunResult r;
    r.losses = ref.losses;
    for (int s = 3; s < 6; ++s) r.losses[s] = t.step().loss;
    if (l.cp == save.cp) {
      for (int s = 3; s < 6; ++s) EXPECT_EQ(r.losses[s], straight[s - 3]) << "resumed step " << s + 1;
    }
    r.params = test::gather_global_params(t.registry(), *w.par, *ops);
    test::expect_matches(r, ref, "saved cp=2, loaded " + l.str(), w.par->rank == 0);
  }
}

// Evaluation under context parallelism: one set of weights gives the serial validation loss
// (20 samples: the last global batch padded), and evaluating the next step's samples gives the
// loss that step reports.
TEST_F(ContextParallel, EvaluationMatchesSerial) {
  const Config cfg = llama_config();
  constexpr int64_t kValid = 20;
  auto valid = make_split_source(cfg, Split::Valid, kValid, nullptr);
  std::map<std::string, std::vector<float>> weights;
  EvalResult serial_valid;
  {
    auto self = test::make_selfworld(*ops);
    Config c = cfg;
    validate_layout(c, 1);
    Trainer t(c, *ops, *self.par, &data, valid.get());
    for (int s = 0; s < 2; ++s) t.step();
    weights = test::gather_global_params(t.registry(), *self.par, *ops);
    serial_valid = t.evaluator().evaluate(valid.get(), kValid);
  }
  for (const Layout& l : std::vector<Layout>{{.cp = 2, .tp = 2, .dp = 2}, {.cp = 4, .pp = 2}}) {
    SCOPED_TRACE(l.str());
    auto w = test::make_subworld(*ops, l.grid(), l.sp, l.comm);
    if (!w.par) continue;
    Config c = l.apply(cfg);
    validate_layout(c, l.grid().world_size());
    Trainer t(c, *ops, *w.par, &data, valid.get());
    test::set_global_params(weights, t.registry(), *ops);
    EvalResult v = t.evaluator().evaluate(valid.get(), kValid);
    EXPECT_NEAR(v.loss, serial_valid.loss, 1e-6 * serial_valid.loss);
    EXPECT_EQ(v.tokens, serial_valid.tokens);
    EvalResult first = t.evaluator().evaluate(&data, c.train.global_batch_size, 0);
    StepRecord m = t.step();
    EXPECT_NEAR(first.loss, m.loss, 1e-6 * m.loss);
  }
}

// The trace shows the exchanges: a traced step writes each one as a "cp" event of its rank, by
// name and count exactly as the attention makes them (4 layers x 4 micro-batches; the ring posts
// and waits once per hop, cp - 1 hops of K/V forward; backward cp - 1 hops of K/V posted alone and
// cp of the gradient sums, each posted with the waits; the all-gather gathers once per forward and
// backward and reduce-scatters once per backward), and the header names the axis.
TEST_F(ContextParallel, ExchangesAreTraced) {
  for (const CpComm comm : {CpComm::Ring, CpComm::AllGather}) {
    SCOPED_TRACE(enum_name(comm));
    const test::SharedDir dir("trace_cp");
    const Layout l{.cp = 2, .comm = comm};
    auto w = test::make_subworld(*ops, l.grid(), l.sp, l.comm);
    if (!w.par) continue;
    Config c = l.apply(base_config());
    c.train.steps = 1;
    c.train.output_dir = dir.path().string();
    validate_layout(c, l.grid().world_size());
    {
      Trainer t(c, *ops, *w.par, &data);
      EXPECT_NE(w.par->trace, nullptr);
      t.step();
    }
    EXPECT_EQ(w.par->trace, nullptr) << "the trainer's recorder is gone with it";
    std::ifstream in(dir / "trace" / fmt::format("rank_{}.jsonl", w.par->rank));
    std::string line;
    ASSERT_TRUE(std::getline(in, line));
    EXPECT_EQ(nlohmann::json::parse(line)["coords"]["cp"], w.par->coords.cp);
    std::map<std::string, int> exchanges;
    while (std::getline(in, line)) {
      const auto e = nlohmann::json::parse(line);
      if (e["cat"] == "cp") ++exchanges[e["name"].get<std::string>()];
    }
    const int calls = 4 * 4;  // layers x micro-batches, per forward and per backward
    if (comm == CpComm::Ring)
      EXPECT_EQ(exchanges, (std::map<std::string, int>{{"cp ring send/recv K/V", calls * 2 * (l.cp - 1)},
                                                       {"cp ring send/recv K/V, dK/dV", calls * (2 * l.cp - 1)}}));
    else
      EXPECT_EQ(exchanges, (std::map<std::string, int>{{"cp all-gather K/V", 2 * calls},
                                                       {"cp reduce-scatter dK/dV", calls}}));
  }
}

// The memory plan knows the axis: every rank's measured parameters, gradients and optimizer
// states equal the plan, and its peak activations (the rank's seq_len / cp tokens, no attention
// probabilities) are within 1% of it.
TEST_F(ContextParallel, MemoryPlanMatchesMeasuredPeaks) {
  for (const Layout& l : std::vector<Layout>{{.cp = 2, .dp = 2, .distopt = true},
                                             {.cp = 4, .tp = 2, .sp = true},
                                             {.cp = 2, .tp = 2, .pp = 2, .recompute = RecomputeMode::Selective}}) {
    SCOPED_TRACE(l.str());
    auto w = test::make_subworld(*ops, l.grid(), l.sp, l.comm);
    if (!w.par) continue;
    Config cfg = l.apply(llama_config());
    validate_layout(cfg, l.grid().world_size());
    RankMemory plan = plan_rank_memory(cfg, w.par->rank);
    Trainer t(cfg, *ops, *w.par, &data);
    t.step();
    StepRecord m = t.step();
    EXPECT_EQ(m.memory.at(0).at("params"), plan.params);
    EXPECT_EQ(m.memory.at(0).at("grads"), plan.grads);
    EXPECT_EQ(m.memory.at(0).at("optimizer"), plan.optimizer);
    const int64_t act = m.memory.at(0).at("activations");
    EXPECT_LE(std::abs(static_cast<double>(act - plan.activations)) / plan.activations, 0.01)
        << "rank " << w.par->rank << ": measured " << act << " planned " << plan.activations;
  }
}

}  // namespace
}  // namespace tripod
