// Tensor and data parallelism against the single-process run (4 ranks under mpirun): for every
// layout, the loss of each of 5 steps and the final weights match within 1e-5 relative, for GPT-2
// and for a Llama-family model (grouped-query attention split over TP, rope, SwiGLU, untied head).
#include <fmt/format.h>

#include "harness.h"
#include "test_util.h"

namespace tripod {
namespace {

struct Layout {
  int tp, dp;
  bool sp, distopt;
  std::string str() const { return fmt::format("tp={} dp={}{}{}", tp, dp, sp ? " +sp" : "", distopt ? " +distopt" : ""); }
};

Config base_config() {
  // n_heads and ffn divisible by 4; micro-batch tokens divisible by 4 for SP; the global batch
  // of 8 gives 2 micro-batches per rank at dp=2 (gradient accumulation is exercised too).
  Config cfg = test::tiny_config(2, 32, 4, 16, 100);
  cfg.train.micro_batch_size = 2;
  cfg.train.global_batch_size = 8;
  cfg.train.steps = 5;
  cfg.train.lr = 3e-3;
  cfg.train.warmup_steps = 2;
  cfg.train.grad_clip = 0.5;  // clipping is active: the global norm must be right
  return cfg;
}

// A Llama-family model of the same size: 8 query heads over 4 key/value heads (so tp = 4 still
// holds whole key/value heads), rope, RMSNorm, SwiGLU, no biases, untied head.
Config llama_config() {
  Config cfg = base_config();
  cfg.model.n_heads = 8;
  test::make_llama(cfg.model, 4);
  return cfg;
}

void every_layout_matches_serial(const Config& cfg) {
  auto ops = make_ops(Device::CPU);
  SyntheticSource data(16, 100, 3);
  test::RunResult serial;
  {
    auto self = test::make_selfworld(*ops);
    serial = test::run_training(cfg, *ops, *self.par, data);
  }
  std::vector<Layout> layouts;
  for (auto [tp, dp] : std::vector<std::pair<int, int>>{{1, 1}, {2, 1}, {4, 1}, {1, 2}, {1, 4}, {2, 2}})
    for (bool sp : {false, true})
      for (bool distopt : {false, true})
        if ((!sp || tp > 1) && (!distopt || dp > 1)) layouts.push_back({tp, dp, sp, distopt});
  for (const Layout& l : layouts) {
    SCOPED_TRACE(l.str());
    RankGrid grid(l.tp, l.dp, 1);
    auto w = test::make_subworld(*ops, grid, l.sp);
    if (!w.par) continue;
    Config c = cfg;
    c.parallel.tp = l.tp;
    c.parallel.dp = l.dp;
    c.parallel.sequence_parallel = l.sp;
    c.parallel.distributed_optimizer = l.distopt;
    c.parallel.bucket_mb = 0.01;  // several buckets
    auto r = test::run_training(c, *ops, *w.par, data);
    ASSERT_EQ(r.losses.size(), serial.losses.size());
    test::expect_matches(r, serial, l.str(), w.par->rank == 0);
  }
}

TEST(TensorDataParallel, EveryLayoutMatchesSerial) { every_layout_matches_serial(base_config()); }

TEST(TensorDataParallel, LlamaEveryLayoutMatchesSerial) { every_layout_matches_serial(llama_config()); }

}  // namespace
}  // namespace tripod
