// The whole GPT-2 against PyTorch (golden values), a finite-difference check of the whole model,
// exact recomputation, overfitting a fixed batch, and bit-identical reruns.
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "checkpoint/llama_hf.h"
#include "checkpoint/load.h"
#include "checkpoint/safetensors.h"
#include "cli_util.h"
#include "harness.h"
#include "model/inference.h"
#include "test_util.h"

namespace tripod {
namespace {

using nlohmann::json;

json load_golden(const std::string& file) {
  std::ifstream in(test::source_dir() + "/tests/fixtures/" + file);
  EXPECT_TRUE(in) << "missing tests/fixtures/" << file << " (TRIPOD_SOURCE_DIR=" << test::source_dir() << ")";
  return json::parse(in);
}

// The model config of a golden file: GPT-2's, or the Llama architecture when it has n_kv_heads.
// A reference tensor of a golden file as doubles, padded with zeros to `numel` (vocabulary rows the
// reference lacks), and its largest magnitude (the scale its tolerance is relative to).
std::pair<std::vector<double>, double> golden_tensor(const json& ref, int64_t numel) {
  std::vector<double> v(numel, 0.0);
  double scale = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    v[i] = ref[i].get<double>();
    scale = std::max(scale, std::abs(v[i]));
  }
  return {std::move(v), scale};
}

ModelConfig golden_config(const json& c) {
  ModelConfig cfg{.n_layers = c["n_layers"], .n_heads = c["n_heads"], .d_model = c["d_model"], .ffn_hidden = 0,
                  .seq_len = c["seq_len"], .max_positions = 0, .vocab_size = c["vocab_size"]};
  if (c.contains("moe")) {  // make_moe_golden.py: every choice spelled out
    const bool llama = c["llama"];
    cfg.arch = llama ? Arch::Llama : Arch::Gpt2;
    cfg.norm = llama ? NormKind::RmsNorm : NormKind::LayerNorm;
    cfg.position = llama ? PositionKind::Rope : PositionKind::Learned;
    cfg.mlp = c["swiglu"].get<bool>() ? MlpKind::SwiGlu : MlpKind::Gelu;
    cfg.bias = c["bias"];
    cfg.tie_embeddings = c["tie_embeddings"];
    cfg.qk_norm = c["qk_norm"];
    cfg.n_kv_heads = c["n_kv_heads"];
    cfg.ffn_hidden = c["ffn_hidden"];
    cfg.rope_theta = c["rope_theta"];
    cfg.norm_eps = c["norm_eps"];
    const json& m = c["moe"];
    cfg.moe = {.experts = m["experts"], .top_k = m["top_k"], .ffn_hidden = m["ffn_hidden"],
               .shared_experts = m["shared_experts"],
               .router = m["router"] == "sigmoid" ? MoeRouter::Sigmoid : MoeRouter::Softmax,
               .normalize_top_k = m["normalize_top_k"], .first_dense = m["first_dense"],
               .aux_loss_coeff = m["aux_loss_coeff"], .z_loss_coeff = m["z_loss_coeff"],
               .bias_update_rate = m["bias_update_rate"], .capacity_factor = m["capacity_factor"]};
    return cfg;
  }
  if (c.contains("n_kv_heads")) {
    cfg.arch = Arch::Llama;
    cfg.norm = NormKind::RmsNorm;
    cfg.position = PositionKind::Rope;
    cfg.mlp = MlpKind::SwiGlu;
    cfg.bias = cfg.tie_embeddings = false;
    cfg.n_kv_heads = c["n_kv_heads"];
    cfg.ffn_hidden = c["ffn_hidden"];
    cfg.rope_theta = c["rope_theta"];
    cfg.norm_eps = c["norm_eps"];
  }
  return cfg;
}

// A serial model on the golden config with the golden weights.
struct GoldenModel {
  json g;
  std::unique_ptr<Ops> ops = make_ops(Device::CPU);
  test::SubWorld world = test::make_subworld(*ops, RankGrid(1, 1, 1));
  ModelConfig cfg;
  ParamRegistry reg;
  std::unique_ptr<GptModel> model;
  MicroBatch mb;
  Tensor losses;

  explicit GoldenModel(RecomputeConfig rc = {}, const std::string& file = "gpt2_golden.json") : g(load_golden(file)) {
    const json& c = g["config"];
    cfg = golden_config(c);
    int L = cfg.n_layers;
    model = std::make_unique<GptModel>(*ops, *world.par, cfg, rank_chunks({L}, 1, 1, 0), rc, reg);
    reg.allocate(*ops);
    for (Param* p : reg.tensors()) {  // parameters and buffers (a selection bias)
      const auto& v = g["params"][p->spec.name];
      if (v.is_null()) throw std::runtime_error("golden file has no " + p->spec.name);
      float* dst = p->value.data<float>();
      std::fill(dst, dst + p->numel(), 0.f);  // vocabulary padding rows stay zero
      for (size_t i = 0; i < v.size(); ++i) dst[i] = v[i].get<float>();
    }
    const int64_t B = c["batch"], T = cfg.seq_len;
    mb.shape = {B, T};
    mb.tokens = ops->empty({B * T}, DType::I32, MemCategory::Activations);
    mb.targets = ops->empty({B * T}, DType::I32, MemCategory::Activations);
    for (int64_t i = 0; i < B * T; ++i) {
      mb.tokens.data<int32_t>()[i] = g["tokens"][i];
      mb.targets.data<int32_t>()[i] = g["targets"][i];
    }
    mb.grad_scale = 1.f / static_cast<float>(B * T);
    losses = ops->empty({B * T}, DType::F32, MemCategory::Workspace);
    mb.losses = losses;
  }
  double loss() {
    ChunkActs acts;
    model->forward(0, mb, Tensor{}, acts);
    return ops->sum(losses) / losses.numel();
  }
  double loss_and_grads() {
    reg.zero_grads(*ops);
    ChunkActs acts;
    model->forward(0, mb, Tensor{}, acts);
    double l = ops->sum(losses) / losses.numel();
    model->backward(0, mb, Tensor{}, acts);
    return l;
  }
  // The same through the split backward (I, then W).
  double loss_and_grads_split() {
    reg.zero_grads(*ops);
    ChunkActs acts;
    ChunkPending pending;
    model->forward(0, mb, Tensor{}, acts);
    double l = ops->sum(losses) / losses.numel();
    model->backward_input(0, mb, Tensor{}, acts, pending);
    model->backward_weight(0, pending);
    return l;
  }
};

class Golden : public ::testing::TestWithParam<const char*> {};
INSTANTIATE_TEST_SUITE_P(Models, Golden, ::testing::Values("gpt2_golden.json", "llama_golden.json"),
                         [](const auto& info) { const std::string s = info.param; return s.substr(0, s.find('_')); });

TEST_P(Golden, MatchesPyTorchLossAndGradients) {
  GoldenModel m({}, GetParam());
  double loss = m.loss_and_grads();
  EXPECT_NEAR(loss, m.g["loss"].get<double>(), 1e-5 * m.g["loss"].get<double>());
  for (Param& p : m.reg.params()) {
    const auto [want, scale] = golden_tensor(m.g["grads"][p.spec.name], p.numel());
    SCOPED_TRACE(p.spec.name);
    // f32 against f64: absolute error relative to the tensor's largest gradient.
    EXPECT_CLOSE(p.grad, want, 2e-5 * scale, 1e-3);
  }
}

// Logits against PyTorch's (Llama's golden file has them): the inference forward over the whole
// batch's sequences, one at a time, gives every position's logits.
TEST(GptModel, LlamaLogitsMatchPyTorch) {
  GoldenModel m({}, "llama_golden.json");
  const int64_t B = m.g["config"]["batch"], T = m.cfg.seq_len, V = m.cfg.vocab_size;
  InferenceModel inf(*m.ops, *m.world.par, m.cfg, m.reg, T);
  const auto& ref = m.g["logits"];
  double scale = 0;
  for (const auto& v : ref) scale = std::max(scale, std::abs(v.get<double>()));
  for (int64_t b = 0; b < B; ++b) {
    inf.reset();
    std::vector<int32_t> seq(m.mb.tokens.data<int32_t>() + b * T, m.mb.tokens.data<int32_t>() + (b + 1) * T);
    std::vector<float> got = inf.forward(seq, /*all_logits=*/true);
    ASSERT_EQ(static_cast<int64_t>(got.size()), T * V);
    for (int64_t i = 0; i < T * V; ++i)
      ASSERT_NEAR(got[i], ref[b * T * V + i].get<double>(), 2e-5 * scale) << "sequence " << b << " element " << i;
  }
}

// A Hugging Face Llama folder written by the PyTorch reference (tests/fixtures/llama_hf: config.json,
// an index and two shards, F32 and BF16) imports with `ckpt convert --from safetensors` and gives
// the reference's loss for those weights; a --config that disagrees with config.json is refused
// naming the field.
TEST(GptModel, HuggingFaceLlamaFolderImportsWithTheReferenceLoss) {
  namespace fs = std::filesystem;
  GoldenModel m({}, "llama_golden.json");
  const fs::path dir = fs::temp_directory_path() / ("tripod_llama_hf_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const ModelConfig& c = m.cfg;
  const std::string toml = fmt::format(
      "[model]\narch = \"llama\"\nn_layers = {}\nn_heads = {}\nn_kv_heads = {}\nd_model = {}\nffn_hidden = {}\n"
      "seq_len = {}\nvocab_size = {}\nrope_theta = {}\nnorm_eps = {}\n[train]\nsteps = 1\n[data]\nsynthetic = true\n",
      c.n_layers, c.n_heads, c.n_kv_heads, c.d_model, c.ffn_hidden, c.seq_len, c.vocab_size, c.rope_theta, c.norm_eps);
  std::ofstream(dir / "c.toml") << toml;
  const std::string folder = test::source_dir() + "/tests/fixtures/llama_hf";
  auto r = test::run_cmd(test::tripod_bin() + " ckpt convert " + folder + " --from safetensors " +
                         (dir / "ck").string() + " --config " + (dir / "c.toml").string());
  ASSERT_EQ(r.status, 0) << r.err;
  load_param_values(resolve_checkpoint((dir / "ck").string(), ""), m.reg, *m.ops);
  const double want = m.g["hf_loss"].get<double>();
  EXPECT_NEAR(m.loss(), want, 1e-5 * want);
  // Another d_model in the config: refused, naming both sides.
  std::string other = toml;
  other.replace(other.find("d_model = 32"), 12, "d_model = 64");
  std::ofstream(dir / "other.toml") << other;
  r = test::run_cmd(test::tripod_bin() + " ckpt convert " + folder + " --from safetensors " + (dir / "ck2").string() +
                    " --config " + (dir / "other.toml").string());
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("error: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("hidden_size = 32 but model.d_model = 64"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir / "ck2" / "latest"));
  fs::remove_all(dir);
}

TEST_P(Golden, DirectionalFiniteDifferenceOfWholeModel) {
  GoldenModel m({}, GetParam());
  m.loss_and_grads();
  // g . d against (L(w + h d) - L(w - h d)) / 2h along a random direction d over all parameters.
  Tensor& w = m.reg.flat_values();
  const int64_t n = w.numel();
  std::vector<float> w0(w.data<float>(), w.data<float>() + n), d(n);
  CounterRng rng(7, 7);
  double gd = 0;
  for (int64_t i = 0; i < n; ++i) {
    d[i] = static_cast<float>(rng.normal(i));
    gd += static_cast<double>(d[i]) * m.reg.flat_grads().data<float>()[i];
  }
  auto at = [&](double s) {
    for (int64_t i = 0; i < n; ++i) w.data<float>()[i] = static_cast<float>(w0[i] + s * d[i]);
    return m.loss();
  };
  // Richardson extrapolation of central differences cancels the h^2 term; the f32 loss leaves
  // noise of about 1e-3 relative at these steps.
  auto central = [&](double h) { return (at(h) - at(-h)) / (2 * h); };
  const double h = 2e-3;
  double fd = (4 * central(h / 2) - central(h)) / 3;
  EXPECT_NEAR(fd, gd, 3e-3 * std::abs(gd)) << "finite difference " << fd << " vs gradient " << gd;
}

TEST_P(Golden, RecomputationGivesIdenticalGradientBits) {
  GoldenModel none({}, GetParam());
  none.loss_and_grads();
  for (RecomputeMode mode : {RecomputeMode::Selective, RecomputeMode::Full}) {
    GoldenModel rc(RecomputeConfig{.mode = mode, .num_layers = -1}, GetParam());
    rc.loss_and_grads();
    EXPECT_EQ(0, std::memcmp(none.reg.flat_grads().raw(), rc.reg.flat_grads().raw(),
                             none.reg.flat_grads().nbytes()))
        << "mode " << static_cast<int>(mode);
  }
}

// Mixtures of experts against PyTorch (make_moe_golden.py): Mixtral (softmax router, top 2 of 4,
// renormalised), Qwen3-MoE (q/k norms, a dense first layer, weights not renormalised) and a
// DeepSeek-style GPT-2 (sigmoid router with a selection bias, a shared expert, GELU experts, a
// capacity that drops pairs). The language model's loss, every gradient of it plus the balancing
// and z-losses, each layer's losses and the dropped pairs; recomputation and the split backward
// give the same gradient bits (the router's choices replayed).
class MoeGolden : public ::testing::TestWithParam<const char*> {};
INSTANTIATE_TEST_SUITE_P(Models, MoeGolden,
                         ::testing::Values("mixtral_golden.json", "qwen3_moe_golden.json", "moe_sigmoid_golden.json"),
                         [](const auto& info) {
                           const std::string s = info.param;
                           return s.substr(0, s.find("_golden"));
                         });

TEST_P(MoeGolden, MatchesPyTorchLossGradientsAndAuxiliaryLosses) {
  GoldenModel m({}, GetParam());
  double loss = m.loss_and_grads();
  EXPECT_NEAR(loss, m.g["loss"].get<double>(), 1e-5 * m.g["loss"].get<double>());
  for (Param& p : m.reg.params()) {
    const auto [want, scale] = golden_tensor(m.g["grads"][p.spec.name], p.numel());
    SCOPED_TRACE(p.spec.name);
    EXPECT_CLOSE(p.grad, want, 2e-5 * scale + 1e-12, 1e-3);  // (an expert no pair reached: all zero)
  }
  const auto& layers = m.model->moe_layers();
  ASSERT_EQ(layers.size(), m.g["aux_loss"].size());
  double dropped = 0;
  for (size_t i = 0; i < layers.size(); ++i) {
    const MoeStepStats& st = layers[i]->stats();
    EXPECT_NEAR(st.aux, m.g["aux_loss"][i].get<double>(), 1e-5 * m.g["aux_loss"][i].get<double>()) << "layer " << i;
    EXPECT_NEAR(st.z, m.g["z_loss"][i].get<double>(), 1e-5 * m.g["z_loss"][i].get<double>()) << "layer " << i;
    dropped += st.dropped;
  }
  EXPECT_EQ(dropped, m.g["dropped"].get<double>());
}

TEST_P(MoeGolden, RecomputationAndSplitBackwardGiveIdenticalGradientBits) {
  GoldenModel none({}, GetParam());
  none.loss_and_grads();
  for (RecomputeMode mode : {RecomputeMode::Selective, RecomputeMode::Full}) {
    GoldenModel rc(RecomputeConfig{.mode = mode, .num_layers = -1}, GetParam());
    rc.loss_and_grads();
    EXPECT_EQ(0, std::memcmp(none.reg.flat_grads().raw(), rc.reg.flat_grads().raw(),
                             none.reg.flat_grads().nbytes()))
        << "mode " << enum_name(mode);
    GoldenModel split(RecomputeConfig{.mode = mode, .num_layers = -1}, GetParam());
    split.loss_and_grads_split();
    EXPECT_EQ(0, std::memcmp(none.reg.flat_grads().raw(), split.reg.flat_grads().raw(),
                             none.reg.flat_grads().nbytes()))
        << "split backward, mode " << enum_name(mode);
  }
}

// The inference forward (dropless, the KV cache) gives PyTorch's logits for the dropless models.
TEST(GptModel, MoeLogitsMatchPyTorch) {
  for (const char* file : {"mixtral_golden.json", "qwen3_moe_golden.json"}) {
    SCOPED_TRACE(file);
    GoldenModel m({}, file);
    const int64_t B = m.g["config"]["batch"], T = m.cfg.seq_len, V = m.cfg.vocab_size;
    InferenceModel inf(*m.ops, *m.world.par, m.cfg, m.reg, T);
    const auto& ref = m.g["logits"];
    double scale = 0;
    for (const auto& v : ref) scale = std::max(scale, std::abs(v.get<double>()));
    for (int64_t b = 0; b < B; ++b) {
      inf.reset();
      std::vector<int32_t> seq(m.mb.tokens.data<int32_t>() + b * T, m.mb.tokens.data<int32_t>() + (b + 1) * T);
      std::vector<float> got = inf.forward(std::span<const int32_t>(seq.data(), 3), true);  // prefill 3
      for (int64_t t = 3; t < T; ++t) {  // then one token at a time
        std::vector<float> one = inf.forward(std::span<const int32_t>(seq.data() + t, 1), true);
        got.insert(got.end(), one.begin(), one.end());
      }
      ASSERT_EQ(static_cast<int64_t>(got.size()), T * V);
      for (int64_t i = 0; i < T * V; ++i)
        ASSERT_NEAR(got[i], ref[b * T * V + i].get<double>(), 2e-5 * scale) << "sequence " << b << " element " << i;
    }
  }
}

// The Hugging Face Mixtral and Qwen3-MoE folders the PyTorch reference wrote import with `ckpt
// convert --from safetensors` (with and without a --config) and give the reference's loss; exported
// again they are the same tensors; a --config whose expert count disagrees is refused naming both.
TEST(GptModel, HuggingFaceMoeFoldersImportAndExportWithTheReferenceLoss) {
  namespace fs = std::filesystem;
  for (auto [file, folder, experts_key] :
       {std::tuple{"mixtral_golden.json", "mixtral_hf", "num_local_experts"},
        std::tuple{"qwen3_moe_golden.json", "qwen3_moe_hf", "num_experts"}}) {
    SCOPED_TRACE(folder);
    GoldenModel m({}, file);
    const fs::path dir = fs::temp_directory_path() / fmt::format("tripod_{}_{}", folder, ::getpid());
    fs::remove_all(dir);
    fs::create_directories(dir);
    const ModelConfig& c = m.cfg;
    const std::string toml = fmt::format(
        "[model]\narch = \"llama\"\nn_layers = {}\nn_heads = {}\nn_kv_heads = {}\nd_model = {}\nffn_hidden = {}\n"
        "seq_len = {}\nvocab_size = {}\nrope_theta = {}\nnorm_eps = {}\nqk_norm = {}\n[moe]\nexperts = {}\n"
        "top_k = {}\nffn_hidden = {}\nnormalize_top_k = {}\nlayers = {}\n[train]\nsteps = 1\n[data]\n"
        "synthetic = true\n",
        c.n_layers, c.n_heads, c.n_kv_heads, c.d_model, c.ffn_hidden, c.seq_len, c.vocab_size, c.rope_theta,
        c.norm_eps, c.qk_norm, c.moe.experts, c.moe.top_k, c.moe.ffn_hidden, c.moe.normalize_top_k,
        c.moe.first_dense > 0 ? fmt::format("{{first_dense = {}}}", c.moe.first_dense) : "\"all\"");
    std::ofstream(dir / "c.toml") << toml;
    const std::string src = test::source_dir() + "/tests/fixtures/" + folder;
    for (const std::string& with : {std::string(" --config ") + (dir / "c.toml").string(), std::string()}) {
      fs::remove_all(dir / "ck");
      auto r = test::run_cmd(test::tripod_bin() + " ckpt convert " + src + " --from safetensors " +
                             (dir / "ck").string() + with);
      ASSERT_EQ(r.status, 0) << r.err;
      load_param_values(resolve_checkpoint((dir / "ck").string(), ""), m.reg, *m.ops);
      const double want = m.g["loss"].get<double>();
      EXPECT_NEAR(m.loss(), want, 1e-5 * want) << with;
    }
    // Exported again: the folder's tensors, and a config.json that reads back as the same model.
    auto r = test::run_cmd(test::tripod_bin() + " ckpt convert " + (dir / "ck").string() + " --to safetensors " +
                           (dir / "out").string());
    ASSERT_EQ(r.status, 0) << r.err;
    const SafetensorsFolder a = read_safetensors_folder(src), b = read_safetensors_folder((dir / "out").string());
    ASSERT_EQ(a.weights.tensors.size(), b.weights.tensors.size());
    std::map<std::string, const NamedTensor*> by_name;
    for (const NamedTensor& t : b.weights.tensors) by_name[t.name] = &t;
    for (const NamedTensor& t : a.weights.tensors) {
      ASSERT_TRUE(by_name.count(t.name)) << t.name;
      EXPECT_EQ(by_name[t.name]->shape, t.shape) << t.name;
      EXPECT_EQ(by_name[t.name]->data, t.data) << t.name;
    }
    EXPECT_EQ(b.config["model_type"], a.config["model_type"]);
    EXPECT_EQ(model_to_json(llama_model_from_hf(b.config, "out")), model_to_json(llama_model_from_hf(a.config, "in")));
    // Another expert count in the config: refused, naming both keys; nothing written.
    std::string other = toml;
    other.replace(other.find("experts = 4"), 11, "experts = 8");
    std::ofstream(dir / "other.toml") << other;
    r = test::run_cmd(test::tripod_bin() + " ckpt convert " + src + " --from safetensors " + (dir / "ck2").string() +
                      " --config " + (dir / "other.toml").string());
    EXPECT_EQ(r.status, 2);
    EXPECT_NE(r.err.find(fmt::format("error: {}/config.json: {} = 4 but moe.experts = 8", src, experts_key)),
              std::string::npos)
        << r.err;
    EXPECT_FALSE(fs::exists(dir / "ck2" / "latest"));
    fs::remove_all(dir);
  }
}

// The same sample for every index: a fixed batch to overfit.
class FixedSource final : public SampleSource {
 public:
  FixedSource(int64_t seq_len, int64_t vocab, int64_t n) : inner_(seq_len, vocab, 99, n) {}
  int64_t sample_tokens() const override { return inner_.sample_tokens(); }
  int64_t num_samples() const override { return inner_.num_samples(); }
  void get(int64_t index, std::span<int32_t> out) const override { inner_.get(index % num_samples(), out); }

 private:
  SyntheticSource inner_;
};

std::vector<double> train_losses(Config cfg, const SampleSource& data) {
  auto ops = make_ops(Device::CPU);
  auto w = test::make_subworld(*ops, RankGrid(1, 1, 1));
  validate_layout(cfg, 1);
  Trainer t(cfg, *ops, *w.par, &data);
  std::vector<double> out;
  for (int64_t s = 0; s < cfg.train.steps; ++s) out.push_back(t.step().loss);
  return out;
}

class Arch : public ::testing::TestWithParam<const char*> {};
INSTANTIATE_TEST_SUITE_P(Models, Arch, ::testing::Values("gpt2", "llama"));

TEST_P(Arch, OverfitsAFixedBatch) {
  Config cfg = test::tiny_config(2, 64, 4, 32, 64);
  if (std::string(GetParam()) == "llama") test::make_llama(cfg.model, 2);
  cfg.train.steps = 150;
  cfg.train.lr = 3e-3;
  cfg.train.min_lr = 3e-3;
  cfg.train.weight_decay = 0;
  cfg.train.global_batch_size = 4;
  FixedSource data(32, 64, 4);
  auto losses = train_losses(cfg, data);
  EXPECT_GT(losses.front(), 3.5);
  EXPECT_LT(losses.back(), 0.1) << "after " << losses.size() << " steps";
}

// Independent uniform tokens (SyntheticSource repeats a short phrase, whose few distinct tokens
// would route as a handful of blocks).
class IidSource final : public SampleSource {
 public:
  IidSource(int64_t seq_len, int64_t vocab) : seq_len_(seq_len), vocab_(vocab) {}
  int64_t sample_tokens() const override { return seq_len_ + 1; }
  int64_t num_samples() const override { return 1 << 20; }
  void get(int64_t index, std::span<int32_t> out) const override {
    CounterRng rng(99, static_cast<uint64_t>(index));
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<int32_t>(rng.uniform(i) * vocab_) % vocab_;
  }

 private:
  int64_t seq_len_, vocab_;
};

// Aux-loss-free balancing (DeepSeek-V3's selection bias, moe.bias_update_rate): a router skewed so
// that every token prefers the low-numbered experts (a constant feature in every token's input,
// which the router weighs by 8 - e) starts far out of balance; the bias, moved each step by the
// batch's counts alone (no balancing loss, a learning rate too small to rebalance the router),
// brings the busiest expert's load under 1.2 times the mean within 60 steps and keeps it there
// (the figure, printed: max/mean 2.98 at step 1, under 1.2 from step 40, about 1.09 after).
TEST(Trainer, SelectionBiasBalancesASkewedRouter) {
  const int kSteps = 100;
  Config cfg = test::tiny_config(/*n_layers=*/1, /*d_model=*/32, /*n_heads=*/4, /*seq_len=*/64, /*vocab=*/1024);
  test::make_llama(cfg.model, 2);
  cfg.model.moe = {.experts = 8, .top_k = 2, .ffn_hidden = 16, .router = MoeRouter::Sigmoid,
                   .bias_update_rate = 0.003};
  cfg.train.steps = kSteps;
  cfg.train.micro_batch_size = 8;
  cfg.train.global_batch_size = 32;  // 2048 tokens a step: the counts' own noise is a few percent
  cfg.train.lr = cfg.train.min_lr = 1e-7;
  cfg.train.warmup_steps = 0;
  IidSource data(cfg.model.seq_len, cfg.model.vocab_size);
  auto ops = make_ops(Device::CPU);
  auto w = test::make_subworld(*ops, RankGrid(1, 1, 1));
  validate_layout(cfg, 1);
  Trainer t(cfg, *ops, *w.par, &data);
  // The skew: embedding column 0 a constant 1 (every token's input has it), router weight on it
  // 0.03 (8 - e) for expert e; the router's other weights N(0, 0.5^2), so that tokens differ.
  Param* wte = t.registry().find("wte");
  Param* router = t.registry().find("h.0.mlp.router.weight");
  ASSERT_TRUE(wte && router);
  for (int64_t v = 0; v < wte->spec.local_shape()[0]; ++v) wte->value.data<float>()[v * 32] = 1.f;
  CounterRng rng(11, 11);
  for (int e = 0; e < 8; ++e)
    for (int c = 0; c < 32; ++c)
      router->value.data<float>()[e * 32 + c] =
          c == 0 ? 0.03f * (8 - e) : static_cast<float>(0.5 * rng.normal(static_cast<uint64_t>(e * 32 + c)));
  std::vector<double> ratio;
  std::string figure;
  for (int s = 0; s < kSteps; ++s) {
    const StepRecord m = t.step();
    ASSERT_EQ(m.moe.size(), 1u);
    ratio.push_back(m.moe[0].max_over_mean());
    if (s % 20 == 0 || s == kSteps - 1) figure += fmt::format(" {}:{:.2f}", s + 1, ratio.back());
  }
  fmt::print("max/mean tokens per expert by step:{}\n", figure);
  EXPECT_GT(ratio.front(), 2.0) << "the router must start skewed (4: top 2 of 8 on every token)";
  int first = -1;
  for (int s = 0; s < kSteps && first < 0; ++s)
    if (ratio[s] < 1.2) first = s + 1;
  EXPECT_GT(first, 0) << figure;
  EXPECT_LE(first, 60) << figure;
  // Then it stays balanced: over the last 50 steps a mean under 1.15 and every step under 1.25
  // (each step's counts are a sample of 2048 tokens, and the bias moves by the rate each step).
  double late = 0, worst = 0;
  for (int s = kSteps - 50; s < kSteps; ++s) late += ratio[s] / 50, worst = std::max(worst, ratio[s]);
  fmt::print("first under 1.2 at step {}; steps {}-{}: mean {:.3f}, max {:.3f}\n", first, kSteps - 49, kSteps, late,
             worst);
  EXPECT_LT(late, 1.15) << figure;
  EXPECT_LT(worst, 1.25) << figure;
  // The bias moved against the skew: expert 0's below expert 7's.
  const float* b = t.registry().find("h.0.mlp.expert_bias")->value.data<float>();
  EXPECT_LT(b[0], b[7]);
}

TEST(Trainer, SameSeedGivesBitIdenticalLosses) {
  Config cfg = test::tiny_config();
  cfg.train.steps = 4;
  SyntheticSource data(cfg.model.seq_len, cfg.model.vocab_size, 5);
  auto a = train_losses(cfg, data), b = train_losses(cfg, data);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "step " << i;
  cfg.train.seed += 1;  // and a different seed differs
  auto c = train_losses(cfg, data);
  EXPECT_NE(a[0], c[0]);
}

std::vector<float> flat_values(Trainer& t) {
  const Tensor& v = t.registry().flat_values();
  return std::vector<float>(v.data<float>(), v.data<float>() + v.numel());
}

TEST(Trainer, NonFiniteLossOrGradNormSkipsTheUpdateAndIsCounted) {
  Config cfg = test::tiny_config();
  cfg.train.steps = 6;
  cfg.train.max_bad_steps = 2;
  const auto ckpt = std::filesystem::temp_directory_path() / ("tripod_nan_" + std::to_string(::getpid()));
  cfg.checkpoint.dir = ckpt.string();
  cfg.checkpoint.interval = 1;  // saves after every step run() takes
  SyntheticSource data(cfg.model.seq_len, cfg.model.vocab_size, 5);
  auto ops = make_ops(Device::CPU);
  auto w = test::make_subworld(*ops, RankGrid(1, 1, 1));
  validate_layout(cfg, 1);
  Trainer t(cfg, *ops, *w.par, &data, nullptr, DebugOptions{.inject_nan = parse_fault_injections("grad@2,loss@4,loss@5")});

  EXPECT_FALSE(t.step().skipped);
  std::vector<float> before = flat_values(t);
  StepRecord m = t.step();  // grad@2
  EXPECT_TRUE(m.skipped);
  EXPECT_TRUE(std::isnan(m.grad_norm));
  EXPECT_EQ(m.skipped_total, 1);
  EXPECT_EQ(flat_values(t), before) << "a skipped step must leave the weights untouched";
  m = t.step();
  EXPECT_FALSE(m.skipped);
  EXPECT_TRUE(std::isfinite(m.loss));
  EXPECT_NE(flat_values(t), before);
  // Two in a row reach train.max_bad_steps = 2: the run stops with a message naming the step.
  try {
    t.run();
    FAIL() << "two bad steps in a row must stop the run";
  } catch (const Error& e) {  // a failure of the run (exit 1), not bad input
    EXPECT_NE(std::string(e.what()).find("2 steps in a row"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("step 5"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("the last good checkpoint is " + (ckpt / "iter_0000004").string()),
              std::string::npos)
        << e.what();
  }
  std::filesystem::remove_all(ckpt);
  EXPECT_EQ(t.completed_steps(), 5);
}

// The samples of a golden file, in order: sample i is the golden file's row i (indices wrap).
class GoldenSource final : public SampleSource {
 public:
  explicit GoldenSource(const json& rows) {
    for (const auto& r : rows) rows_.push_back(r.get<std::vector<int32_t>>());
  }
  int64_t sample_tokens() const override { return static_cast<int64_t>(rows_[0].size()); }
  int64_t num_samples() const override { return static_cast<int64_t>(rows_.size()); }
  void get(int64_t index, std::span<int32_t> out) const override {
    const auto& r = rows_[index % num_samples()];
    std::copy(r.begin(), r.end(), out.begin());
  }

 private:
  std::vector<std::vector<int32_t>> rows_;
};

// Ten Trainer steps against PyTorch (gpt2_train_golden.json, from make_gpt2_golden.py): AdamW with
// weight decay on the matrices and embeddings only, linear warmup then cosine decay, and gradient
// clipping that acts on some steps; every step's loss, learning rate and gradient norm, and the
// final weights.
TEST(Trainer, TenStepsMatchPyTorch) {
  const json g = load_golden("gpt2_train_golden.json");
  const json init = load_golden(g["initial_params"].get<std::string>());
  const json& h = g["hyper"];
  Config cfg;
  cfg.model = golden_config(g["config"]);
  cfg.train.device = Device::CPU;
  cfg.train.micro_batch_size = cfg.train.global_batch_size = g["config"]["batch"];
  cfg.train.steps = h["steps"];
  cfg.train.warmup_steps = h["warmup_steps"];
  cfg.train.lr = h["lr"];
  cfg.train.min_lr = h["min_lr"];
  cfg.train.decay = *parse_enum<Decay>(h["decay"].get<std::string>());
  cfg.train.weight_decay = h["weight_decay"];
  cfg.train.grad_clip = h["grad_clip"];
  cfg.train.beta1 = h["beta1"];
  cfg.train.beta2 = h["beta2"];
  cfg.train.eps = h["eps"];
  cfg.train.log_interval = 1000000;
  cfg.train.output_dir = "";
  cfg.data.synthetic = true;
  GoldenSource data(g["samples"]);
  ASSERT_EQ(data.num_samples(), cfg.train.steps * cfg.train.global_batch_size);
  auto ops = make_ops(Device::CPU);
  auto w = test::make_subworld(*ops, RankGrid(1, 1, 1));
  validate_layout(cfg, 1);
  Trainer t(cfg, *ops, *w.par, &data);
  for (Param& p : t.registry().params()) {
    const auto& v = init["params"][p.spec.name];
    ASSERT_FALSE(v.is_null()) << p.spec.name;
    float* dst = p.value.data<float>();
    std::fill(dst, dst + p.numel(), 0.f);  // vocabulary padding rows stay zero
    for (size_t i = 0; i < v.size(); ++i) dst[i] = v[i].get<float>();
  }
  int clipped = 0;
  for (int64_t s = 0; s < cfg.train.steps; ++s) {
    SCOPED_TRACE("step " + std::to_string(s + 1));
    StepRecord m = t.step();
    const double loss = g["losses"][s], lr = g["lrs"][s], norm = g["grad_norms"][s];
    EXPECT_FALSE(m.skipped);
    EXPECT_NEAR(m.loss, loss, 1e-5 * loss);
    EXPECT_NEAR(m.lr, lr, 1e-12 * lr);
    EXPECT_NEAR(m.grad_norm, norm, 1e-5 * norm);
    clipped += norm > cfg.train.grad_clip;
  }
  EXPECT_GT(clipped, 0) << "the golden run must exercise clipping";
  EXPECT_LT(clipped, cfg.train.steps) << "and steps without it";
  for (Param& p : t.registry().params()) {
    const auto [want, scale] = golden_tensor(g["final_params"][p.spec.name], p.numel());
    SCOPED_TRACE(p.spec.name);
    EXPECT_CLOSE(p.value, want, 1e-5 * scale, 1e-4);
  }
}

// Packed documents against PyTorch with Megatron-LM's masks and positions (documents_golden.json,
// from make_documents_golden.py: _get_ltor_masks_and_position_ids' rules), GPT-2 and Llama, each
// combination of data.reset_position_ids, reset_attention_mask and eod_mask_loss it holds: one
// Trainer step over its two samples in two micro-batches, the loss (the mean over the global
// batch's counted tokens, the two samples counting differently) and every parameter's gradient.
TEST(Trainer, PackedDocumentsMatchPyTorchWithMegatronMasks) {
  const json g = load_golden("documents_golden.json");
  GoldenSource data(g["samples"]);
  auto ops = make_ops(Device::CPU);
  auto w = test::make_subworld(*ops, RankGrid(1, 1, 1));
  for (const auto& [name, model] : g["models"].items())
    for (const auto& [case_name, c] : model["cases"].items()) {
      SCOPED_TRACE(name + " " + case_name);
      Config cfg;
      cfg.model = golden_config(model["config"]);
      cfg.train.device = Device::CPU;
      cfg.train.micro_batch_size = 1;
      cfg.train.global_batch_size = model["config"]["batch"];
      cfg.train.steps = 1;
      cfg.train.grad_clip = 0;
      cfg.train.log_interval = 1000000;
      cfg.train.output_dir = "";
      cfg.data.eod_token_id = g["eod_token"];
      cfg.data.reset_position_ids = c["reset_position_ids"];
      cfg.data.reset_attention_mask = c["reset_attention_mask"];
      cfg.data.eod_mask_loss = c["eod_mask_loss"];
      validate_layout(cfg, 1);
      Trainer t(cfg, *ops, *w.par, &data);
      for (Param& p : t.registry().params()) {
        const auto& v = model["params"][p.spec.name];
        ASSERT_FALSE(v.is_null()) << p.spec.name;
        float* dst = p.value.data<float>();
        std::fill(dst, dst + p.numel(), 0.f);
        for (size_t i = 0; i < v.size(); ++i) dst[i] = v[i].get<float>();
      }
      const StepRecord m = t.step();
      const double loss = c["loss"];
      EXPECT_NEAR(m.loss, loss, 1e-5 * loss);
      for (Param& p : t.registry().params()) {
        const auto [want, scale] = golden_tensor(c["grads"][p.spec.name], p.numel());
        SCOPED_TRACE(p.spec.name);
        EXPECT_CLOSE(p.grad, want, 2e-5 * scale, 1e-3);
      }
    }
}

TEST(Trainer, MalformedFaultInjectionIsRefused) {
  EXPECT_THROW(parse_fault_injections("nan@3"), InputError);
  EXPECT_THROW(parse_fault_injections("loss@x"), InputError);
  EXPECT_EQ(parse_fault_injections("loss@3,grad@7").size(), 2u);
  EXPECT_TRUE(parse_fault_injections(nullptr).empty());
}

}  // namespace
}  // namespace tripod
