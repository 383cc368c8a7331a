// Activation recomputation and memory accounting on 8 ranks: gradients are bit-identical for
// none, selective and full on a (2,2,2) grid; every rank's measured peak bytes per category match
// the analytic plan (parameters, gradients and optimizer exactly; activations within 5%) for every
// recompute mode and schedule (split backwards and the V placement included), on a tiny and a
// medium config, GPT-2 and Llama-family.
#include <fmt/format.h>

#include "harness.h"
#include "test_util.h"
#include "model/memory_estimate.h"
#include "config/memory_plan.h"

namespace tripod {
namespace {

struct Case {
  const char* name;
  int dp, pp, tp, vp;
  const char* schedule;
  RecomputeMode mode;
  bool sp = false, distopt = false;
  int num_layers = -1;
};

class Memory : public ::testing::Test {
 protected:
  std::unique_ptr<Ops> ops = make_ops(Device::CPU);
};

// A mixture of experts with everything that holds memory of its own: q/k norms, a dense first
// layer, 4 experts (top 2) and a shared expert, a capacity (rows allocated at their bound), a
// selection bias (an f32 buffer among the parameters).
void make_moe(ModelConfig& m) {
  test::make_llama(m, 2);
  m.qk_norm = true;
  m.moe = {.experts = 4, .top_k = 2, .ffn_hidden = 24, .shared_experts = 1, .first_dense = 1,
           .aux_loss_coeff = 0.01, .z_loss_coeff = 0.001, .bias_update_rate = 0.001, .capacity_factor = 1.25};
}

TEST_F(Memory, RecomputeModesGiveBitIdenticalWeightsOnTwoByTwoByTwo) {
  for (const char* arch : {"gpt2", "llama", "moe"}) {
    SCOPED_TRACE(arch);
    const bool llama = std::string(arch) == "llama", moe = std::string(arch) == "moe";
    SyntheticSource data(16, 100, 3);
    std::vector<std::map<std::string, std::vector<float>>> results;
    for (RecomputeMode mode : {RecomputeMode::None, RecomputeMode::Selective, RecomputeMode::Full}) {
      auto w = test::make_subworld(*ops, RankGrid(2, 2, 2));
      Config cfg = test::tiny_config(4, 32, 4, 16, 100);
      if (llama) test::make_llama(cfg.model, 2);
      if (moe) make_moe(cfg.model);
      cfg.parallel.tp = cfg.parallel.pp = cfg.parallel.dp = 2;
      cfg.train.micro_batch_size = 1;
      cfg.train.global_batch_size = 8;
      cfg.train.steps = 2;
      cfg.recompute.mode = mode;
      results.push_back(test::run_training(cfg, *ops, *w.par, data).params);
    }
    for (size_t m = 1; m < results.size(); ++m)
      for (auto& [name, v] : results[0])
        EXPECT_EQ(0, std::memcmp(v.data(), results[m][name].data(), v.size() * 4)) << name << " differs in mode " << m;
  }
}

TEST_F(Memory, MeasuredPeaksMatchThePlan) {
  struct Size {
    const char* name;
    int layers, d_model, heads, seq, vocab, micro;
    int kv_heads = 0;  // > 0: a Llama-family model with these key/value heads
    bool moe = false;  // make_moe's mixture of experts (a Llama-family model)
  };
  // 8 layers split into pp*vp stages; heads, key/value heads and ffn divisible by tp.
  const Size tiny{"tiny", 8, 32, 4, 16, 100, 2}, medium{"medium", 8, 256, 8, 128, 2048, 2};
  const Size tiny_llama{"tiny llama", 8, 32, 4, 16, 100, 2, 2}, medium_llama{"medium llama", 8, 256, 8, 128, 2048, 2, 2};
  const Size tiny_moe{"tiny moe", 8, 32, 4, 16, 100, 2, 2, true};
  std::vector<Case> cases;
  for (RecomputeMode mode : {RecomputeMode::None, RecomputeMode::Selective, RecomputeMode::Full}) {
    cases.push_back({"gpipe", 1, 4, 2, 1, "gpipe", mode});
    cases.push_back({"1f1b", 2, 2, 2, 1, "1f1b", mode, true});
    cases.push_back({"interleaved", 1, 4, 2, 2, "interleaved", mode, false, true});
    cases.push_back({"serial", 1, 1, 1, 1, "1f1b", mode});
  }
  cases.push_back({"1f1b first 2 layers full", 1, 2, 1, 1, "1f1b", RecomputeMode::Full, false, false, 2});
  // Split backwards (state held between I and W) and the V placement (rank 0 holds both ends).
  cases.push_back({"zb-h1", 2, 2, 2, 1, "zb-h1", RecomputeMode::None, true});
  cases.push_back({"zb-h2", 1, 4, 2, 1, "zb-h2", RecomputeMode::Full});
  cases.push_back({"zbv", 2, 2, 2, 2, "zbv", RecomputeMode::Selective, true, true});
  for (const Size& sz : {tiny, medium, tiny_llama, medium_llama, tiny_moe}) {
    SyntheticSource data(sz.seq, sz.vocab, 3);
    for (const Case& c : cases) {
      std::string label = fmt::format("{} {} (dp,pp,tp)=({},{},{}) vp={} {}{}{}", sz.name, c.name, c.dp, c.pp, c.tp,
                                      c.vp, enum_name(c.mode), c.sp ? " +sp" : "", c.distopt ? " +distopt" : "");
      SCOPED_TRACE(label);
      RankGrid grid(c.tp, c.dp, c.pp);
      auto w = test::make_subworld(*ops, grid, c.sp);
      if (!w.par) continue;
      Config cfg = test::tiny_config(sz.layers, sz.d_model, sz.heads, sz.seq, sz.vocab);
      if (sz.kv_heads > 0) test::make_llama(cfg.model, sz.kv_heads);
      if (sz.moe) make_moe(cfg.model);
      ParallelConfig& pc = cfg.parallel;
      pc.tp = c.tp, pc.pp = c.pp, pc.dp = c.dp, pc.vp = c.vp, pc.schedule = *parse_enum<ScheduleKind>(c.schedule);
      pc.sequence_parallel = c.sp, pc.distributed_optimizer = c.distopt, pc.bucket_mb = 0.05;
      pc.placement = pc.schedule == ScheduleKind::Zbv ? Placement::V : Placement::Loop;
      cfg.train.micro_batch_size = sz.micro;
      cfg.train.global_batch_size = sz.micro * c.dp * 4;  // 4 micro-batches per pipeline
      cfg.recompute = {.mode = c.mode, .num_layers = c.num_layers};
      validate_layout(cfg, grid.world_size());
      RankMemory plan = plan_rank_memory(cfg, w.par->rank);
      Trainer t(cfg, *ops, *w.par, &data);
      t.step();
      StepRecord m = t.step();
      const auto& mem = m.memory;
      EXPECT_EQ(mem.at(0).at("params"), plan.params);
      EXPECT_EQ(mem.at(0).at("grads"), plan.grads);
      EXPECT_EQ(mem.at(0).at("optimizer"), plan.optimizer);
      int64_t act = mem.at(0).at("activations");
      double err = std::abs(static_cast<double>(act - plan.activations)) / plan.activations;
      // The plan walks the same tensors the layers keep, so it is exact; 1% leaves room for
      // nothing but a change in what a layer keeps (the bar is 5%).
      EXPECT_LE(err, 0.01) << "rank " << w.par->rank << ": measured " << act << " planned " << plan.activations;
      if (c.mode == RecomputeMode::Full && c.num_layers < 0 && c.pp == 1 && !sz.moe) {
        // Full recomputation: every layer's input, one layer's working set (and the rerun's
        // output), the head's tensors and the tokens; nothing else.
        ActivationShape s{.B = sz.micro, .T = sz.seq, .tp = c.tp, .sequence_parallel = c.sp, .act_bytes = 4};
        const int64_t N = s.B * s.T, x = N * sz.d_model * 4;
        const int64_t head = x + 2 * N * 4 + N * cfg.model.padded_vocab(c.tp) * 4;
        const int64_t bound = 2 * N * 4 + sz.layers * x + layer_saved_bytes(cfg.model, s, RecomputeMode::Selective) +
                              x + x + head;
        EXPECT_LE(act, bound) << "full recomputation keeps more than inputs + one layer";
      }
      // Gather the worst error to rank 0 for the printout.
      double worst = err;
      MPI_Allreduce(MPI_IN_PLACE, &worst, 1, MPI_DOUBLE, MPI_MAX, static_cast<MpiComm*>(w.par->world.get())->handle());
      if (w.par->rank == 0)
        fmt::print("{:<62} rank 0 activations {:>10} measured {:>10} planned; worst rank error {:.2f}%\n", label, act,
                   plan.activations, 100 * worst);
    }
  }
}

}  // namespace
}  // namespace tripod
