// Config parsing and validation: every bad input is an InputError naming the key and what is valid.
#include <gtest/gtest.h>

#include "core/debug_options.h"
#include "core/error.h"
#include "config/config.h"

namespace tripod {
namespace {

const char* kGood = R"(
[model]
n_layers = 2
n_heads = 4
d_model = 32
seq_len = 16
vocab_size = 64
[train]
steps = 3
[data]
synthetic = true
)";

// The error message of parsing `text` (with overrides), or "" when it parses.
std::string error_of(const std::string& text, std::vector<std::string> sets = {}) {
  try {
    parse_config(text, "test.toml", sets);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

// kGood with `line` ("key = value") set in [section], replacing the key's line if present.
std::string with(const std::string& section, const std::string& line) {
  std::string t = kGood;
  std::string key = line.substr(0, line.find(' ')) + " =";
  if (auto at = t.find("\n" + key); at != std::string::npos) return t.replace(at + 1, t.find('\n', at + 1) - at - 1, line);
  auto pos = t.find("[" + section + "]");
  if (pos == std::string::npos) return t + "\n[" + section + "]\n" + line + "\n";
  pos = t.find('\n', pos);
  return t.insert(pos + 1, line + "\n");
}

TEST(Config, GoodConfigParsesWithDefaults) {
  Config c = parse_config(kGood, "test.toml");
  EXPECT_EQ(c.model.n_layers, 2);
  EXPECT_EQ(c.model.ffn(), 128);
  EXPECT_EQ(c.train.device, Device::CPU);
  EXPECT_EQ(c.parallel.tp, 1);
  EXPECT_EQ(c.recompute.mode, RecomputeMode::None);
}

TEST(Config, MissingFile) {
  try {
    load_config("/nonexistent/x.toml");
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/x.toml"), std::string::npos) << e.what();
  }
}

TEST(Config, SyntaxErrorNamesTheLine) {
  std::string e = error_of("[model]\nn_layers = 2\nn_heads = = 4\n");
  EXPECT_NE(e.find("test.toml:3"), std::string::npos) << e;
  EXPECT_NE(e.find("TOML syntax error"), std::string::npos) << e;
}

TEST(Config, UnknownKeyAndSection) {
  std::string e = error_of(with("model", "n_layer = 3"));
  EXPECT_NE(e.find("unknown key model.n_layer"), std::string::npos) << e;
  EXPECT_NE(e.find("n_layers"), std::string::npos) << e;  // lists the valid keys
  e = error_of(std::string(kGood) + "[modle]\nx = 1\n");
  EXPECT_NE(e.find("unknown section [modle]"), std::string::npos) << e;
}

TEST(Config, WrongTypes) {
  EXPECT_NE(error_of(with("model", "d_model = \"big\"")).find("model.d_model must be an integer"), std::string::npos);
  EXPECT_NE(error_of(with("train", "lr = \"fast\"")).find("train.lr must be a number"), std::string::npos);
  EXPECT_NE(error_of(with("parallel", "sequence_parallel = 1")).find("parallel.sequence_parallel must be true or false"),
            std::string::npos);
}

TEST(Config, NegativeOrZeroSizes) {
  std::string t0 = kGood;
  EXPECT_NE(error_of(t0.replace(t0.find("n_layers = 2"), 12, "n_layers = 0")).find("model.n_layers must be >= 1"), std::string::npos);
  for (auto [line, key] : std::vector<std::pair<std::string, std::string>>{
           {"micro_batch_size = 0", "train.micro_batch_size"},
           {"steps = -1", "train.steps"},
           {"lr = 0.0", "train.lr"},
           {"grad_clip = -1.0", "train.grad_clip"}}) {
    std::string e = error_of(with("train", line));
    EXPECT_NE(e.find(key), std::string::npos) << line << ": " << e;
  }
  std::string e = error_of(std::string(kGood).replace(std::string(kGood).find("d_model = 32"), 12, "d_model = -32"));
  EXPECT_NE(e.find("model.d_model"), std::string::npos) << e;
}

TEST(Config, HeadsMustDivideWidth) {
  std::string t = kGood;
  t.replace(t.find("n_heads = 4"), 11, "n_heads = 5");
  std::string e = error_of(t);
  EXPECT_NE(e.find("model.n_heads = 5 must divide model.d_model = 32"), std::string::npos) << e;
}

TEST(Config, SeqLenAbovePositionTable) {
  std::string e = error_of(with("model", "max_positions = 8"));
  EXPECT_NE(e.find("model.seq_len = 16 exceeds the position table"), std::string::npos) << e;
}

TEST(Config, OverridesApplyAndAreChecked) {
  Config c = parse_config(kGood, "test.toml", {"train.lr=0.01", "train.device=cpu", "parallel.tp=2"});
  EXPECT_DOUBLE_EQ(c.train.lr, 0.01);
  EXPECT_EQ(c.parallel.tp, 2);
  EXPECT_NE(error_of(kGood, {"train.nope=1"}).find("unknown key train.nope"), std::string::npos);
  EXPECT_NE(error_of(kGood, {"train.device=tpu"}).find("train.device = \"tpu\""), std::string::npos);
  EXPECT_NE(error_of(kGood, {"lr=0.1"}).find("section.key=value"), std::string::npos);
}

TEST(Config, LayoutChecksNameTheNumbers) {
  Config c = parse_config(kGood, "t", {"parallel.tp=3"});
  try {
    validate_layout(c, 6);
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.tp = 3 must divide model.n_heads = 4"), std::string::npos) << e.what();
  }
  c = parse_config(kGood, "t", {"parallel.tp=2", "parallel.dp=2"});
  try {
    validate_layout(c, 8);
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("world size is 8"), std::string::npos) << e.what();
  }
  c = parse_config(kGood, "t", {"train.global_batch_size=6", "train.micro_batch_size=2"});
  try {
    validate_layout(c, 2);
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("train.global_batch_size = 6"), std::string::npos) << e.what();
  }
  c = parse_config(kGood, "t");
  validate_layout(c, 4);
  EXPECT_EQ(c.parallel.dp, 4);
  EXPECT_EQ(c.train.global_batch_size, 4);
}

TEST(Config, LayersPerStageTakesAutoOrCounts) {
  Config c = parse_config(kGood, "t", {"parallel.pp=2", "parallel.layers_per_stage=auto"});
  EXPECT_TRUE(c.parallel.balance_layers);
  EXPECT_TRUE(c.parallel.layers_per_stage.empty());
  validate_layout(c, 2);  // balance_stages (plan/) fills the counts in
  EXPECT_NE(config_to_toml(c).find("layers_per_stage = 'auto'"), std::string::npos) << config_to_toml(c);
  c.parallel.layers_per_stage = {1, 1};  // resolved: the counts are written
  Config d = parse_config(config_to_toml(c), "resolved");
  EXPECT_FALSE(d.parallel.balance_layers);
  EXPECT_EQ(d.parallel.layers_per_stage, (std::vector<int>{1, 1}));
  // With more stages than layers "auto" has nothing to balance.
  c = parse_config(kGood, "t", {"parallel.pp=4", "parallel.layers_per_stage=auto"});
  try {
    validate_layout(c, 4);
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.layers_per_stage = \"auto\": model.n_layers = 2 is fewer"),
              std::string::npos) << e.what();
  }
  // Misspelt, or a list of the wrong kind: the key and what is valid.
  for (const char* bad : {"parallel.layers_per_stage=autp", "parallel.layers_per_stage=[1.5, 0.5]",
                          "parallel.layers_per_stage=3"}) {
    const std::string e = error_of(kGood, {bad});
    EXPECT_NE(e.find("parallel.layers_per_stage"), std::string::npos) << e;
    EXPECT_NE(e.find("\"auto\""), std::string::npos) << e;
  }
  c = parse_config(kGood, "t", {"parallel.pp=2", "parallel.layers_per_stage=[1, 2]"});
  try {
    validate_layout(c, 2);
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("adds up to 3 layers but model.n_layers = 2 (give 2 counts adding up to 2, "
                                         "or \"auto\")"),
              std::string::npos) << e.what();
  }
}

TEST(Config, ResolvedTomlRoundTrips) {
  Config c = parse_config(kGood, "t", {"parallel.vp=1", "recompute.mode=selective"});
  Config d = parse_config(config_to_toml(c), "resolved");
  EXPECT_EQ(config_to_toml(c), config_to_toml(d));
  EXPECT_EQ(d.recompute.mode, RecomputeMode::Selective);
}

}  // namespace
}  // namespace tripod

namespace tripod {
namespace {

TEST(Config, LlamaPresetSetsTheArchitectureKeysAndKeysOverrideIt) {
  Config c = parse_config(kGood, "test.toml", {"model.arch=\"llama\"", "model.n_kv_heads=2"});
  const ModelConfig& m = c.model;
  EXPECT_EQ(m.norm, NormKind::RmsNorm);
  EXPECT_EQ(m.position, PositionKind::Rope);
  EXPECT_EQ(m.mlp, MlpKind::SwiGlu);
  EXPECT_FALSE(m.bias);
  EXPECT_FALSE(m.tie_embeddings);
  EXPECT_EQ(m.kv_heads(), 2);
  EXPECT_EQ(m.ffn_hidden, 256) << "Llama's rule: 8/3 * 32 rounded up to 256";
  EXPECT_DOUBLE_EQ(m.rope_theta, 10000.0);
  Config t = parse_config(kGood, "test.toml", {"model.arch=\"llama\"", "model.tie_embeddings=true", "model.norm_eps=1e-6"});
  EXPECT_TRUE(t.model.tie_embeddings);
  EXPECT_DOUBLE_EQ(t.model.norm_eps, 1e-6);
  // GPT-2 defaults: every key resolved, n_kv_heads = n_heads.
  Config g = parse_config(kGood, "test.toml");
  EXPECT_EQ(g.model.n_kv_heads, 4);
  EXPECT_EQ(g.model.norm, NormKind::LayerNorm);
  EXPECT_TRUE(g.model.bias && g.model.tie_embeddings);
  // The resolved config shows every value and reads back the same.
  const std::string toml = config_to_toml(c);
  for (const char* key : {"arch", "norm", "norm_eps", "position", "rope_theta", "mlp", "ffn_hidden", "n_kv_heads",
                          "bias", "tie_embeddings"})
    EXPECT_NE(toml.find(std::string(key) + " = "), std::string::npos) << key << " missing from\n" << toml;
  Config back = parse_config(toml, "resolved.toml");
  EXPECT_EQ(config_to_toml(back), toml);
}

TEST(Config, InvalidLlamaCombinationsNameTheKeys) {
  auto err = [](std::vector<std::string> sets) { return error_of(kGood, std::move(sets)); };
  EXPECT_NE(err({"model.arch=\"mistral\""}).find("model.arch"), std::string::npos);
  EXPECT_NE(err({"model.norm=\"batchnorm\""}).find("model.norm"), std::string::npos);
  EXPECT_NE(err({"model.position=\"alibi\""}).find("model.position"), std::string::npos);
  EXPECT_NE(err({"model.mlp=\"relu\""}).find("model.mlp"), std::string::npos);
  EXPECT_NE(err({"model.n_kv_heads=3"}).find("model.n_kv_heads = 3 must divide model.n_heads = 4"), std::string::npos);
  EXPECT_NE(err({"model.n_kv_heads=-1"}).find("model.n_kv_heads"), std::string::npos);
  EXPECT_NE(err({"model.rope_theta=0.0", "model.position=\"rope\""}).find("model.rope_theta"), std::string::npos);
  EXPECT_NE(err({"model.rope_theta=-5.0"}).find("model.rope_theta"), std::string::npos);
  EXPECT_NE(err({"model.norm_eps=0.0"}).find("model.norm_eps"), std::string::npos);
  EXPECT_NE(err({"model.rope_theta=nan"}).find("model.rope_theta"), std::string::npos);
  // Odd head dimension (d_model 36 / 4 heads = 9) with rope.
  EXPECT_NE(err({"model.d_model=36", "model.position=\"rope\""}).find("model.position"), std::string::npos);
  EXPECT_EQ(err({"model.d_model=36"}), "") << "learned positions take any head dimension";
  // tp must divide the key/value heads.
  Config c = parse_config(kGood, "test.toml", {"model.n_kv_heads=2", "parallel.tp=4"});
  try {
    validate_layout(c, 4);
    FAIL() << "tp = 4 with 2 key/value heads";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("model.n_kv_heads = 2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("parallel.tp = 4"), std::string::npos) << e.what();
  }
}

// TRIPOD_PEAK_TFLOPS is read with the other switches: a positive number, else an input error naming it.
TEST(DebugOptions, PeakTflopsIsAPositiveNumber) {
  ::unsetenv("TRIPOD_PEAK_TFLOPS");
  EXPECT_EQ(read_debug_options().peak_tflops, 0);
  ::setenv("TRIPOD_PEAK_TFLOPS", "123.5", 1);
  EXPECT_EQ(read_debug_options().peak_tflops, 123.5);
  for (const char* bad : {"fast", "0", "-5", "12x", "inf", "nan"}) {
    ::setenv("TRIPOD_PEAK_TFLOPS", bad, 1);
    try {
      read_debug_options();
      ADD_FAILURE() << bad << " must be refused";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("TRIPOD_PEAK_TFLOPS = \"" + std::string(bad) + "\""), std::string::npos)
          << e.what();
    }
  }
  ::unsetenv("TRIPOD_PEAK_TFLOPS");
}

}  // namespace
}  // namespace tripod

namespace tripod {
namespace {

const char* kMoe = R"(
[model]
arch = "llama"
n_layers = 4
n_heads = 4
d_model = 32
seq_len = 16
vocab_size = 64
qk_norm = true
[moe]
experts = 8
top_k = 2
ffn_hidden = 24
shared_experts = 1
router = "sigmoid"
normalize_top_k = false
layers = {first_dense = 1}
aux_loss_coeff = 0.01
z_loss_coeff = 0.001
bias_update_rate = 0.001
capacity_factor = 1.25
[train]
steps = 3
[data]
synthetic = true
)";

TEST(MoeConfig, EveryKeyParsesAndTheResolvedTomlRoundTrips) {
  Config c = parse_config(kMoe, "moe.toml");
  const MoeConfig& m = c.model.moe;
  EXPECT_TRUE(c.model.qk_norm);
  EXPECT_EQ(m.experts, 8);
  EXPECT_EQ(m.top_k, 2);
  EXPECT_EQ(m.ffn_hidden, 24);
  EXPECT_EQ(m.shared_experts, 1);
  EXPECT_EQ(m.router, MoeRouter::Sigmoid);
  EXPECT_FALSE(m.normalize_top_k);
  EXPECT_EQ(m.first_dense, 1);
  EXPECT_EQ(m.aux_loss_coeff, 0.01);
  EXPECT_EQ(m.z_loss_coeff, 0.001);
  EXPECT_EQ(m.bias_update_rate, 0.001);
  EXPECT_EQ(m.capacity_factor, 1.25);
  EXPECT_FALSE(m.sparse(0));
  EXPECT_TRUE(m.sparse(1));
  // Capacity: ceil(1.25 * 64 tokens * 2 / 8) = 20 per expert, 160 rows at most.
  EXPECT_EQ(m.capacity(64), 20);
  EXPECT_EQ(m.routed_rows(64), 128);
  const std::string toml = config_to_toml(c);
  EXPECT_NE(toml.find("first_dense = 1"), std::string::npos) << toml;
  Config back = parse_config(toml, "resolved.toml", {}, ConfigUse{.training = false, .data = false});
  EXPECT_EQ(model_to_json(back.model), model_to_json(c.model));
  EXPECT_EQ(model_from_json(model_to_json(c.model), "x").moe.router, MoeRouter::Sigmoid);
  // "all" and the default ffn_hidden (model.ffn_hidden, resolved).
  Config all = parse_config(kMoe, "moe.toml", {"moe.layers=\"all\"", "moe.ffn_hidden=0"});
  EXPECT_EQ(all.model.moe.first_dense, 0);
  EXPECT_EQ(all.model.moe.ffn_hidden, all.model.ffn());
  EXPECT_NE(config_to_toml(all).find("layers = 'all'"), std::string::npos) << config_to_toml(all);
}

TEST(MoeConfig, ADenseModelHasNoMoeSectionInItsRecordsAndFlopsCountActiveParameters) {
  Config dense = parse_config(kGood, "test.toml");
  EXPECT_EQ(config_to_toml(dense).find("[moe]"), std::string::npos);
  EXPECT_FALSE(model_to_json(dense.model).contains("moe"));
  EXPECT_FALSE(model_to_json(dense.model).contains("qk_norm"));
  EXPECT_EQ(dense.model.num_params(1, /*active=*/true), dense.model.num_params(1));
  // 8 experts, top 2, of an expert as wide as the dense MLP: 6 of the 8 experts are inactive.
  Config moe = parse_config(kGood, "test.toml", {"moe.experts=8", "moe.top_k=2"});
  const int64_t C = 32, F = moe.model.ffn(), expert = 2 * F * C;
  EXPECT_EQ(moe.model.num_params(1) - moe.model.num_params(1, true), 2 * 6 * expert);
  // Per layer: a router and two bias-free experts active, for one MLP with biases (F + C).
  EXPECT_EQ(moe.model.num_params(1, true) - dense.model.num_params(1), 2 * (2 * expert + 8 * C - (expert + F + C)));
  EXPECT_DOUBLE_EQ(moe.model.flops_per_token() - dense.model.flops_per_token(),
                   6.0 * (moe.model.num_params(1, true) - dense.model.num_params(1)));
}

TEST(MoeConfig, BadValuesNameTheKeyAndWhatIsValid) {
  for (const auto& [set, needle] : std::vector<std::pair<std::string, std::string>>{
           {"moe.top_k=9", "moe.top_k = 9 must be in [1, moe.experts = 8]"},
           {"moe.top_k=0", "moe.top_k = 0 must be in [1, moe.experts = 8]"},
           {"moe.router=\"topk\"", "moe.router = \"topk\" is not one of \"softmax\", \"sigmoid\""},
           {"moe.experts=-1", "moe.experts must be in [0, 65536]"},
           {"moe.layers=\"some\"", "moe.layers = \"some\" is not valid"},
           {"moe.layers={first=1}", "moe.layers must be \"all\""},
           {"moe.layers={first_dense=4}", "moe.layers = {first_dense = 4} must leave a sparse layer"},
           {"moe.capacity_factor=-1", "moe.capacity_factor must be 0 (dropless) or >= 0.01"},
           {"moe.aux_loss_coeff=-0.1", "moe.aux_loss_coeff must be >= 0"},
           {"moe.bias_update_rate=-1", "moe.bias_update_rate must be >= 0"},
           {"moe.shared_experts=-1", "moe.shared_experts must be in [0, 1024]"},
           {"moe.experts_per_token=2", "unknown key moe.experts_per_token"},
           {"model.qk_norm=1", "model.qk_norm must be true or false"}}) {
    try {
      parse_config(kMoe, "moe.toml", {set});
      ADD_FAILURE() << "accepted " << set;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << set << ": " << e.what();
    }
  }
  // tp must divide an expert's width.
  Config c = parse_config(kMoe, "moe.toml", {"moe.ffn_hidden=30", "moe.shared_experts=0"});
  c.parallel.tp = 4;
  try {
    validate_layout(c, 4);
    ADD_FAILURE() << "tp = 4 accepted for experts 30 wide";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.tp = 4 must divide an expert's width (moe.ffn_hidden) = 30"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace tripod
