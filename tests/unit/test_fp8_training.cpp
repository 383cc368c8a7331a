// FP8 training's state on the CPU (train.precision = "fp8"; tests/e2e/test_fp8_cli.cpp trains the
// models for 200 steps): the FP8 linears' persistent memory is what the memory plan says, their
// figures reach the step metrics, and a delayed run's scales follow its amax history.
#include <fmt/format.h>

#include "config/memory_plan.h"
#include "core/error.h"
#include "kernels/fp8.h"
#include "harness.h"
#include "test_util.h"

namespace tripod {
namespace {

TEST(Fp8Training, PersistentMemoryIsPlannedAndFiguresAreLogged) {
  auto ops = make_ops(Device::CPU);
  auto self = test::make_selfworld(*ops);
  Config c = test::tiny_config(4, 32, 4, 16, 64);
  c.train.precision = Precision::Fp8;
  c.train.fp8_recipe = Fp8Recipe::Delayed;
  c.train.fp8_amax_history = 3;
  c.train.fp8_bf16_layers = 1;  // layers 1 and 2 in FP8
  validate_layout(c, 1);
  SyntheticSource data(16, 64, 3);
  Trainer t(c, *ops, *self.par, &data);
  ASSERT_NE(t.fp8(), nullptr);
  EXPECT_EQ(t.fp8()->size(), 8);  // 4 linears in each of the 2 FP8 layers
  StepRecord m;
  for (int s = 0; s < 5; ++s) m = t.step();
  EXPECT_EQ(m.memory.at(0).at("params"), plan_rank_memory(c, 0).params);
  EXPECT_GT(fp8_persistent_bytes(c.model, c.train.fp8_config(), 1, t.layout().chunks), 0);
  const Fp8Stats st = t.fp8()->gather_stats(m.step, *self.par->world);
  ASSERT_EQ(st.names.size(), 8u);
  EXPECT_EQ(st.names.front(), "h.1.attn.qkv");
  EXPECT_EQ(st.names.back(), "h.2.mlp.proj");
  for (size_t i = 0; i < st.names.size(); ++i) {
    for (int o = 0; o < kFp8Operands; ++o) {
      // After 4 steps of history the scale of step 5 is max / (the max of the last 3 amaxes): at
      // least what this step's own amax gives, up to the step's growth.
      EXPECT_GT(st.amax[i][o], 0) << st.names[i];
      EXPECT_GT(st.scale[i][o], 0) << st.names[i];
      EXPECT_NE(st.scale[i][o], 1.0) << st.names[i] << ": still the initial scale";
    }
    EXPECT_GT(st.amax[i][3], 0) << st.names[i] << ": the output's amax";
  }
  // The scales of the delayed recipe come from the history: with the state as saved, a fresh
  // registry restored from it gives the same scales.
  const auto state = t.fp8()->state();
  ASSERT_EQ(state.size(), 8u);
  for (const auto& [name, v] : state) {
    ASSERT_EQ(v.size(), 3u * 4u) << name;
    for (int o = 0; o < 3; ++o) {
      float a = 0;
      for (int h = 1; h <= 3; ++h) a = std::max(a, v[o * 4 + h]);
      const float fmax = o == 2 ? kFp8E5M2Max : kFp8E4M3Max;
      EXPECT_GT(a, 0.f) << name;
      // The scale saved is the one the history gives (no margin), or the previous one when the
      // history's max cannot be divided into the format's largest value.
      EXPECT_EQ(v[o * 4], fp8_scale_from_amax(a, fmax, 1.f, v[o * 4])) << name << " operand " << o;
    }
  }
}

// A mixture-of-experts model: the attention's linears run in FP8, the dense first layer's MLP too,
// the experts stay in bf16; the plan counts exactly those.
TEST(Fp8Training, MixtureOfExpertsKeepsItsExpertsOutOfFp8) {
  auto ops = make_ops(Device::CPU);
  auto self = test::make_selfworld(*ops);
  Config c = test::tiny_config(3, 32, 4, 16, 64);
  c.model.moe.experts = 4;
  c.model.moe.top_k = 2;
  c.model.moe.ffn_hidden = 48;
  c.model.moe.first_dense = 1;
  c.train.precision = Precision::Fp8;
  validate_layout(c, 1);
  SyntheticSource data(16, 64, 3);
  Trainer t(c, *ops, *self.par, &data);
  EXPECT_EQ(t.fp8()->size(), 4 + 2 + 2);  // layer 0: 4 linears; layers 1, 2: attention's 2
  EXPECT_EQ(fp8_linear_count(c.model, c.train.fp8_config(), t.layout().chunks), t.fp8()->size());
  StepRecord m;
  for (int s = 0; s < 2; ++s) m = t.step();
  // Measured: the weights' casts of those 8 linears (2 bytes per element) and their state; a
  // plan charging the experts' casts too would be larger by theirs.
  const RankMemory plan = plan_rank_memory(c, 0);
  EXPECT_EQ(m.memory.at(0).at("params"), plan.params);
  EXPECT_EQ(m.memory.at(0).at("activations"), plan.activations);  // FP8 keeps no activation
  const Fp8Stats st = t.fp8()->gather_stats(m.step, *self.par->world);
  EXPECT_EQ(st.names, (std::vector<std::string>{"h.0.attn.qkv", "h.0.attn.proj", "h.0.mlp.fc", "h.0.mlp.proj",
                                                "h.1.attn.qkv", "h.1.attn.proj", "h.2.attn.qkv", "h.2.attn.proj"}));
  // --dry-run's memory table says the same.
  const std::string table = memory_table(c, plan_memory(c));
  EXPECT_NE(table.find("precision fp8 (tensorwise): 8 linears in FP8 (layers 0-2 of 3); in the 2 mixture-of-experts "
                       "layers among them the attention's only"),
            std::string::npos)
      << table;
}

// cuBLASLt's rule (dimensions multiples of 16) binds model.ffn_hidden only where a dense MLP runs
// in FP8: not when every FP8 layer is a mixture of experts (whose experts stay in bf16).
TEST(Fp8Training, TheDenseMlpWidthRuleHoldsWhereADenseMlpRunsInFp8) {
  const std::string base = R"(
[model]
n_layers = 4
n_heads = 4
d_model = 32
ffn_hidden = 40
seq_len = 16
vocab_size = 64
[moe]
experts = 4
top_k = 2
ffn_hidden = 32
[train]
precision = "fp8"
micro_batch_size = 1
global_batch_size = 1
steps = 1
[data]
synthetic = true
)";
  auto refusal = [](const std::string& text, const std::vector<std::string>& sets) -> std::string {
    try {
      Config c = parse_config(text, "moe.toml", sets);
      validate_layout(c, 1);
    } catch (const InputError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(refusal(base, {}), "");  // every layer an MoE layer
  EXPECT_NE(refusal(base, {"moe.layers={first_dense=1}"}).find("model.ffn_hidden = 40 must be a multiple of 16"),
            std::string::npos);
  // Layer 0, the dense one, kept in bf16 by fp8_bf16_layers: every FP8 layer is an MoE layer again.
  EXPECT_EQ(refusal(base, {"moe.layers={first_dense=1}", "train.fp8_bf16_layers=1"}), "");
  EXPECT_EQ(refusal(base, {"train.precision=bf16", "moe.layers={first_dense=1}"}), "");
}

}  // namespace
}  // namespace tripod
