// Packed documents on every layout (8 ranks under mpirun): with data.reset_position_ids and
// data.reset_attention_mask a packed sequence gives the per-token losses and the gradients of
// running each of its documents on its own (a model of the document's length, positions from 0),
// serially and under tp = 2 (+SP), pp = 2, cp = 2 (ring and all-gather) and their combination, a
// split-backward schedule and recomputation,
// for GPT-2 (learned positions) and Llama (rope, grouped-query attention); with
// data.eod_mask_loss too every layout trains as the serial run does (the loss a mean over the
// global batch's counted tokens); the ring and the all-gather send less when documents are short;
// the memory plan holds; evaluation averages over the tokens that count.
#include <fmt/format.h>

#include <cstring>
#include <map>

#include "config/memory_plan.h"
#include "harness.h"
#include "parallel/context_parallel/attention.h"
#include "test_util.h"
#include "train/evaluator.h"

namespace tripod {
namespace {

constexpr int64_t kVocab = 100;
constexpr int32_t kEod = kVocab - 1;

// Megatron-style samples over a stream of documents: each document a run of random tokens ending
// with the end-of-document token, lengths 1..2*mean-1; sample i is stream tokens [i T, i T + T].
class PackedSource final : public SampleSource {
 public:
  PackedSource(int64_t T, int64_t mean, uint64_t seed, int64_t samples = 64) : T_(T), n_(samples) {
    CounterRng rng(seed, 5);
    int64_t draw = 0;
    while (static_cast<int64_t>(stream_.size()) < samples * T + 1) {
      const int64_t len = 1 + static_cast<int64_t>(rng.uniform(draw++) * (2 * mean - 1));
      for (int64_t i = 0; i + 1 < len; ++i)
        stream_.push_back(static_cast<int32_t>(rng.uniform(draw++) * (kVocab - 1)) % (kVocab - 1));
      stream_.push_back(kEod);
    }
  }
  int64_t sample_tokens() const override { return T_ + 1; }
  int64_t num_samples() const override { return n_; }
  void get(int64_t index, std::span<int32_t> out) const override {
    const int64_t at = (index % n_) * T_;
    std::copy(stream_.begin() + at, stream_.begin() + at + T_ + 1, out.begin());
  }

 private:
  int64_t T_, n_;
  std::vector<int32_t> stream_;
};

struct Layout {
  int tp = 1;
  bool sp = false;
  int pp = 1, cp = 1, dp = 1;
  CpComm comm = CpComm::Ring;
  ScheduleKind schedule = ScheduleKind::OneFOneB;
  RecomputeMode recompute = RecomputeMode::None;
  std::string str() const {
    return fmt::format("tp={}{} pp={} cp={} {} dp={} {} recompute {}", tp, sp ? "+sp" : "", pp, cp, enum_name(comm),
                       dp, enum_name(schedule), enum_name(recompute));
  }
  RankGrid grid() const { return RankGrid(tp, dp, pp, cp); }
  Config apply(Config c) const {
    c.parallel.tp = tp;
    c.parallel.pp = pp;
    c.parallel.cp = cp;
    c.parallel.dp = dp;
    c.parallel.cp_comm = comm;
    c.parallel.sequence_parallel = sp;
    c.parallel.schedule = schedule;
    c.recompute.mode = recompute;
    return c;
  }
};

// 4 layers (pp = 2), seq 16 (cp = 2 and 4), a global batch of 4 in micro-batches of 2.
Config base_config(bool llama) {
  Config cfg = test::tiny_config(4, 32, 4, 16, kVocab);
  if (llama) test::make_llama(cfg.model, 2);
  cfg.train.micro_batch_size = 2;
  cfg.train.global_batch_size = 4;
  cfg.train.steps = 1;
  cfg.train.lr = 3e-3;
  cfg.train.grad_clip = 0;
  cfg.data.synthetic = false;
  cfg.data.eod_token_id = kEod;
  cfg.data.reset_position_ids = cfg.data.reset_attention_mask = true;
  return cfg;
}

// Each document of the global batch's sequences run on its own (serially): a model of the
// document's length with the given weights, its tokens at positions 0.., its targets the next
// tokens of the sample; per sequence the tokens' losses in order, and the gradients (each token's
// loss scaled as the packed step scales it) summed over all documents.
struct Alone {
  std::vector<std::vector<float>> losses;  // per sequence, T values
  std::map<std::string, std::vector<float>> grads;
};
Alone run_alone(const Config& cfg, const std::map<std::string, std::vector<float>>& weights, const SampleSource& data,
                Ops& ops) {
  const int64_t T = cfg.model.seq_len, GB = cfg.train.global_batch_size;
  auto self = test::make_selfworld(ops);
  Alone out;
  std::vector<int32_t> sample(T + 1);
  for (int64_t b = 0; b < GB; ++b) {
    data.get(b, sample);
    Documents docs{.T = T};
    docs.add_sequence(std::span<const int32_t>(sample.data(), T), kEod);
    out.losses.emplace_back();
    for (int64_t i = 0; i < docs.count(0); ++i) {
      const int64_t s = docs.starts[i], e = i + 1 < docs.count(0) ? docs.starts[i + 1] : T, len = e - s;
      ModelConfig mc = cfg.model;
      mc.seq_len = static_cast<int>(len);
      mc.max_positions = static_cast<int>(T);  // the same position table
      ParamRegistry reg;
      GptModel model(ops, *self.par, mc, rank_chunks({mc.n_layers}, 1, 1, 0), RecomputeConfig{}, reg);
      reg.allocate(ops);
      test::set_global_params(weights, reg, ops);
      reg.zero_grads(ops);
      MicroBatch mb;
      mb.shape = {.B = 1, .T = len};
      mb.tokens = ops.empty({len}, DType::I32, MemCategory::Activations);
      mb.targets = ops.empty({len}, DType::I32, MemCategory::Activations);
      std::copy(sample.begin() + s, sample.begin() + e, mb.tokens.data<int32_t>());
      std::copy(sample.begin() + s + 1, sample.begin() + e + 1, mb.targets.data<int32_t>());
      mb.grad_scale = 1.f / static_cast<float>(GB * T);
      mb.losses = ops.empty({len}, DType::F32, MemCategory::Workspace);
      ChunkActs acts;
      model.forward(0, mb, Tensor{}, acts);
      model.backward(0, mb, Tensor{}, acts);
      const float* l = mb.losses.data<float>();
      out.losses.back().insert(out.losses.back().end(), l, l + len);
      for (auto& [name, g] : test::gather_global_params(reg, *self.par, ops, /*grads=*/true)) {
        auto& sum = out.grads[name];
        if (sum.empty()) sum.assign(g.size(), 0.f);
        for (size_t k = 0; k < g.size(); ++k) sum[k] += g[k];
      }
    }
  }
  return out;
}

class Documents8 : public ::testing::TestWithParam<bool> {
 protected:
  std::unique_ptr<Ops> ops = make_ops(Device::CPU);
  PackedSource data{16, 5, 7};
  int rank() const {
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
  }
};
INSTANTIATE_TEST_SUITE_P(Models, Documents8, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Llama" : "Gpt2"; });

// The whole claim: per-token losses (serially, through load_microbatch) and gradients (every
// layout, one Trainer step) of the packed sequences equal those of their documents run alone.
TEST_P(Documents8, PackedEqualsEachDocumentAlone) {
  const Config cfg = base_config(GetParam());
  std::map<std::string, std::vector<float>> weights;
  {
    auto self = test::make_selfworld(*ops);
    Config c = cfg;
    validate_layout(c, 1);
    Trainer t(c, *ops, *self.par, &data);
    weights = test::gather_global_params(t.registry(), *self.par, *ops);
  }
  const Alone alone = run_alone(cfg, weights, data, *ops);
  double mean = 0;
  int64_t tokens = 0;
  for (const auto& seq : alone.losses) {
    ASSERT_EQ(static_cast<int64_t>(seq.size()), cfg.model.seq_len);
    for (float l : seq) mean += l, ++tokens;
  }
  mean /= static_cast<double>(tokens);

  // Per-token losses of the packed micro-batches, serially.
  {
    auto self = test::make_selfworld(*ops);
    Config c = cfg;
    validate_layout(c, 1);
    const RankLayout layout = make_rank_layout(c, 0);
    ParamRegistry reg;
    GptModel model(*ops, *self.par, c.model, layout.chunks, RecomputeConfig{}, reg);
    reg.allocate(*ops);
    test::set_global_params(weights, reg, *ops);
    for (int micro = 0; micro < layout.microbatches; ++micro) {
      MicroBatch mb;
      load_microbatch(&data, c, layout, *ops, 0, micro, mb);
      ASSERT_TRUE(mb.shape.docs);
      mb.losses = ops->empty({layout.micro_tokens}, DType::F32, MemCategory::Workspace);
      ChunkActs acts;
      model.forward(0, mb, Tensor{}, acts);
      for (int64_t b = 0; b < layout.micro_batch_size; ++b)
        for (int64_t t = 0; t < c.model.seq_len; ++t)
          EXPECT_NEAR(mb.losses.data<float>()[b * c.model.seq_len + t],
                      alone.losses[micro * layout.micro_batch_size + b][t], 2e-5)
              << "sequence " << micro * layout.micro_batch_size + b << " token " << t;
    }
  }

  for (const Layout& l : std::vector<Layout>{
           {}, {.tp = 2, .sp = true}, {.pp = 2}, {.cp = 2}, {.cp = 2, .comm = CpComm::AllGather}, {.cp = 4},
           {.tp = 2, .pp = 2, .cp = 2}, {.tp = 2, .pp = 2, .cp = 2, .comm = CpComm::AllGather},
           {.pp = 2, .schedule = ScheduleKind::ZbH1, .recompute = RecomputeMode::Full},
           {.tp = 2, .sp = true, .cp = 2, .recompute = RecomputeMode::Selective}}) {
    SCOPED_TRACE(l.str());
    auto w = test::make_subworld(*ops, l.grid(), l.sp, l.comm);
    if (!w.par) continue;
    Config c = l.apply(cfg);
    validate_layout(c, l.grid().world_size());
    Trainer t(c, *ops, *w.par, &data);
    const StepRecord m = t.step();
    EXPECT_NEAR(m.loss, mean, 1e-5 * mean);
    const auto grads = test::gather_global_params(t.registry(), *w.par, *ops, /*grads=*/true);
    std::string worst;
    const double d = test::max_relative_difference(grads, alone.grads, &worst);
    EXPECT_LT(d, 2e-4) << "worst tensor " << worst;
    if (w.par->rank == 0) std::printf("[ %s ] packed vs alone: loss %.6g vs %.6g, gradients within %.2e (%s)\n",
                                      l.str().c_str(), m.loss, mean, d, worst.c_str());
  }
}

// All three flags, three steps, on every layout: the serial run's losses and weights (the loss of
// a step is the mean over the global batch's counted tokens, whatever splits the batch).
TEST_P(Documents8, EodMaskLossEveryLayoutMatchesSerial) {
  Config cfg = base_config(GetParam());
  cfg.data.eod_mask_loss = true;
  cfg.train.steps = 3;
  cfg.train.grad_clip = 0.5;
  test::RunResult ref;
  {
    auto self = test::make_selfworld(*ops);
    ref = test::run_training(cfg, *ops, *self.par, data);
  }
  for (const Layout& l : std::vector<Layout>{{.dp = 2}, {.tp = 2, .sp = true, .dp = 2}, {.pp = 2, .cp = 2, .dp = 2},
                                             {.tp = 2, .pp = 2, .cp = 2, .comm = CpComm::AllGather}}) {
    SCOPED_TRACE(l.str());
    auto w = test::make_subworld(*ops, l.grid(), l.sp, l.comm);
    if (!w.par) continue;
    const test::RunResult r = test::run_training(l.apply(cfg), *ops, *w.par, data);
    test::expect_matches(r, ref, l.str(), w.par->rank == 0);
  }
}

// Short documents: the ring and the all-gather send a fraction of what they send without the
// mask (only the rows a later chunk sees), and compute the same as each other (cp = 2: the same
// bits).
TEST_P(Documents8, ContextParallelSendsLessAndRingEqualsAllGather) {
  Config cfg = base_config(GetParam());
  cfg.model.seq_len = 64;
  PackedSource short_docs(64, 4, 11);
  std::map<CpComm, test::RunResult> runs;
  for (const CpComm comm : {CpComm::Ring, CpComm::AllGather}) {
    int64_t sent[2] = {0, 0};
    for (const bool mask : {false, true}) {
      const Layout l{.cp = 2, .comm = comm};
      auto w = test::make_subworld(*ops, l.grid(), l.sp, l.comm);
      if (!w.par) continue;
      Config c = l.apply(cfg);
      c.data.reset_attention_mask = mask;
      validate_layout(c, 2);
      Trainer t(c, *ops, *w.par, &short_docs);
      const int64_t before = w.par->cp->bytes_sent();
      t.step();
      sent[mask] = w.par->cp->bytes_sent() - before;
      if (mask) {
        test::RunResult r;
        r.params = test::gather_global_params(t.registry(), *w.par, *ops);
        runs[comm] = r;
      }
    }
    if (rank() < 2) {
      EXPECT_LT(sent[1] * 2, sent[0]) << enum_name(comm) << ": " << sent[1] << " bytes with the mask, " << sent[0]
                                      << " without";
      if (rank() == 0)
        std::printf("cp = 2 %s, documents of mean 4 in 64 tokens: %lld bytes sent per step with the mask, %lld "
                    "without\n", std::string(enum_name(comm)).c_str(), static_cast<long long>(sent[1]),
                    static_cast<long long>(sent[0]));
    }
  }
  if (rank() >= 2) return;
  for (const auto& [name, v] : runs[CpComm::Ring].params)
    EXPECT_EQ(0, std::memcmp(v.data(), runs[CpComm::AllGather].params.at(name).data(), v.size() * sizeof(float)))
        << name;
}

// The memory plan knows the documents' tensors and that no probabilities are kept.
TEST_P(Documents8, MemoryPlanMatchesMeasuredPeaks) {
  for (const Layout& l : std::vector<Layout>{{}, {.tp = 2, .pp = 2, .dp = 2}, {.pp = 2, .cp = 2}}) {
    SCOPED_TRACE(l.str());
    auto w = test::make_subworld(*ops, l.grid(), l.sp, l.comm);
    if (!w.par) continue;
    Config cfg = l.apply(base_config(GetParam()));
    cfg.data.eod_mask_loss = true;
    validate_layout(cfg, l.grid().world_size());
    const RankMemory plan = plan_rank_memory(cfg, w.par->rank);
    Trainer t(cfg, *ops, *w.par, &data);
    t.step();
    const StepRecord m = t.step();
    EXPECT_EQ(m.memory.at(0).at("params"), plan.params);
    EXPECT_EQ(m.memory.at(0).at("grads"), plan.grads);
    const int64_t act = m.memory.at(0).at("activations");
    if (l.cp == 1) {
      EXPECT_EQ(act, plan.activations) << "rank " << w.par->rank;
    } else {
      EXPECT_LE(std::abs(static_cast<double>(act - plan.activations)) / plan.activations, 0.01)
          << "rank " << w.par->rank << ": measured " << act << " planned " << plan.activations;
    }
  }
}

// Evaluation under eod_mask_loss averages over the counted tokens: the evaluated loss of the next
// step's samples is the loss the step reports.
TEST_P(Documents8, EvaluationAveragesOverCountedTokens) {
  if (rank() != 0) return;
  auto self = test::make_selfworld(*ops);
  Config masked = base_config(GetParam());
  masked.data.eod_mask_loss = true;
  validate_layout(masked, 1);
  Trainer t(masked, *ops, *self.par, &data, &data);
  const EvalResult e = t.evaluator().evaluate(&data, masked.train.global_batch_size, 0);
  const BatchDocuments counts = summarize_documents(data, masked, 0, masked.train.global_batch_size);
  EXPECT_EQ(e.tokens, counts.counted);
  EXPECT_LT(e.tokens, masked.train.global_batch_size * masked.model.seq_len);
  const StepRecord m = t.step();
  EXPECT_NEAR(e.loss, m.loss, 1e-6 * m.loss) << "the step's loss is the evaluated mean over counted tokens";
}

}  // namespace
}  // namespace tripod
