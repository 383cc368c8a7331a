// The KV-cached inference forward (model/inference) against the training forward, at tp = 1 and
// tp = 2 (2 ranks under mpirun): a prefill then one token at a time gives the logits of one
// forward over the whole sequence (<= 1e-4 relative), the per-token losses of the training
// model's forward, and the same logits and generated tokens at tp = 2 as at tp = 1; for GPT-2 and
// a Llama-family model.
#include <fmt/format.h>

#include <cmath>

#include "harness.h"
#include "model/inference.h"
#include "test_util.h"

namespace tripod {
namespace {

constexpr int64_t kT = 16, kV = 100;

// ||a - b|| / ||b||.
double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, n = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    d += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    n += static_cast<double>(b[i]) * b[i];
  }
  return a.size() == b.size() ? std::sqrt(d / n) : INFINITY;
}

// Logits of every position: a prefill of `prefill` tokens, then one token at a time.
std::vector<float> incremental_logits(InferenceModel& inf, const std::vector<int32_t>& tokens, size_t prefill) {
  inf.reset();
  std::vector<float> out = inf.forward(std::span(tokens).first(prefill), true);
  for (size_t t = prefill; t < tokens.size(); ++t) {
    std::vector<float> row = inf.forward(std::span(tokens).subspan(t, 1), true);
    out.insert(out.end(), row.begin(), row.end());
  }
  return out;
}

std::vector<int32_t> generate(InferenceModel& inf, std::vector<int32_t> ids, int n, const SamplingOptions& so,
                              uint64_t seed) {
  inf.reset();
  std::mt19937_64 rng(seed);
  std::vector<float> logits = inf.forward(ids);
  for (int i = 0; i < n; ++i) {
    ids.push_back(sample_token(logits, so, rng));
    if (i + 1 < n) logits = inf.forward(std::span(ids).last(1));
  }
  return ids;
}

const SamplingOptions kGreedy{.temperature = 0}, kSampled{.temperature = 0.9, .top_k = 40, .top_p = 0.95};

class Inference : public ::testing::TestWithParam<const char*> {};
INSTANTIATE_TEST_SUITE_P(Models, Inference, ::testing::Values("gpt2", "llama"));

TEST_P(Inference, KvCacheMatchesFullForwardAndTrainingAcrossTp) {
  auto ops = make_ops(Device::CPU);
  Config cfg = test::tiny_config(2, 32, 4, kT, kV);
  // Llama: 4 query heads over 2 key/value heads (one per rank at tp = 2), rope at the cached
  // positions, RMSNorm, SwiGLU, untied head.
  if (std::string(GetParam()) == "llama") test::make_llama(cfg.model, 2);
  cfg.train.lr = 3e-3;
  SyntheticSource data(kT, kV, 5);
  std::vector<int32_t> sample(kT + 1);
  data.get(1000, sample);
  const std::vector<int32_t> tokens(sample.begin(), sample.end() - 1), prompt(sample.begin(), sample.begin() + 4);

  std::map<std::string, std::vector<float>> weights;
  std::vector<float> serial_logits;
  std::vector<int32_t> serial_greedy, serial_sampled;
  {
    auto self = test::make_selfworld(*ops);
    Config c = cfg;
    validate_layout(c, 1);
    Trainer t(c, *ops, *self.par, &data);
    for (int s = 0; s < 3; ++s) t.step();
    weights = test::gather_global_params(t.registry(), *self.par, *ops);
    InferenceModel inf(*ops, *self.par, cfg.model, t.registry(), kT);
    std::vector<float> full = inf.forward(tokens, true);
    EXPECT_EQ(inf.position(), kT);
    serial_logits = incremental_logits(inf, tokens, 5);
    const double cache_diff = rel_diff(serial_logits, full);
    EXPECT_LE(cache_diff, 1e-4) << "KV-cache decoding vs one forward over the sequence";

    // The training forward's per-token losses from the same weights and tokens.
    MicroBatch mb;
    mb.shape = {1, kT};
    CpuAllocator host;
    mb.tokens = ops->empty({kT}, DType::I32, MemCategory::Activations);
    mb.targets = ops->empty({kT}, DType::I32, MemCategory::Activations);
    mb.losses = ops->empty({kT}, DType::F32, MemCategory::Workspace);
    std::copy(sample.begin(), sample.end() - 1, mb.tokens.data<int32_t>());
    std::copy(sample.begin() + 1, sample.end(), mb.targets.data<int32_t>());
    ChunkActs acts;
    t.model().forward(0, mb, Tensor{}, acts);
    double worst = 0;
    for (int64_t i = 0; i < kT; ++i) {
      const float* row = serial_logits.data() + i * kV;
      const double m = *std::max_element(row, row + kV);
      double z = 0;
      for (int64_t v = 0; v < kV; ++v) z += std::exp(row[v] - m);
      const double loss = m + std::log(z) - row[sample[i + 1]], want = mb.losses.data<float>()[i];
      worst = std::max(worst, std::abs(loss - want) / std::abs(want));
    }
    EXPECT_LE(worst, 1e-4) << "losses from the cached logits vs the training forward";
    EXPECT_EQ(inf.max_tokens(), kT);
    EXPECT_THROW(inf.forward(std::span(tokens).first(1)), Error) << "beyond the cache";

    serial_greedy = generate(inf, prompt, 10, kGreedy, 1);
    serial_sampled = generate(inf, prompt, 10, kSampled, 7);
    EXPECT_EQ(generate(inf, prompt, 10, kSampled, 7), serial_sampled) << "a seed gives one continuation";
    EXPECT_NE(generate(inf, prompt, 10, kSampled, 8), serial_sampled) << "another seed, another continuation";
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0)
      fmt::print("{} tp=1: cached vs full logits {:.1e}; losses vs training forward {:.1e}\n", GetParam(), cache_diff,
                 worst);
  }

  auto w = test::make_subworld(*ops, RankGrid(2, 1, 1));
  if (!w.par) return;
  Config c = cfg;
  c.parallel.tp = 2;
  validate_layout(c, 2);
  Trainer t(c, *ops, *w.par, &data);
  test::set_global_params(weights, t.registry(), *ops);
  InferenceModel inf(*ops, *w.par, cfg.model, t.registry(), kT);
  const std::vector<float> logits = incremental_logits(inf, tokens, 3);
  const double tp_diff = rel_diff(logits, serial_logits);
  EXPECT_LE(tp_diff, 1e-4) << "tp=2 logits vs tp=1";
  EXPECT_EQ(generate(inf, prompt, 10, kGreedy, 1), serial_greedy);
  EXPECT_EQ(generate(inf, prompt, 10, kSampled, 7), serial_sampled);
  if (w.par->rank == 0)
    fmt::print("{} tp=2: logits vs tp=1 {:.1e}; generated tokens identical\n", GetParam(), tp_diff);
}

}  // namespace
}  // namespace tripod
