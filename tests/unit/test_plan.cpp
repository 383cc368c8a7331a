// The planner: hardware files (strict keys), the cost model on hand-computable cases (one GEMM,
// a ring all-reduce, a 1F1B pipeline of equal stages), the layout search (every layout it emits
// validates; nothing that fits is missed), and `tripod plan` / `tripod calibrate` on the command
// line (one JSON object; bad input as one "error:" line and exit 2).
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <map>
#include <set>
#include <tuple>

#include "cli_util.h"
#include "core/error.h"
#include "parallel/pipeline/schedules.h"
#include "parallel/pipeline/simulate.h"
#include "plan/calibrate.h"
#include "plan/planner.h"
#include "config/layout.h"
#include "kernels/op.h"

namespace tripod {
namespace {

namespace fs = std::filesystem;

constexpr double kGiB = 1024.0 * 1024 * 1024;

const char* kHardware = R"(
[device]
name = "test"
kind = "cuda"
peak_tflops = 100
memory_gib = 1
memory_bandwidth_gbs = 1000
gpus_per_node = 4
[intra_node]
bandwidth_gbs = 100
latency_us = 10
[inter_node]
bandwidth_gbs = 10
latency_us = 20
[efficiency]
gemm = 0.5
gemm_half_dim = 100
collective = 1
)";

ModelConfig small_model() {
  ModelConfig m;
  m.n_layers = 4;
  m.n_heads = 4;
  m.d_model = 64;
  m.seq_len = 32;
  m.vocab_size = 256;
  return m;
}

// small_model() in micro-batches of 2, 8 sequences a step (the layout not yet validated).
Config small_config() {
  Config cfg;
  cfg.model = small_model();
  cfg.train.micro_batch_size = 2;
  cfg.train.global_batch_size = 8;
  return cfg;
}

TEST(Hardware, SingleGemmFromTheEfficiencyCurve) {
  Hardware hw = parse_hardware(kHardware, "test.toml");
  // 2 * 1000 * 400 * 300 FLOPs at 100 TFLOP/s * 0.5 * 300 / (300 + 100).
  const double expect = 2.0 * 1000 * 400 * 300 / (100e12 * 0.5 * 0.75);
  EXPECT_NEAR(hw.gemm_time(1000, 400, 300, false), expect, 1e-9 * expect);
  EXPECT_NEAR(hw.gemm_time(1000, 400, 300, true), 2 * expect, 1e-9 * expect);
  // A measured shape gets its own time; a shape between two measured ones a rate between theirs.
  hw.gemm = {{256, 256, 256, 1e-3, 3e-3}, {1024, 256, 256, 2e-3, 5e-3}};
  EXPECT_DOUBLE_EQ(hw.gemm_time(256, 256, 256, false), 1e-3);
  EXPECT_DOUBLE_EQ(hw.gemm_time(1024, 256, 256, true), 5e-3);
  const double rate = 2.0 * 512 * 256 * 256 / hw.gemm_time(512, 256, 256, false);
  EXPECT_GT(rate, 2.0 * 256 * 256 * 256 / 1e-3);
  EXPECT_LT(rate, 2.0 * 1024 * 256 * 256 / 2e-3);
}

TEST(Hardware, RingAllReduceAndMeasuredCollectives) {
  Hardware hw = parse_hardware(kHardware, "test.toml");
  // Ring all-reduce of 1 GB over 4 ranks inside a node: 2 (n-1)/n bytes over 100 GB/s, and
  // 2 (n-1) latencies of 10 us.
  EXPECT_NEAR(hw.collective_time(Collective::AllReduce, 4, 1'000'000'000, true), 0.015 + 60e-6, 1e-12);
  // Across nodes: 10 GB/s, 20 us.
  EXPECT_NEAR(hw.collective_time(Collective::AllGather, 4, 1'000'000'000, false), 0.075 + 60e-6, 1e-12);
  EXPECT_NEAR(hw.collective_time(Collective::SendRecv, 2, 1'000'000, true), 1e-5 + 1e-5, 1e-15);
  EXPECT_EQ(hw.collective_time(Collective::AllReduce, 1, 1000, true), 0);
  // Measured points: interpolated between sizes, scaled by bandwidth beyond the largest.
  hw.collectives = {{Collective::AllReduce, 4, 1000, 1e-3}, {Collective::AllReduce, 4, 3000, 3e-3}};
  EXPECT_NEAR(hw.collective_time(Collective::AllReduce, 4, 2000, true), 2e-3, 1e-15);
  EXPECT_NEAR(hw.collective_time(Collective::AllReduce, 4, 6000, true), 6e-3, 1e-15);
}

TEST(Hardware, FileRoundTripsAndRefusesBadKeys) {
  Hardware hw = parse_hardware(kHardware, "test.toml");
  hw.gemm = {{256, 128, 64, 1e-4, 2e-4}};
  hw.attention = {{128, 64, 1e-5, 3e-5}};
  hw.collectives = {{Collective::ReduceScatter, 2, 4096, 5e-5}};
  hw.elementwise[static_cast<int>(Elementwise::Gelu)] = {1e-9, 2e-9};
  Hardware back = parse_hardware(hardware_to_toml(hw), "round.toml");
  EXPECT_EQ(back.gpus_per_node, 4);
  EXPECT_DOUBLE_EQ(back.gemm_time(256, 128, 64, true), 2e-4);
  EXPECT_DOUBLE_EQ(back.attention_time(3, 128, 64, false), 3e-5);
  EXPECT_DOUBLE_EQ(back.elementwise_time(Elementwise::Gelu, 10, true), 2e-8);
  EXPECT_DOUBLE_EQ(back.collective_time(Collective::ReduceScatter, 2, 4096, true), 5e-5);

  auto error_of = [](const std::string& text) {
    try {
      parse_hardware(text, "bad.toml");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::string base = kHardware;
  {
    std::string e = error_of(base + "[device2]\nx = 1\n");
    EXPECT_NE(e.find("unknown section [device2]"), std::string::npos) << e;
    std::string t = base;
    t.replace(t.find("gpus_per_node"), 0, "peak_tflop = 3\n");
    e = error_of(t);
    EXPECT_NE(e.find("unknown key peak_tflop"), std::string::npos) << e;
    t = base;
    t.replace(t.find("memory_gib = 1"), 14, "");
    e = error_of(t);
    EXPECT_NE(e.find("missing memory_gib"), std::string::npos) << e;
    t = base;
    t.replace(t.find("gemm = 0.5"), 10, "gemm = 1.5");
    e = error_of(t);
    EXPECT_NE(e.find("[efficiency]"), std::string::npos) << e;
  }
}

TEST(Hardware, AttentionRatesByTheCallsTotalFlops) {
  // Calls of 1 and 64 pairs at t = 1024 (the small call 8x slower per FLOP, as a launch-bound GPU
  // call is) and of 16 pairs at t = 2048: a call's rate comes from measured calls of its total
  // FLOPs at its length, held beyond the largest; between lengths, by log(t) at the same FLOPs.
  Hardware hw = parse_hardware(kHardware, "test.toml");
  const AttentionPoint one{.t = 1024, .d = 64, .pairs = 1}, many{.t = 1024, .d = 64, .pairs = 64};
  const double slow = 1e12, fast = 8e12;  // FLOP/s
  hw.attention = {{.t = 1024, .d = 64, .forward_s = one.flops(false) / slow, .backward_s = one.flops(true) / slow, .pairs = 1},
                  {.t = 1024, .d = 64, .forward_s = many.flops(false) / fast, .backward_s = many.flops(true) / fast, .pairs = 64}};
  auto rate = [&](int64_t pairs, int64_t t, bool bwd) {
    return AttentionPoint{.t = t, .d = 64, .pairs = pairs}.flops(bwd) / hw.attention_time(pairs, t, 64, bwd);
  };
  EXPECT_NEAR(rate(1, 1024, false), slow, 1e-6 * slow);
  EXPECT_NEAR(rate(64, 1024, true), fast, 1e-6 * fast);
  EXPECT_NEAR(rate(8, 1024, false), (slow + fast) / 2, 1e-6 * fast);  // log2(8) is halfway to 64 in log FLOPs
  EXPECT_NEAR(rate(1536, 1024, false), fast, 1e-6 * fast);            // a micro-batch of 128 x 12 heads
  // The cost model multiplies nothing by pairs: 1536 pairs in one call are 1536x the FLOPs at the fast rate.
  EXPECT_NEAR(hw.attention_time(1536, 1024, 64, false), 1536 * one.flops(false) / fast, 1e-9);
  // A second length: at t = 1448 (halfway in log t) the rate at the same total FLOPs is between.
  const AttentionPoint longer{.t = 2048, .d = 64, .pairs = 16};
  hw.attention.push_back({.t = 2048, .d = 64, .forward_s = longer.flops(false) / 4e12,
                          .backward_s = longer.flops(true) / 4e12, .pairs = 16});
  const double mid = rate(32, 1448, false);
  EXPECT_GT(mid, 4e12 * 0.999);
  EXPECT_LT(mid, fast * 1.001);
  // Files without `pairs` (per-pair times of an older calibration) load as calls of one pair, with
  // a warning naming the key; their per-pair rate then holds at every size, as before.
  std::string old = std::string(kHardware) + "[[attention]]\nt = 1024\nd = 64\nforward_s = 1e-4\nbackward_s = 3e-4\n";
  Hardware o = parse_hardware(old, "old.toml");
  ASSERT_EQ(o.warnings.size(), 1u);
  EXPECT_NE(o.warnings[0].find("`pairs`"), std::string::npos) << o.warnings[0];
  EXPECT_NEAR(o.attention_time(1536, 1024, 64, false), 1536 * 1e-4, 1e-12);
}

TEST(Hardware, ElementwiseTimesBySize) {
  // Per-element times interpolated in log(elements) between measured calls, held beyond the
  // largest (bandwidth), and below the smallest call its time (a launch's latency).
  Hardware hw = parse_hardware(kHardware, "test.toml");
  hw.elementwise_points = {{Elementwise::Add, 1 << 16, 4e-6, 4e-6}, {Elementwise::Add, 1 << 24, 1e-12 * (1 << 24), 2e-12 * (1 << 24)}};
  EXPECT_NEAR(hw.elementwise_time(Elementwise::Add, 1 << 24, false), 1e-12 * (1 << 24), 1e-18);
  EXPECT_NEAR(hw.elementwise_time(Elementwise::Add, 1 << 28, false), 1e-12 * (1 << 28), 1e-15);
  EXPECT_NEAR(hw.elementwise_time(Elementwise::Add, 1 << 10, false), 4e-6, 1e-18);
  const double per_small = 4e-6 / (1 << 16), per_large = 1e-12;
  EXPECT_NEAR(hw.elementwise_time(Elementwise::Add, 1 << 20, false) / (1 << 20), (per_small + per_large) / 2, 1e-15);
  // Ops without points keep the bandwidth figure.
  EXPECT_NEAR(hw.elementwise_time(Elementwise::Gelu, 1000, false), 1000 * 2 * 2 / (1000e9 * 0.8), 1e-15);
  // The file: [[elementwise]] points round-trip; the older [elementwise] table of per-element
  // times loads with a warning; an unknown op is refused naming it.
  Hardware back = parse_hardware(hardware_to_toml(hw), "round.toml");
  ASSERT_EQ(back.elementwise_points.size(), 2u);
  EXPECT_TRUE(back.warnings.empty());
  EXPECT_NEAR(back.elementwise_time(Elementwise::Add, 1 << 20, true), hw.elementwise_time(Elementwise::Add, 1 << 20, true),
              1e-5 * hw.elementwise_time(Elementwise::Add, 1 << 20, true));  // 6 digits in the file
  Hardware old = parse_hardware(std::string(kHardware) + "[elementwise]\nadd_forward_s = 1e-12\n", "old.toml");
  EXPECT_NEAR(old.elementwise_time(Elementwise::Add, 1000, false), 1e-9, 1e-21);
  ASSERT_EQ(old.warnings.size(), 1u);
  EXPECT_NE(old.warnings[0].find("[elementwise]"), std::string::npos);
  try {
    parse_hardware(std::string(kHardware) + "[[elementwise]]\nop = \"softmax\"\nelements = 4\nforward_s = 1\n"
                   "backward_s = 1\n", "bad.toml");
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("op = \"softmax\""), std::string::npos) << e.what();
  }
  // The calibration from before sizes were recorded (an H200 file of 2026-11-27) loads,
  // and says why it predicts a GPU too slow.
  Hardware h200 = parse_hardware(test::slurp(TRIPOD_SOURCE_PATH "/tests/fixtures/hardware_h200_2026-11-27.toml"), "h200");
  EXPECT_EQ(h200.warnings.size(), 2u);
}

// ---- calibration sizing ------------------------------------------------------------------

TEST(Calibrate, DefaultGridFillsTheDevice) {
  // An 80 GiB GPU with a 50 MiB L2: the largest calls are what real micro-batches make.
  const Ops::DeviceInfo gpu{.memory_bytes = int64_t{80} << 30, .cache_bytes = int64_t{50} << 20};
  const CalibrateGrid g = default_grid(Device::CUDA, gpu);
  int64_t rows = 0, elements = 0;
  for (const GemmPoint& p : g.gemm) rows = std::max(rows, p.m);
  EXPECT_GE(rows, 128 * 1024);  // GPT-2 124M at micro-batch 128 (the H200's bench) x seq 1024
  for (const ElementwiseShape& s : g.elementwise) elements = std::max(elements, s.elements());
  EXPECT_GE(elements * 2, 8 * (int64_t{50} << 20));  // bf16 tensors 8x the L2
  // Per (t, d), calls of 1 up to attention_tokens / t pairs: at t = 1024 a micro-batch of 128
  // sequences x 16 heads, so a call of GPT-2 124M at micro-batch 128 (1536 pairs) is within.
  std::map<std::pair<int64_t, int64_t>, std::pair<int64_t, int64_t>> range;  // (t, d) -> (fewest, most) pairs
  for (const AttentionShape& c : g.attention) {
    auto [it, fresh] = range.try_emplace({c.t, c.d}, c.pairs(), c.pairs());
    it->second = {std::min(it->second.first, c.pairs()), std::max(it->second.second, c.pairs())};
    EXPECT_LE(c.heads, 16);
  }
  EXPECT_EQ(range.size(), 10u);  // 5 lengths x 2 head dimensions
  for (const auto& [td, pairs] : range) {
    EXPECT_EQ(pairs.first, 1);
    EXPECT_EQ(pairs.second * td.first, attention_tokens(Device::CUDA)) << td.first;
  }
  EXPECT_GE((range[{1024, 64}].second), 128 * 12);
  // A smaller device leaves out what it cannot hold (a quarter of its memory per call).
  const CalibrateGrid small = default_grid(Device::CUDA, {.memory_bytes = int64_t{8} << 30, .cache_bytes = 0});
  EXPECT_LT(small.gemm.size(), g.gemm.size());
  for (const GemmPoint& p : small.gemm) EXPECT_LE(2 * (2 * p.m * p.k + 2 * p.m * p.n + p.n * p.k) + 4 * p.n * p.k, int64_t{2} << 30);
  // CPUs: 8x this core's last-level cache in f32.
  const CalibrateGrid cpu = default_grid(Device::CPU, {.memory_bytes = int64_t{16} << 30, .cache_bytes = int64_t{32} << 20});
  elements = 0;
  for (const ElementwiseShape& s : cpu.elementwise) elements = std::max(elements, s.elements());
  EXPECT_GE(elements * 4, 8 * (int64_t{32} << 20));
  EXPECT_GT(cpu.min_time_s, g.min_time_s);  // shared CPUs loop longer
  // The cache the calls rotate their tensors through: the device's, else 64 MiB (32 on CPUs).
  EXPECT_EQ(g.cache_bytes, int64_t{50} << 20);
  EXPECT_EQ(small.cache_bytes, int64_t{64} << 20);
  EXPECT_EQ(cpu.cache_bytes, int64_t{32} << 20);
}

TEST(Calibrate, BackwardCallsReadTensorsOutOfCache) {
  // A backward (GEMM, attention, layer norm, GELU) reads what its forward saved long before, out
  // of cache; timed over and over on the same tensors it would find them in cache. Each timed
  // call takes the next of as many copies of its tensors as span twice the last-level cache: the
  // calibration's peak workspace grows with the cache it is told of.
  auto ops = make_ops(Device::CPU);
  auto peak = [&](CalibrateGrid g, int64_t cache) {
    g.cache_bytes = cache;
    g.repeats = 1;
    g.min_time_s = 1e-4;
    Hardware hw;
    ops->allocator().release_cache();
    ops->allocator().stats().reset_peaks();
    calibrate(*ops, nullptr, g, hw);
    return ops->allocator().stats().peak(MemCategory::Workspace);
  };
  CalibrateGrid attention, gemm;
  attention.attention = {{.t = 64, .d = 32, .batch = 1, .heads = 2}};
  gemm.gemm = {{256, 64, 64}};
  // Attention: a call's saved tensors (q, k, v and their gradients, the output, the row
  // statistics and the probabilities the CPU keeps) are 148 KB, its sizing figure 164 KB, so a
  // 1.3 MB cache spans 16 copies; GEMM: the input and its gradient, 128 KB, 32 copies.
  const int64_t copy = 4 * (2 * 64 * 6 * 32 + 64 * 2 * 32 + 2 * 64 + (ops->keeps_attention_probs() ? 2 * 64 * 64 : 0));
  const int64_t att1 = peak(attention, 0);
  EXPECT_EQ(peak(attention, 8 * 164352), att1 + 15 * copy);
  EXPECT_EQ(peak(attention, int64_t{1} << 40), att1 + 63 * copy);  // at most 64 copies
  EXPECT_EQ(peak(gemm, 16 * 131072), peak(gemm, 0) + 31 * 131072);
  // Layer norm: the input, its row statistics and the input gradient, 16.5 KB, 16 copies; GELU:
  // the input and its gradient, 32 KB, 32 copies.
  CalibrateGrid norm, gelu;
  norm.elementwise = {{Elementwise::LayerNorm, 64, 32, 0}};
  gelu.elementwise = {{Elementwise::Gelu, 4096, 1, 0}};
  EXPECT_EQ(peak(norm, 8 * 16896), peak(norm, 0) + 15 * 16896);
  EXPECT_EQ(peak(gelu, 16 * 32768), peak(gelu, 0) + 31 * 32768);
}

// `cfg` on one GPU's worth of a layout: tp ranks, one stage, one replica, micro-batch `mbs` as
// the whole batch, no sequence parallelism, distributed optimizer or recomputation.
Config one_stage(const Config& cfg, int tp, int mbs) {
  Config c = cfg;
  c.parallel.tp = tp;
  c.parallel.pp = 1;
  c.parallel.dp = 1;
  c.parallel.sequence_parallel = false;
  c.parallel.distributed_optimizer = false;
  c.train.micro_batch_size = mbs;
  c.train.global_batch_size = mbs;
  c.train.device = Device::CUDA;
  c.recompute.mode = RecomputeMode::None;
  validate_layout(c, tp);
  return c;
}

TEST(Calibrate, ModelGridMeasuresTheCallsTheCostModelMakes) {
  // GPT-2 124M at micro-batches 1 and 16 for tp 1 and 2: every GEMM, attention call and
  // memory-bound call the cost model times for those layouts is a measured point of the grid
  // (the attention call's FLOPs and the GEMM rows are the micro-batch's), so a file calibrated
  // with --model predicts them from their own measurements.
  Config cfg = load_config(TRIPOD_SOURCE_PATH "/configs/gpt2_124m.toml", {}, {.training = false, .data = false});
  const CalibrateGrid g = model_grid(Device::CUDA, cfg.model, 2, {1, 16}, int64_t{25} << 20);
  // The gradient reduction's 25 MiB buckets and each micro-batch's activations are messages.
  for (int64_t bytes : {int64_t{25} << 20, int64_t{1024} * 768 * 4, int64_t{16} * 1024 * 768 * 4})
    EXPECT_TRUE(std::count(g.message_bytes.begin(), g.message_bytes.end(), bytes)) << bytes;
  Hardware hw = parse_hardware(kHardware, "test.toml");
  std::set<std::tuple<int64_t, int64_t, int64_t>> gemms;
  for (const GemmPoint& p : g.gemm) {
    gemms.insert({p.m, p.n, p.k});
    hw.gemm.push_back({p.m, p.n, p.k, 1e-3, 2e-3});
  }
  std::set<std::tuple<int64_t, int64_t, int64_t>> calls;
  for (const AttentionShape& c : g.attention) {
    calls.insert({c.t, c.d, c.pairs()});
    EXPECT_TRUE(c.heads == 12 || c.heads == 6) << c.heads;  // a micro-batch of sequences x a TP rank's heads
    hw.attention.push_back({.t = c.t, .d = c.d, .forward_s = 1e-3, .backward_s = 2e-3, .pairs = c.pairs()});
  }
  std::set<std::pair<int, int64_t>> sizes;
  for (const ElementwiseShape& s : g.elementwise) {
    sizes.insert({static_cast<int>(s.op), s.elements()});
    hw.elementwise_points.push_back({s.op, s.elements(), 1e-4, 2e-4});
  }
  for (int tp : {1, 2})
    for (int mbs : {1, 16}) {
      SCOPED_TRACE(fmt::format("tp {} mbs {}", tp, mbs));
      const int64_t N = int64_t{mbs} * 1024, C = 768, F = 3072, V = cfg.model.padded_vocab(tp) / tp;
      for (auto [n, k] : {std::pair<int64_t, int64_t>{3 * C / tp, C}, {C, C / tp}, {F / tp, C}, {C, F / tp}, {V, C}})
        EXPECT_TRUE(gemms.count({N, n, k})) << n << " " << k;
      EXPECT_TRUE(calls.count({1024, 64, int64_t{mbs} * 12 / tp}));
      EXPECT_TRUE(sizes.count({static_cast<int>(Elementwise::LayerNorm), N * C}));
      EXPECT_TRUE(sizes.count({static_cast<int>(Elementwise::Gelu), N * F / tp}));
      EXPECT_TRUE(sizes.count({static_cast<int>(Elementwise::CrossEntropy), N * V}));
      EXPECT_TRUE(sizes.count({static_cast<int>(Elementwise::Embedding), N * C}));
      // The optimizer's passes over a rank's gradients: AdamW, and an add for zeroing and norm.
      for (Elementwise op : {Elementwise::AdamW, Elementwise::Add})
        EXPECT_TRUE(sizes.count({static_cast<int>(op), cfg.model.num_params(tp) / tp}));
      // The predicted forward of a layer is then the measured points' times exactly: 4 GEMMs,
      // one attention call, 2 LayerNorms and 2 adds; the GELU runs in a GEMM's epilogue on CUDA,
      // half a GELU forward with the GEMMs each way (sequence parallelism off).
      const StepPrediction p = predict_step(one_stage(cfg, tp, mbs), hw);
      const ChunkTimes& t = p.stages[0];
      EXPECT_NEAR(t.f.gemm, 12 * (4 * 1e-3 + 0.5 * 1e-4) + 1e-3, 1e-12);
      EXPECT_NEAR(t.f.attention, 12 * 1e-3, 1e-12);
      EXPECT_NEAR(t.f.elementwise, 12 * 4 * 1e-4 + 1e-4 + 2 * 1e-4, 1e-12);  // + the head's norm and loss, the embedding
      EXPECT_NEAR(t.b.elementwise, 12 * 4 * 2e-4 + 2e-4 + 2 * 2e-4, 1e-12);
    }
}

TEST(Calibrate, ModelGridMeasuresLlamasOwnCalls) {
  // Llama-3.2-1B at tp 1 and 2: its attention calls are grouped-query ones; RMSNorm, SwiGLU (its
  // hidden width; the input is twice it) and rope (the query and key heads of this TP rank,
  // sequences of the model's length) are points of their own, and the layer's predicted forward is made of them: 4 GEMMs, the attention call
  // and the rotation, 2 RMSNorms, 2 adds and a SwiGLU.
  Config cfg = load_config(TRIPOD_SOURCE_PATH "/configs/llama3_2_1b.toml", {}, {.training = false, .data = false});
  const CalibrateGrid g = model_grid(Device::CUDA, cfg.model, 2, {1, 4});
  Hardware hw = parse_hardware(kHardware, "test.toml");
  for (const GemmPoint& p : g.gemm) hw.gemm.push_back({p.m, p.n, p.k, 1e-3, 2e-3});
  for (const AttentionShape& c : g.attention) {
    EXPECT_EQ(c.heads, 4 * c.kv());  // 32 query heads over 8 key/value heads, per TP rank
    hw.attention.push_back({.t = c.t, .d = c.d, .forward_s = 1e-3, .backward_s = 2e-3, .pairs = c.pairs()});
  }
  std::set<std::pair<int, int64_t>> sizes;
  for (const ElementwiseShape& s : g.elementwise) {
    sizes.insert({static_cast<int>(s.op), s.elements()});
    hw.elementwise_points.push_back({s.op, s.elements(), 1e-4, 2e-4});
    EXPECT_NE(s.op, Elementwise::LayerNorm);
    EXPECT_NE(s.op, Elementwise::Gelu);
    if (s.op == Elementwise::Rope) {
      EXPECT_EQ(s.head_dim, 64);
      EXPECT_EQ(s.seq, cfg.model.seq_len);
    }
  }
  const int64_t T = cfg.model.seq_len, C = 2048, F = 8192, L = cfg.model.n_layers;
  for (int tp : {1, 2})
    for (int mbs : {1, 4}) {
      SCOPED_TRACE(fmt::format("tp {} mbs {}", tp, mbs));
      const int64_t N = int64_t{mbs} * T;
      EXPECT_TRUE(sizes.count({static_cast<int>(Elementwise::RmsNorm), N * C}));
      EXPECT_TRUE(sizes.count({static_cast<int>(Elementwise::SwiGlu), N * F / tp}));
      EXPECT_TRUE(sizes.count({static_cast<int>(Elementwise::Rope), N * (32 + 8) / tp * 64}));
      // (one_stage sets aside the file's selective recomputation, which reruns the attention)
      const ChunkTimes& t = predict_step(one_stage(cfg, tp, mbs), hw).stages[0];
      EXPECT_NEAR(t.f.gemm, L * 4 * 1e-3 + 1e-3, 1e-12);
      EXPECT_NEAR(t.f.attention, L * (1e-3 + 1e-4), 1e-12);
      EXPECT_NEAR(t.b.attention, L * (2e-3 + 2e-4), 1e-12);
      EXPECT_NEAR(t.f.elementwise, L * 5 * 1e-4 + 1e-4 + 2 * 1e-4, 1e-12);  // + the head's norm and loss, the embedding
    }
}

TEST(CostModel, BreakdownAddsUpToTheStep) {
  // On every rank of every layout the families add up to the predicted step, and the mean is
  // over the pipeline ranks; one device has neither communication nor idle.
  Hardware hw = parse_hardware(kHardware, "test.toml");
  struct Case {
    int tp, pp, dp, vp;
    ScheduleKind kind;
    bool distopt;
  };
  for (const Case& k : {Case{1, 1, 1, 1, ScheduleKind::OneFOneB, false}, Case{2, 1, 1, 1, ScheduleKind::OneFOneB, false},
                        Case{1, 2, 1, 1, ScheduleKind::OneFOneB, false}, Case{1, 2, 1, 1, ScheduleKind::ZbH1, false},
                        Case{1, 4, 1, 1, ScheduleKind::OneFOneB, false}, Case{1, 2, 1, 2, ScheduleKind::Interleaved, false},
                        Case{1, 1, 2, 1, ScheduleKind::OneFOneB, true}, Case{2, 2, 2, 1, ScheduleKind::OneFOneB, true}}) {
    SCOPED_TRACE(fmt::format("tp {} pp {} dp {} vp {} {}", k.tp, k.pp, k.dp, k.vp, enum_name(k.kind)));
    Config cfg = small_config();
    cfg.train.device = Device::CUDA;
    cfg.train.global_batch_size = 32;
    cfg.parallel.tp = k.tp;
    cfg.parallel.pp = k.pp;
    cfg.parallel.dp = k.dp;
    cfg.parallel.vp = k.vp;
    cfg.parallel.schedule = k.kind;
    cfg.parallel.distributed_optimizer = k.distopt;
    validate_layout(cfg, k.tp * k.pp * k.dp);
    const StepPrediction p = predict_step(cfg, hw);
    ASSERT_EQ(static_cast<int>(p.ranks.size()), k.pp);
    StepBreakdown mean;
    for (const StepBreakdown& b : p.ranks) {
      EXPECT_NEAR(b.parts_sum(), p.step_time_s, 1e-9 * p.step_time_s);
      EXPECT_EQ(b.step, p.step_time_s);
      EXPECT_EQ(b.other, 0);
      EXPECT_GE(b.pipeline_idle, 0);
      EXPECT_GT(b.gemm, 0);
      EXPECT_GT(b.attention, 0);
      for (int i = 0; i < StepBreakdown::kParts; ++i) mean.part(i) += b.part(i) / k.pp;
    }
    for (int i = 0; i < StepBreakdown::kParts; ++i) EXPECT_NEAR(p.breakdown.part(i), mean.part(i), 1e-15);
    EXPECT_NEAR(p.breakdown.parts_sum(), p.step_time_s, 1e-9 * p.step_time_s);
    EXPECT_EQ(p.breakdown.optimizer, p.optimizer_s);
    if (k.tp == 1 && k.dp == 1 && k.pp == 1) {
      EXPECT_EQ(p.breakdown.communication, 0);
      EXPECT_NEAR(p.breakdown.pipeline_idle, 0, 1e-12 * p.step_time_s);
    }
    if (k.tp > 1 || k.dp > 1) {
      EXPECT_GT(p.breakdown.communication, 0);
    }
    if (k.pp > 1) {
      EXPECT_GT(p.breakdown.pipeline_idle, 0);
    }
    // Every rank runs each chunk's forward and backward once per micro-batch.
    const int M = cfg.train.global_batch_size / (cfg.train.micro_batch_size * k.dp);
    double gemm0 = 0;
    for (int c = 0; c < k.vp; ++c) {
      const ChunkTimes& t = p.stages[make_schedule(cfg).stage(0, c)];
      gemm0 += M * (t.f.gemm + t.b.gemm);
      EXPECT_NEAR(t.forward, t.f.total(), 1e-15);
      EXPECT_NEAR(t.backward, t.b.total(), 1e-15);
    }
    EXPECT_NEAR(p.ranks[0].gemm, gemm0, 1e-12);
  }
}

TEST(CostModel, OneF1BWithEqualStagesGivesTheClosedFormBubble) {
  // Equal stage times through the planner's per-stage path: bubble (p-1)/(m+p-1), makespan
  // (m+p-1)(f+b).
  for (int p : {2, 4, 8})
    for (int m : {p, 3 * p, 16}) {
      Schedule s = build_schedule("1f1b", p, 1, m);
      StageCosts stages{std::vector<double>(p, 0.3), std::vector<double>(p, 0.7), {}};
      Simulation sim = simulate(s, plan_pipeline(s), PipeCosts{}, stages);
      EXPECT_NEAR(sim.bubble, double(p - 1) / (m + p - 1), 1e-12) << p << " " << m;
      EXPECT_NEAR(sim.makespan, (m + p - 1) * 1.0, 1e-9);
    }
}

TEST(CostModel, StepTimeAddsUpOnOneDevice) {
  // One rank: the step is every micro-batch's forward and backward plus the optimizer.
  Hardware hw = parse_hardware(kHardware, "test.toml");
  Config cfg = small_config();
  cfg.train.device = Device::CUDA;
  validate_layout(cfg, 1);
  StepPrediction p = predict_step(cfg, hw);
  ASSERT_EQ(p.stages.size(), 1u);
  EXPECT_NEAR(p.pipeline_s, 4 * (p.stages[0].forward + p.stages[0].backward), 1e-15);
  EXPECT_NEAR(p.step_time_s, p.pipeline_s + p.optimizer_s, 1e-15);
  EXPECT_EQ(p.bubble, 0);
  // Full recomputation adds exactly one forward of every layer to the backward.
  Config full = cfg;
  full.recompute.mode = RecomputeMode::Full;
  StepPrediction q = predict_step(full, hw);
  EXPECT_GT(q.stages[0].backward, p.stages[0].backward);
  EXPECT_LT(q.memory.activations, p.memory.activations);
  EXPECT_EQ(q.memory.params, p.memory.params);
}

TEST(CostModel, TiedEmbeddingSyncOnlyWhereThePipelineEndsAreOnTwoRanks) {
  // pp = 2, dp = 1: nothing reduces over DP, so what follows the backward is the tied table's
  // sum alone. On the loop placement (1f1b) the first and last stage each hold a copy and
  // all-reduce it; on the V placement (zbv, dualpipev) both ends are on rank 0: no sync.
  Hardware hw = parse_hardware(kHardware, "test.toml");
  for (ScheduleKind kind : {ScheduleKind::OneFOneB, ScheduleKind::Zbv, ScheduleKind::DualPipeV})
    for (bool tied : {true, false}) {
      SCOPED_TRACE(fmt::format("{} tied {}", enum_name(kind), tied));
      Config cfg = small_config();
      cfg.model.tie_embeddings = tied;
      cfg.train.global_batch_size = 16;  // 8 micro-batches: dualpipev needs 2pp
      cfg.parallel.pp = 2;
      cfg.parallel.schedule = kind;
      cfg.parallel.placement = default_placement(kind);
      cfg.parallel.vp = default_vp(cfg.parallel.placement);
      validate_layout(cfg, 2);
      const StepPrediction p = predict_step(cfg, hw);
      const bool v = cfg.parallel.placement == Placement::V;
      if (!tied || v) {
        EXPECT_EQ(p.dp_exposed_s, 0);
        EXPECT_NEAR(p.step_time_s, p.pipeline_s + p.optimizer_s, 1e-15);
        continue;
      }
      // The table (256 x 64 f32) all-reduced by the two pipeline ranks over the node's link.
      const double sync = hw.collective_time(Collective::AllReduce, 2, 256 * 64 * 4, true);
      EXPECT_GT(sync, 0);
      EXPECT_NEAR(p.dp_exposed_s, sync, 1e-15);
      EXPECT_NEAR(p.step_time_s, p.pipeline_s + sync + p.optimizer_s, 1e-15);
    }
}

TEST(CostModel, LlamaShapes) {
  // Grouped-query attention shrinks the QKV GEMM; SwiGLU adds the gate GEMM and reads two inputs.
  Hardware hw = parse_hardware(kHardware, "test.toml");
  Config cfg = small_config();
  validate_layout(cfg, 1);
  Config llama = cfg;
  llama.model.mlp = MlpKind::SwiGlu;
  llama.model.ffn_hidden = 4 * 64;
  const double gelu = stage_times(cfg, hw)[0].forward, swiglu = stage_times(llama, hw)[0].forward;
  const int64_t N = 64, C = 64;
  // SwiGLU's activation is a pass of its own; a GELU on CUDA runs in its GEMM's epilogue (half a
  // GELU forward).
  const double act = 4 * (hw.elementwise_time(Elementwise::SwiGlu, N * 4 * C, false) -
                          hw.elementwise_time(Elementwise::Gelu, N * 4 * C, false) / 2);
  EXPECT_GT(act, 0);
  EXPECT_NEAR(swiglu - gelu, 4 * (hw.gemm_time(N, 2 * 4 * C, C, false) - hw.gemm_time(N, 4 * C, C, false)) + act,
              1e-12);
  Config gqa = llama;
  gqa.model.n_kv_heads = 1;
  const double qkv = 4 * (hw.gemm_time(N, 3 * C, C, false) - hw.gemm_time(N, (4 + 2) * 16, C, false));
  EXPECT_NEAR(swiglu - stage_times(gqa, hw)[0].forward, qkv, 1e-12);
}

// The largest stage cost (forward + backward of one micro-batch) of a split.
double max_stage_cost(const Config& cfg, const Hardware& hw, const std::vector<int>& split) {
  double worst = 0;
  for (const ChunkTimes& c : stage_times(cfg, hw, split)) worst = std::max(worst, c.forward + c.backward);
  return worst;
}

// Every split of n layers into k stages of at least one layer each.
void each_split(int n, int k, std::vector<int>& prefix, const std::function<void(const std::vector<int>&)>& f) {
  if (k == 1) {
    prefix.push_back(n);
    f(prefix);
    prefix.pop_back();
    return;
  }
  for (int first = 1; first <= n - (k - 1); ++first) {
    prefix.push_back(first);
    each_split(n - first, k - 1, prefix, f);
    prefix.pop_back();
  }
}

TEST(CostModel, AutoSplitMinimisesTheLargestStageCostLikeBruteForce) {
  // Against every split, on models whose head outweighs a layer (a large vocabulary) or not,
  // with recomputation of the first layer of each chunk only (layer costs then depend on their
  // place in the chunk), TP with sequence parallelism, vp 1 and 2 in both placements.
  Hardware hw = parse_hardware(kHardware, "test.toml");
  int cases = 0, uneven = 0;
  for (int layers : {5, 7, 10})
    for (int vocab : {256, 16384})
      for (auto [pp, vp, placement] : {std::tuple{2, 1, Placement::Loop}, std::tuple{3, 1, Placement::Loop},
                                       std::tuple{2, 2, Placement::Loop}, std::tuple{2, 2, Placement::V}})
        for (int tp : {1, 2})
          for (int rc : {0, 2}) {
            if (layers < pp * vp) continue;
            Config cfg = small_config();
            cfg.model.n_layers = layers;
            cfg.model.vocab_size = vocab;
            cfg.train.device = Device::CUDA;
            cfg.parallel.tp = tp;
            cfg.parallel.pp = pp;
            cfg.parallel.vp = vp;
            cfg.parallel.placement = placement;
            cfg.parallel.schedule = vp == 1 ? ScheduleKind::OneFOneB
                                    : placement == Placement::V ? ScheduleKind::Zbv : ScheduleKind::Interleaved;
            cfg.parallel.sequence_parallel = tp > 1;
            cfg.parallel.balance_layers = true;
            cfg.recompute.mode = static_cast<RecomputeMode>(rc);
            cfg.recompute.num_layers = 1;
            validate_layout(cfg, tp * pp);
            const std::vector<int> split = balanced_layers_per_stage(cfg, hw);
            SCOPED_TRACE(fmt::format("layers {} vocab {} pp {} vp {} tp {} rc {}: [{}]", layers, vocab, pp, vp, tp, rc,
                                     fmt::join(split, ",")));
            ASSERT_EQ(static_cast<int>(split.size()), pp * vp);
            EXPECT_EQ(std::accumulate(split.begin(), split.end(), 0), layers);
            EXPECT_GE(*std::min_element(split.begin(), split.end()), 1);
            double best = std::numeric_limits<double>::infinity();
            std::vector<int> prefix;
            each_split(layers, pp * vp, prefix,
                       [&](const std::vector<int>& x) { best = std::min(best, max_stage_cost(cfg, hw, x)); });
            EXPECT_NEAR(max_stage_cost(cfg, hw, split), best, 1e-12 * best);
            // balance_stages writes that split into the config; the layouts then use it.
            balance_stages(cfg, hw);
            EXPECT_EQ(cfg.parallel.layers_per_stage, split);
            EXPECT_EQ(make_rank_layout(cfg, 0).stage_layers, split);
            ++cases;
            uneven += *std::max_element(split.begin(), split.end()) != *std::min_element(split.begin(), split.end());
          }
  EXPECT_GT(cases, 50);
  EXPECT_GT(uneven, 10);  // the cases do exercise uneven splits
}

TEST(CostModel, BalancedStagesShrinkLlamaBubble) {
  // Llama-3.2-1B (128K vocabulary) on tp2 pp2 at 128 micro-batches, the issue's example: the head
  // makes the last stage heavier, so "auto" gives it fewer layers and the bubble shrinks.
  Config cfg = load_config(TRIPOD_SOURCE_PATH "/configs/llama3_2_1b.toml", {}, {.training = false, .data = false});
  Hardware hw = load_hardware(TRIPOD_SOURCE_PATH "/configs/hardware/h100_sxm.toml");
  cfg.parallel.tp = 2;
  cfg.parallel.pp = 2;
  cfg.train.micro_batch_size = 1;
  cfg.train.global_batch_size = 128;
  validate_layout(cfg, 4);
  const StepPrediction even = predict_step(cfg, hw);
  cfg.parallel.balance_layers = true;
  balance_stages(cfg, hw);
  const StepPrediction balanced = predict_step(cfg, hw);
  ASSERT_EQ(cfg.parallel.layers_per_stage.size(), 2u);
  EXPECT_GT(cfg.parallel.layers_per_stage[0], cfg.parallel.layers_per_stage[1]);
  EXPECT_LT(balanced.bubble, even.bubble / 2);
  EXPECT_LT(balanced.step_time_s, even.step_time_s);
}

TEST(CostModel, WeightGradientIsHalfTheBackwardGemmsOnTheDatasheet) {
  // Without measured GEMMs dX and dW of a GEMM cost the same, so W is half of each backward GEMM
  // (the layers' four and the head's) plus the embedding's gradient; I is the rest.
  Hardware hw = parse_hardware(kHardware, "test.toml");
  Config cfg = small_config();
  validate_layout(cfg, 1);
  const ChunkTimes t = stage_times(cfg, hw)[0];
  const int64_t N = 64, C = 64, V = cfg.model.padded_vocab(1);
  const double layer = hw.gemm_time(N, 3 * C, C, true) + hw.gemm_time(N, C, C, true) +
                       hw.gemm_time(N, 4 * C, C, true) + hw.gemm_time(N, C, 4 * C, true);
  const double expected = 4 * layer / 2 + hw.gemm_time(N, V, C, true) / 2 +
                          hw.elementwise_time(Elementwise::Embedding, N * C, true);
  EXPECT_NEAR(t.weight, expected, 1e-12 * expected);
  EXPECT_GT(t.input(), 0);
  // The planner's simulation takes them: ZB-H1 idles less than 1F1B on the same stages.
  Config pipe = cfg;
  pipe.parallel.pp = 2;
  pipe.train.global_batch_size = 16;
  validate_layout(pipe, 2);
  Config zb = pipe;
  zb.parallel.schedule = ScheduleKind::ZbH1;
  EXPECT_LT(predict_step(zb, hw).pipeline_s, predict_step(pipe, hw).pipeline_s);
}

TEST(Planner, SplitsPrintShort) {
  EXPECT_EQ(split_str({10, 6}), "10+6");
  EXPECT_EQ(split_str({2, 2}), "2+2");
  EXPECT_EQ(split_str({1, 1, 1}), "1x3");
  EXPECT_EQ(split_str({3, 2, 2, 2, 1}), "3+2x3+1");
}

TEST(Planner, RanksEveryLayoutWithItsBalancedSplit) {
  Hardware hw = parse_hardware(kHardware, "test.toml");
  Config base;
  base.model = small_model();
  base.model.n_layers = 6;
  base.model.vocab_size = 16384;  // a heavy head
  base.train.global_batch_size = 8;
  LayoutFilter f;
  f.pp = 2;
  PlanResult r = plan_layouts(base, hw, 2, f);
  ASSERT_FALSE(r.layouts.empty());
  bool uneven = false;
  for (const PlannedLayout& l : r.layouts) {
    EXPECT_EQ(l.cfg.parallel.layers_per_stage, balanced_layers_per_stage(l.cfg, hw));
    uneven |= l.cfg.parallel.layers_per_stage.front() != l.cfg.parallel.layers_per_stage.back();
    EXPECT_NE(layout_toml(l.cfg).find("layers_per_stage = ["), std::string::npos);
  }
  EXPECT_TRUE(uneven);
  // split=even: only even splits (6 layers over 2 or 6 virtual stages).
  f = parse_layout_filter("pp=2,split=even");
  for (const PlannedLayout& l : plan_layouts(base, hw, 2, f).layouts) {
    const int stages = 2 * l.cfg.parallel.vp;
    EXPECT_EQ(stage_layers(l.cfg), std::vector<int>(stages, 6 / stages));
  }
  EXPECT_THROW(parse_layout_filter("split=balanced"), InputError);
}

struct Key {
  int tp, pp, vp, mbs, rc;
  bool sp, dopt;
  int schedule;
  auto operator<=>(const Key&) const = default;
};
Key key_of(const Config& c) {
  return {c.parallel.tp, c.parallel.pp, c.parallel.vp, c.train.micro_batch_size,
          static_cast<int>(c.recompute.mode), c.parallel.sequence_parallel, c.parallel.distributed_optimizer,
          static_cast<int>(c.parallel.schedule)};
}

TEST(Planner, EmitsValidLayoutsAndMissesNothingThatFits) {
  Hardware hw = parse_hardware(kHardware, "test.toml");
  Config base;
  base.model = small_model();
  base.train.global_batch_size = 8;
  const int gpus = 4;
  // A capacity between the smallest and the largest layout, so some fit and some do not.
  PlanResult all = plan_layouts(base, hw, gpus);
  ASSERT_GT(all.layouts.size(), 10u);
  int64_t lo = all.layouts.front().pred.memory_bytes(), hi = lo;
  for (const auto& l : all.layouts) {
    lo = std::min(lo, l.pred.memory_bytes());
    hi = std::max(hi, l.pred.memory_bytes());
  }
  hw.memory_capacity = double(lo + hi) / 2;
  PlanResult r = plan_layouts(base, hw, gpus);
  ASSERT_FALSE(r.layouts.empty());
  ASSERT_LT(r.layouts.size(), all.layouts.size());
  std::set<Key> emitted;
  for (size_t i = 0; i < r.layouts.size(); ++i) {
    const PlannedLayout& l = r.layouts[i];
    if (i > 0) {
      EXPECT_LE(r.layouts[i - 1].pred.step_time_s, l.pred.step_time_s);
    }
    EXPECT_LE(l.pred.memory_bytes(), hw.memory_capacity);
    // The snippet, pasted into a config, is a config tripod accepts for the GPUs.
    Config pasted = parse_config(layout_toml(l.cfg) + "[model]\nn_layers = 4\nn_heads = 4\nd_model = 64\n"
                                 "seq_len = 32\nvocab_size = 256\n[data]\nsynthetic = true\n",
                                 "snippet", {"train.steps=1"});
    EXPECT_NO_THROW(validate_layout(pasted, gpus));
    EXPECT_EQ(key_of(pasted), key_of(l.cfg));
    emitted.insert(key_of(l.cfg));
  }
  EXPECT_EQ(emitted.size(), r.layouts.size());
  // Brute force over every knob value: each layout tripod accepts (tp inside a node) that fits
  // must have been emitted.
  int fitting = 0;
  for (int tp = 1; tp <= gpus; ++tp)
    for (int pp = 1; pp <= gpus; ++pp)
      for (int vp = 1; vp <= 4; ++vp)
       for (ScheduleKind kind : schedule_candidates(pp, vp))
        for (int mbs = 1; mbs <= 8; ++mbs)
          for (int rc = 0; rc < 3; ++rc)
            for (bool sp : {false, true})
              for (bool dopt : {false, true}) {
                if (gpus % (tp * pp) != 0) continue;
                Config c = base;
                c.train.device = hw.device;
                c.parallel.tp = tp;
                c.parallel.pp = pp;
                c.parallel.vp = vp;
                c.parallel.dp = gpus / (tp * pp);
                c.parallel.schedule = kind;
                c.parallel.placement = default_placement(kind);
                c.parallel.sequence_parallel = sp;
                c.parallel.distributed_optimizer = dopt;
                c.train.micro_batch_size = mbs;
                c.recompute.mode = static_cast<RecomputeMode>(rc);
                c.parallel.balance_layers = true;  // as the planner splits every layout
                try {
                  validate_layout(c, gpus);
                  balance_stages(c, hw);
                  (void)make_schedule(c);
                } catch (const InputError&) {
                  continue;
                }
                // sp without tp and distopt without dp change nothing: the search leaves them out.
                if ((sp && tp == 1) || (dopt && c.parallel.dp == 1)) continue;
                if (static_cast<double>(predict_step(c, hw).memory_bytes()) > hw.memory_capacity) continue;
                ++fitting;
                EXPECT_TRUE(emitted.count(key_of(c))) << "missed tp=" << tp << " pp=" << pp << " vp=" << vp
                                                      << " schedule=" << enum_name(kind)
                                                      << " mbs=" << mbs << " rc=" << rc << " sp=" << sp
                                                      << " dopt=" << dopt;
              }
  EXPECT_EQ(fitting, static_cast<int>(r.layouts.size()));
}

TEST(Planner, FixedKnobsAndBadInput) {
  Hardware hw = parse_hardware(kHardware, "test.toml");
  Config base;
  base.model = small_model();
  base.train.global_batch_size = 8;
  PlanResult r = plan_layouts(base, hw, 4, parse_layout_filter("tp=2,recompute=full,sp=true"));
  ASSERT_FALSE(r.layouts.empty());
  for (const auto& l : r.layouts) {
    EXPECT_EQ(l.cfg.parallel.tp, 2);
    EXPECT_EQ(l.cfg.recompute.mode, RecomputeMode::Full);
    EXPECT_TRUE(l.cfg.parallel.sequence_parallel);
  }
  EXPECT_THROW(parse_layout_filter("tp=two"), InputError);
  EXPECT_THROW(parse_layout_filter("zz=1"), InputError);
  EXPECT_THROW(parse_layout_filter("recompute=most"), InputError);
  // 6 GPUs on nodes of 4.
  EXPECT_THROW(plan_layouts(base, hw, 6), InputError);
  // One layer (pp = 1) and tp <= 4: dp >= 2 on 8 GPUs, and 3 sequences divide over no dp.
  base.model.n_layers = 1;
  base.train.global_batch_size = 3;
  try {
    plan_layouts(base, hw, 8);
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("global batch 3"), std::string::npos) << e.what();
  }
}

// Long sequences: the search adds cp = 2, 4 (while a rank keeps >= 2048 tokens of a sequence),
// every such layout is a config tripod accepts, and cp cuts the activations; short sequences get
// cp = 1 only.
TEST(Planner, SearchesContextParallelismForLongSequences) {
  Hardware hw = parse_hardware(kHardware, "test.toml");
  hw.memory_capacity = 1e15;
  Config base;
  base.model = small_model();
  base.model.seq_len = 8192;
  base.train.global_batch_size = 8;
  PlanResult r = plan_layouts(base, hw, 4, parse_layout_filter("tp=1,pp=1,mbs=1,recompute=none"));
  std::map<int, int64_t> activations;  // cp -> activation bytes (distributed optimizer off)
  for (const auto& l : r.layouts) {
    const ParallelConfig& p = l.cfg.parallel;
    EXPECT_EQ(p.tp * p.pp * p.cp * p.dp, 4);
    Config pasted = parse_config(layout_toml(l.cfg) + "[model]\nn_layers = 4\nn_heads = 4\nd_model = 64\n"
                                 "seq_len = 8192\nvocab_size = 256\n[data]\nsynthetic = true\n",
                                 "snippet", {"train.steps=1"});
    EXPECT_EQ(pasted.parallel.cp, p.cp);
    EXPECT_NO_THROW(validate_layout(pasted, 4));
    if (!p.distributed_optimizer) activations[p.cp] = l.pred.memory.activations;
  }
  ASSERT_EQ(activations.size(), 3u);  // cp = 1, 2, 4
  EXPECT_LT(activations[2], activations[1] * 0.55);
  EXPECT_LT(activations[4], activations[2] * 0.55);
  base.model.seq_len = 2048;
  for (const auto& l : plan_layouts(base, hw, 4).layouts) EXPECT_EQ(l.cfg.parallel.cp, 1);
  PlanResult fixed = plan_layouts(base, hw, 4, parse_layout_filter("cp=2"));
  ASSERT_FALSE(fixed.layouts.empty());
  for (const auto& l : fixed.layouts) EXPECT_EQ(l.cfg.parallel.cp, 2);
}

// A mixture of experts: the cost model prices the router, the experts' rows and, under expert
// parallelism, the rows' exchanges (so ep > 1 adds exposed communication to the same layout); the
// memory plan holds E/ep experts per rank; the search tries every ep dividing both the experts and
// dp x cp, and `--layout ep=N` fixes it; the layouts it emits paste back and validate.
TEST(Planner, SearchesExpertParallelismForMixturesOfExperts) {
  Hardware hw = parse_hardware(kHardware, "test.toml");
  hw.memory_capacity = 1e15;
  Config base;
  base.model = small_model();
  base.model.moe = {.experts = 4, .top_k = 2, .ffn_hidden = 64};
  base.train.global_batch_size = 8;
  PlanResult r = plan_layouts(base, hw, 4, parse_layout_filter("tp=1,pp=1,mbs=1,recompute=none,distopt=false"));
  std::map<int, const PlannedLayout*> by_ep;  // dp = 4
  for (const auto& l : r.layouts) {
    const ParallelConfig& p = l.cfg.parallel;
    EXPECT_EQ(p.dp * p.cp % p.ep, 0);
    EXPECT_EQ(base.model.moe.experts % p.ep, 0);
    Config pasted = parse_config(layout_toml(l.cfg) + "[model]\nn_layers = 4\nn_heads = 4\nd_model = 64\n"
                                 "seq_len = 32\nvocab_size = 256\n[moe]\nexperts = 4\nffn_hidden = 64\n"
                                 "[data]\nsynthetic = true\n",
                                 "snippet", {"train.steps=1"});
    EXPECT_EQ(pasted.parallel.ep, p.ep);
    EXPECT_NO_THROW(validate_layout(pasted, 4));
    if (p.cp == 1) by_ep[p.ep] = &l;
  }
  ASSERT_EQ(by_ep.size(), 3u);  // ep = 1, 2, 4
  const StepPrediction &one = by_ep[1]->pred, &two = by_ep[2]->pred, &four = by_ep[4]->pred;
  // Each rank holds 4, 2, then 1 expert per layer: ep = 1 -> 2 frees twice what 2 -> 4 frees
  // (within the flat buffers' alignment).
  EXPECT_GT(two.memory.params, four.memory.params);
  EXPECT_NEAR(static_cast<double>(one.memory.params - two.memory.params),
              2.0 * static_cast<double>(two.memory.params - four.memory.params),
              0.01 * static_cast<double>(one.memory.params - two.memory.params));
  EXPECT_GT(two.exposed_comm, one.exposed_comm);
  EXPECT_GT(four.exposed_comm, one.exposed_comm);
  PlanResult fixed = plan_layouts(base, hw, 4, parse_layout_filter("ep=2"));
  ASSERT_FALSE(fixed.layouts.empty());
  for (const auto& l : fixed.layouts) EXPECT_EQ(l.cfg.parallel.ep, 2);
  // A dense model is searched at ep = 1 only.
  base.model.moe = {};
  for (const auto& l : plan_layouts(base, hw, 4).layouts) EXPECT_EQ(l.cfg.parallel.ep, 1);
}

// ---- the command line --------------------------------------------------------------------

class PlanCli : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = test::scratch_dir("plan_cli"); }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
    return (dir_ / name).string();
  }
  test::CmdResult plan(const std::string& args) { return test::run_cmd(test::tripod_bin() + " plan " + args); }
  fs::path dir_;
};

const char* kModel = "[model]\nn_layers = 8\nn_heads = 8\nd_model = 512\nseq_len = 256\nvocab_size = 1000\n"
                     "[train]\nsteps = 1\nglobal_batch_size = 32\n[data]\nsynthetic = true\n";

TEST_F(PlanCli, JsonListsLayoutsBestFirst) {
  auto r = plan("--config " + write("m.toml", kModel) + " --hardware " TRIPOD_SOURCE_PATH
                "/configs/hardware/h100_sxm.toml --gpus 16 --top 5 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["layouts"].size(), 5u);
  double prev = 0;
  for (const auto& l : j["layouts"]) {
    for (const char* k : {"tp", "pp", "vp", "dp", "micro_batch", "recompute", "sequence_parallel",
                          "distributed_optimizer", "step_time_s", "tokens_per_s", "model_tflops_per_gpu", "mfu",
                          "memory_bytes_per_gpu", "bubble", "exposed_comm", "layers_per_stage", "breakdown"})
      EXPECT_TRUE(l.contains(k)) << k;
    double parts = 0;
    for (const auto& [family, seconds] : l["breakdown"].items()) parts += seconds.get<double>();
    EXPECT_NEAR(parts, l["step_time_s"].get<double>(), 1e-9 * parts);
    EXPECT_EQ(l["tp"].get<int>() * l["pp"].get<int>() * l["dp"].get<int>(), 16);
    EXPECT_GE(l["step_time_s"].get<double>(), prev);
    prev = l["step_time_s"].get<double>();
    EXPECT_LE(l["memory_bytes_per_gpu"].get<double>(), 79.6 * kGiB);
  }
  // The table and the snippet without --json; a fixed knob is kept.
  r = plan("--config " + write("m.toml", kModel) + " --hardware " TRIPOD_SOURCE_PATH
           "/configs/hardware/a100_80gb_sxm.toml --gpus 8 --layout pp=2,recompute=full");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("[parallel]\ntp = "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("pp = 2\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("mode = \"full\""), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("layers_per_stage = ["), std::string::npos) << r.out;
}

TEST_F(PlanCli, TrainDryRunShowsTheAutoSplit) {
  // The 128K-vocabulary head of Llama-3.2-1B makes "auto" give the last of 2 stages fewer layers.
  auto r = test::run_cmd(test::tripod_bin() + " train --config " TRIPOD_SOURCE_PATH
                         "/configs/llama3_2_1b.toml --dry-run --set parallel.tp=2 --set parallel.pp=2 --set "
                         "parallel.layers_per_stage=auto --set train.micro_batch_size=1 --set train.global_batch_size=128");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("layers per virtual stage: 10+6 (\"auto\", balanced on H100 SXM 80GB (built-in)"),
            std::string::npos) << r.out;
  // A hardware file given by parallel.hardware is the one balanced with.
  r = test::run_cmd(test::tripod_bin() + " train --config " TRIPOD_SOURCE_PATH
                    "/configs/llama3_2_1b.toml --dry-run --set parallel.pp=2 --set parallel.layers_per_stage=auto "
                    "--set parallel.hardware=" TRIPOD_SOURCE_PATH "/configs/hardware/a100_80gb_sxm.toml");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("balanced on A100"), std::string::npos) << r.out;
  r = test::run_cmd(test::tripod_bin() + " train --config " TRIPOD_SOURCE_PATH
                    "/configs/llama3_2_1b.toml --dry-run --set parallel.pp=2 --set parallel.layers_per_stage=auto "
                    "--set parallel.hardware=/nonexistent/hw.toml");
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find("error:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("/nonexistent/hw.toml"), std::string::npos) << r.err;
}

// schedule = "auto" under --dry-run: built for the cost model's F, I and W times per stage on the
// hardware the stages are balanced with, and its memory plan is that schedule's.
TEST_F(PlanCli, TrainDryRunBuildsTheAutoScheduleForTheCostModel) {
  auto r = test::run_cmd(test::tripod_bin() + " train --config " TRIPOD_SOURCE_PATH
                         "/configs/llama3_2_1b.toml --dry-run --set parallel.pp=2 --set parallel.vp=2 --set "
                         "parallel.placement=v --set parallel.schedule=auto --set train.micro_batch_size=1 --set "
                         "train.global_batch_size=16 --set train.device=cuda");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("auto schedule (zbv for the cost model's times on H100 SXM 80GB (built-in); training "
                       "profiles its machine at start-up) over 16 micro-batches"),
            std::string::npos) << r.out;
  EXPECT_NE(r.out.find("schedule auto"), std::string::npos) << r.out;
}

TEST_F(PlanCli, BadInputIsOneErrorLineAndExit2) {
  const std::string model = write("m.toml", kModel);
  const std::string h100 = TRIPOD_SOURCE_PATH "/configs/hardware/h100_sxm.toml";
  std::string bad_hw = test::slurp(h100);
  bad_hw.replace(bad_hw.find("gpus_per_node"), 0, "gpus_per_nodes = 8\n");
  struct Case {
    std::string args, needle;
  } cases[] = {
      {"--config " + model + " --hardware " + write("bad.toml", bad_hw) + " --gpus 8", "unknown key gpus_per_nodes"},
      {"--config " + model + " --hardware " + h100 + " --gpus 12", "--gpus 12 is not a multiple of the 8 GPUs"},
      {"--config " + model + " --hardware " + h100 + " --gpus 16 --global-batch 3 --layout pp=1", "global batch 3"},
      {"--config " + model + " --hardware " + h100 + " --gpus 8 --layout tp=3", "no layout"},
      {"--config " + model + " --hardware " + dir_.string() + "/none.toml --gpus 8", "none.toml"},
  };
  for (const Case& c : cases) {
    auto r = plan(c.args);
    EXPECT_EQ(r.status, 2) << c.args << "\n" << r.err;
    EXPECT_EQ(test::count_lines_starting(r.err, "error:"), 1) << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
  // A model too large for the GPUs: the smallest memory it would need.
  auto r = plan("--config " + write("big.toml", "[model]\nn_layers = 96\nn_heads = 96\nd_model = 12288\nseq_len = "
                                                "2048\nvocab_size = 50257\n[train]\nsteps = 1\nglobal_batch_size = 8\n"
                                                "[data]\nsynthetic = true\n") +
                " --hardware " + h100 + " --gpus 8");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("the smallest needs"), std::string::npos) << r.err;
}

TEST_F(PlanCli, CalibrateWritesAFilePlanReads) {
  const std::string out = (dir_ / "cpu.toml").string();
  const std::string model = write("m.toml", kModel);
  auto r = test::run_cmd("OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 " + test::tripod_bin() + " calibrate --out " + out +
                         " --repeats 1 --model " + model + " --micro-batches 1,2");
  ASSERT_EQ(r.status, 0) << r.err;
  Hardware hw = load_hardware(out);
  EXPECT_EQ(hw.device, Device::CPU);
  EXPECT_EQ(hw.gemm.size(), 10u);  // the layer's four GEMMs and the head's, at 256 and 512 tokens
  ASSERT_EQ(hw.attention.size(), 2u);  // a micro-batch's 8 heads, and two micro-batches' 16, in one call each
  EXPECT_EQ(hw.attention[0].t, 256);
  EXPECT_EQ(hw.attention[0].pairs, 8);
  EXPECT_EQ(hw.attention[1].pairs, 16);
  std::set<Elementwise> ops;
  for (const ElementwisePoint& p : hw.elementwise_points) {
    ops.insert(p.op);
    EXPECT_GT(p.forward_s, 0);
    EXPECT_GT(p.backward_s, 0);
  }
  // A GPT-2's memory-bound ops (no RMSNorm, SwiGLU or rope).
  EXPECT_EQ(ops, (std::set<Elementwise>{Elementwise::LayerNorm, Elementwise::Gelu, Elementwise::Add,
                                        Elementwise::CrossEntropy, Elementwise::Embedding, Elementwise::AdamW}));
  EXPECT_TRUE(hw.warnings.empty());
  EXPECT_GT(hw.peak_flops, 0);
  r = plan("--config " + model + " --hardware " + out + " --gpus 1 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  // An existing file is not replaced without --force.
  r = test::run_cmd(test::tripod_bin() + " calibrate --out " + out);
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(test::count_lines_starting(r.err, "error:"), 1) << r.err;
}

}  // namespace
}  // namespace tripod
