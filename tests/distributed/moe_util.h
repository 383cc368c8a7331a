// The mixtures of experts the distributed MoE tests train (test_moe: every axis at ep = 1;
// test_expert_parallel: expert parallelism), a layout of every axis, and a run's results.
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <vector>

#include "data/sample_source.h"
#include "harness.h"
#include "test_util.h"

namespace tripod::test {

struct Layout {
  int tp = 1, dp = 1, pp = 1, cp = 1;
  ScheduleKind schedule = ScheduleKind::OneFOneB;
  int vp = 1;
  bool sp = false, distopt = false;
  int ep = 1;
  MoeDispatcher dispatcher = MoeDispatcher::AllToAll;
  std::string str() const {
    return fmt::format("tp={} dp={} pp={} cp={}{}{}{}{}{}", tp, dp, pp, cp,
                       pp > 1 ? fmt::format(" {}", enum_name(schedule)) : "", vp > 1 ? fmt::format(" vp={}", vp) : "",
                       sp ? " +sp" : "", distopt ? " +distopt" : "",
                       ep > 1 ? fmt::format(" ep={} {}", ep, enum_name(dispatcher)) : "");
  }
  RankGrid grid() const { return RankGrid(tp, dp, pp, cp, ep); }
  SubWorld subworld(Ops& ops) const { return make_subworld(ops, grid(), sp, CpComm::Ring, dispatcher); }
  Config apply(Config c) const {
    c.parallel.tp = tp;
    c.parallel.dp = dp;
    c.parallel.pp = pp;
    c.parallel.cp = cp;
    c.parallel.ep = ep;
    c.parallel.moe_dispatcher = dispatcher;
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

inline Config base_config() {
  Config cfg = tiny_config(/*n_layers=*/4, /*d_model=*/32, /*n_heads=*/4, /*seq_len=*/16, /*vocab=*/100);
  cfg.train.micro_batch_size = 1;
  cfg.train.global_batch_size = 8;
  cfg.train.steps = 5;
  cfg.train.lr = 3e-3;
  cfg.train.warmup_steps = 2;
  cfg.train.grad_clip = 0.5;
  return cfg;
}

// Mixtral-like: every layer 4 SwiGLU experts, top 2 renormalised, with Qwen3's q/k norms.
inline Config mixtral_config() {
  Config cfg = base_config();
  make_llama(cfg.model, 2);
  cfg.model.qk_norm = true;
  cfg.model.moe = {.experts = 4, .top_k = 2, .ffn_hidden = 24, .aux_loss_coeff = 0.01, .z_loss_coeff = 0.001};
  return cfg;
}

// DeepSeek-like on GPT-2 (LayerNorm, learned positions, GELU; no biases, as DeepSeek has none: a
// zero-initialised bias element whose gradient cancels is Adam-amplified rounding noise on any
// grid): sigmoid router choosing by score + bias, a shared expert, layer 0 dense, each expert
// taking at most ceil(1.0 * 16 * 2 / 6) = 6 of a micro-batch's 32 pairs.
inline Config deepseek_config() {
  Config cfg = base_config();
  cfg.model.bias = false;
  cfg.model.moe = {.experts = 6, .top_k = 2, .ffn_hidden = 24, .shared_experts = 1, .router = MoeRouter::Sigmoid,
                   .first_dense = 1, .aux_loss_coeff = 0.001, .bias_update_rate = 0.01, .capacity_factor = 1.0};
  return cfg;
}

// A run's losses, whole weights, selection biases (by name) and last step's MoE metrics.
struct MoeRun {
  RunResult r;
  std::map<std::string, std::vector<float>> biases;
  std::vector<MoeLayerRecord> moe;
};

// Every rank's biases are the same bits as every other's holding the same layer: gathered to
// rank 0 of the grid and compared there; the returned map holds them all.
inline std::map<std::string, std::vector<float>> gather_biases(ParamRegistry& reg, ParallelContext& par) {
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

inline MoeRun run_moe(Config cfg, Ops& ops, ParallelContext& par, const SampleSource& data) {
  validate_layout(cfg, par.grid.world_size());
  Trainer t(cfg, ops, par, &data);
  MoeRun out;
  for (int64_t s = 0; s < cfg.train.steps; ++s) {
    StepRecord m = t.step();
    out.r.losses.push_back(m.loss);
    out.moe = m.moe;
  }
  out.r.params = gather_global_params(t.registry(), par, ops);
  out.biases = gather_biases(t.registry(), par);
  return out;
}

// Expects `got` to match the serial run `ref`: losses and weights by the tolerances of every
// layout, the selection biases and the last step's expert loads exactly (the biases move by the
// whole batch's counts), the balancing and z-losses within 1e-5 relative.
inline void expect_moe_matches(const MoeRun& got, const MoeRun& ref, const std::string& label, bool print) {
  expect_matches(got.r, ref.r, label, print);
  EXPECT_EQ(got.biases.size(), ref.biases.size());
  for (const auto& [name, v] : ref.biases) EXPECT_EQ(got.biases.at(name), v) << name;
  ASSERT_EQ(got.moe.size(), ref.moe.size());
  for (size_t i = 0; i < ref.moe.size(); ++i) {
    EXPECT_EQ(got.moe[i].tokens_per_expert, ref.moe[i].tokens_per_expert) << "layer " << ref.moe[i].layer;
    EXPECT_EQ(got.moe[i].dropped, ref.moe[i].dropped) << "layer " << ref.moe[i].layer;
    EXPECT_NEAR(got.moe[i].load_balancing_loss, ref.moe[i].load_balancing_loss, 1e-5 * ref.moe[i].load_balancing_loss);
    EXPECT_NEAR(got.moe[i].z_loss, ref.moe[i].z_loss, 1e-5 * ref.moe[i].z_loss);
  }
}

// The fixture of both tests: a config's serial run, and each layout's run against it.
class MoeLayoutTest : public ::testing::Test {
 protected:
  std::unique_ptr<Ops> ops = make_ops(Device::CPU);
  SyntheticSource data{16, 100, 3};

  MoeRun serial(const Config& cfg) {
    auto self = make_selfworld(*ops);
    return run_moe(cfg, *ops, *self.par, data);
  }
  void check(const Config& cfg, const MoeRun& ref, const std::vector<Layout>& layouts) {
    for (const Layout& l : layouts) {
      SCOPED_TRACE(l.str());
      auto w = l.subworld(*ops);
      if (!w.par) continue;
      MoeRun got = run_moe(l.apply(cfg), *ops, *w.par, data);
      expect_moe_matches(got, ref, l.str(), w.par->rank == 0);
    }
  }
};

}  // namespace tripod::test
