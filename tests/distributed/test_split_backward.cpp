// The backward split into I (input gradients) and W (weight gradients) for zero-bubble pipelines,
// against the whole backward B on 2 ranks: for GPT-2 and a Llama-family model, tied and untied
// tables, recompute none/selective/full, one or two chunks per rank, serial, TP = 2 and TP = 2
// with sequence parallelism. Three micro-batches whose Ws are deferred past all the Is:
// - Ws in B's order give bit-identical input and weight gradients, and the 'gradients final'
//   hook reports the same parameters in the same order, each with its final gradient;
// - Ws in another order give the same gradients within rounding (f32 accumulation over
//   micro-batches depends on its order, so bits may differ there);
// - the Activations bytes held between I and W and the peak inside I are exactly
//   chunk_activation_bytes()'s weight_pending and input_backward_peak, and W frees them all.
#include <fmt/format.h>

#include <cstring>

#include "harness.h"
#include "model/memory_estimate.h"
#include "test_util.h"

namespace tripod {
namespace {

struct Case {
  bool llama = false, tied = true;
  RecomputeMode mode = RecomputeMode::None;
  int tp = 1, vp = 1;
  bool sp = false;
  std::string str() const {
    const char* m = mode == RecomputeMode::None ? "none" : mode == RecomputeMode::Selective ? "selective" : "full";
    return fmt::format("{} {} recompute={} tp={}{} vp={}", llama ? "llama" : "gpt2", tied ? "tied" : "untied", m, tp,
                       sp ? " +sp" : "", vp);
  }
};

constexpr int kMicroBatches = 3;

// One rank's model (all vp chunks of a pp = 1 pipeline) and its micro-batches.
struct Rig {
  Ops& ops;
  ModelConfig cfg;
  RecomputeConfig rc;
  ParamRegistry reg;
  std::unique_ptr<GptModel> model;
  std::vector<MicroBatch> mbs;

  Rig(Ops& o, const ParallelContext& par, const Case& c) : ops(o) {
    cfg = test::tiny_config(2, 32, 4, 16, 100).model;
    if (c.llama) test::make_llama(cfg, 2);
    cfg.tie_embeddings = c.tied;
    rc = {.mode = c.mode, .num_layers = -1};
    model = std::make_unique<GptModel>(ops, par, cfg, rank_chunks(layers_per_stage(2, 1, c.vp, {}), 1, c.vp, 0), rc,
                                       reg);
    reg.allocate(ops);
    reg.initialize(ops, 1234);
    const int64_t B = 2, T = cfg.seq_len, N = B * T;
    for (int m = 0; m < kMicroBatches; ++m) {
      MicroBatch mb;
      mb.shape = {B, T};
      mb.tokens = ops.empty({N}, DType::I32, MemCategory::Activations);
      mb.targets = ops.empty({N}, DType::I32, MemCategory::Activations);
      CounterRng rng(77 + m, 3);
      for (int64_t i = 0; i < N; ++i) {
        mb.tokens.data<int32_t>()[i] = static_cast<int32_t>(rng.uniform(2 * i) * cfg.vocab_size);
        mb.targets.data<int32_t>()[i] = static_cast<int32_t>(rng.uniform(2 * i + 1) * cfg.vocab_size);
      }
      mb.grad_scale = 1.f / static_cast<float>(N * kMicroBatches);
      mb.losses = ops.empty({N}, DType::F32, MemCategory::Workspace);
      mbs.push_back(mb);
    }
  }
  int chunks() const { return model->num_chunks(); }

  // Forward of every chunk of micro-batch m.
  std::vector<ChunkActs> forward(int m) {
    std::vector<ChunkActs> acts(chunks());
    Tensor x;
    for (int c = 0; c < chunks(); ++c) x = model->forward(c, mbs[m], x, acts[c]);
    return acts;
  }
  std::vector<float> grads() const {
    const Tensor& g = const_cast<ParamRegistry&>(reg).flat_grads();
    return std::vector<float>(g.data<float>(), g.data<float>() + g.numel());
  }
};

std::vector<float> host_copy(const Tensor& t) { return std::vector<float>(t.data<float>(), t.data<float>() + t.numel()); }

// What the 'gradients final' hook saw: parameter names in order, each with its gradient then.
struct ReadyLog {
  std::vector<std::string> names;
  std::vector<std::vector<float>> grads;
  GradReadyFn fn() {
    return [this](const std::vector<Param*>& ps) {
      for (Param* p : ps) {
        names.push_back(p->spec.name);
        grads.push_back(host_copy(p->grad));
      }
    };
  }
};

// Input gradients at the chunk boundaries (what chunk c > 0 returns), per micro-batch.
using BoundaryGrads = std::vector<std::vector<float>>;

struct Reference {
  std::vector<float> grads;
  BoundaryGrads dx;
  ReadyLog ready;
};

Reference run_whole_backward(Rig& s) {
  Reference r;
  s.reg.zero_grads(s.ops);
  for (int m = 0; m < kMicroBatches; ++m) {
    std::vector<ChunkActs> acts = s.forward(m);
    Tensor d;
    for (int c = s.chunks() - 1; c >= 0; --c) {
      d = s.model->backward(c, s.mbs[m], d, acts[c], m == kMicroBatches - 1 ? r.ready.fn() : GradReadyFn{});
      if (c > 0) r.dx.push_back(host_copy(d));
    }
  }
  r.grads = s.grads();
  return r;
}

// Forwards and Is of every micro-batch (each I right after its forward, as 1F1B-like schedules
// interleave them), then the Ws in `w_order` ((micro-batch, chunk) pairs). Checks the memory
// accounting of every I and W on the way.
struct SplitRun {
  std::vector<float> grads;
  BoundaryGrads dx;
  ReadyLog ready;
};

SplitRun run_split_backward(Rig& s, const ParallelContext& par, const std::vector<std::pair<int, int>>& w_order) {
  SplitRun r;
  s.reg.zero_grads(s.ops);
  MemoryStats& stats = s.ops.allocator().stats();
  const int64_t baseline = stats.current(MemCategory::Activations);
  const ActivationShape shape{.B = s.mbs[0].shape.B, .T = s.mbs[0].shape.T, .tp = par.grid.tp(),
                              .sequence_parallel = par.sequence_parallel, .act_bytes = 4,
                              .keeps_probs = s.ops.keeps_attention_probs()};
  std::vector<ChunkActivationBytes> bytes;
  for (int c = 0; c < s.chunks(); ++c) bytes.push_back(chunk_activation_bytes(s.cfg, s.model->layout(c), s.rc, shape));
  int64_t all_pending = 0;
  for (const ChunkActivationBytes& b : bytes) all_pending += b.weight_pending;

  std::vector<std::vector<ChunkPending>> pending(kMicroBatches, std::vector<ChunkPending>(s.chunks()));
  for (int m = 0; m < kMicroBatches; ++m) {
    std::vector<ChunkActs> acts = s.forward(m);
    Tensor d;
    for (int c = s.chunks() - 1; c >= 0; --c) {
      const int64_t before = stats.current(MemCategory::Activations);
      const int64_t rest = before - bytes[c].input - bytes[c].held;  // all but this chunk's own tensors
      stats.reset_peaks();
      d = s.model->backward_input(c, s.mbs[m], d, acts[c], pending[m][c]);
      SCOPED_TRACE(fmt::format("I of micro-batch {} chunk {}", m, c));
      EXPECT_EQ(stats.current(MemCategory::Activations) - rest, bytes[c].weight_pending);
      EXPECT_EQ(stats.peak(MemCategory::Activations) - rest, bytes[c].input_backward_peak);
      if (c > 0) r.dx.push_back(host_copy(d));
    }
  }
  // Every micro-batch's I is done: only the pending work (and the micro-batches' tokens) is left.
  EXPECT_EQ(stats.current(MemCategory::Activations) - baseline, kMicroBatches * all_pending);

  std::vector<int> remaining(s.chunks(), 0);
  for (const auto& [m, c] : w_order) ++remaining[c];
  for (const auto& [m, c] : w_order) {
    const int64_t before = stats.current(MemCategory::Activations);
    stats.reset_peaks();
    s.model->backward_weight(c, pending[m][c], --remaining[c] == 0 ? r.ready.fn() : GradReadyFn{});
    SCOPED_TRACE(fmt::format("W of micro-batch {} chunk {}", m, c));
    EXPECT_EQ(before - stats.current(MemCategory::Activations), bytes[c].weight_pending);
    EXPECT_EQ(stats.peak(MemCategory::Activations), before);
  }
  EXPECT_EQ(stats.current(MemCategory::Activations), baseline);
  r.grads = s.grads();
  return r;
}

int64_t differing(const std::vector<float>& a, const std::vector<float>& b) {
  int64_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], 4) != 0;
  return n;
}

// Largest |a - b| relative to the largest |b|.
double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return scale > 0 ? err / scale : err;
}

class SplitBackward : public ::testing::Test {
 protected:
  std::unique_ptr<Ops> ops = make_ops(Device::CPU);
};

TEST_F(SplitBackward, InputThenWeightMatchesTheWholeBackward) {
  std::vector<Case> cases;
  for (bool llama : {false, true})
    for (bool tied : {true, false})
      for (RecomputeMode mode : {RecomputeMode::None, RecomputeMode::Selective, RecomputeMode::Full})
        for (auto [tp, sp] : std::vector<std::pair<int, bool>>{{1, false}, {2, false}, {2, true}})
          for (int vp : {1, 2}) cases.push_back({llama, tied, mode, tp, vp, sp});
  int64_t other_order_bits = 0, other_order_values = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.str());
    auto w = test::make_subworld(*ops, RankGrid(c.tp, 1, 1), c.sp);
    if (!w.par) continue;
    Rig s(*ops, *w.par, c);
    const Reference ref = run_whole_backward(s);

    // Ws in B's order: micro-batches in order, chunks from the last.
    std::vector<std::pair<int, int>> same_order, other_order;
    for (int m = 0; m < kMicroBatches; ++m)
      for (int ch = s.chunks() - 1; ch >= 0; --ch) same_order.push_back({m, ch});
    for (int m = kMicroBatches - 1; m >= 0; --m)
      for (int ch = 0; ch < s.chunks(); ++ch) other_order.push_back({(m + 1) % kMicroBatches, ch});
    const SplitRun same = run_split_backward(s, *w.par, same_order);
    ASSERT_EQ(same.dx.size(), ref.dx.size());
    for (size_t i = 0; i < ref.dx.size(); ++i) EXPECT_EQ(differing(same.dx[i], ref.dx[i]), 0) << "input gradient " << i;
    EXPECT_EQ(differing(same.grads, ref.grads), 0) << "weight gradients";
    EXPECT_EQ(same.ready.names, ref.ready.names);
    // Each parameter's gradient was final when the hook reported it.
    for (size_t i = 0; i < same.ready.names.size(); ++i) {
      const Param* p = s.reg.find(same.ready.names[i]);
      ASSERT_NE(p, nullptr);
      EXPECT_EQ(differing(same.ready.grads[i], host_copy(p->grad)), 0) << same.ready.names[i] << " changed after ready";
    }
    EXPECT_EQ(same.ready.names.size(), s.reg.params().size());

    const SplitRun other = run_split_backward(s, *w.par, other_order);
    for (size_t i = 0; i < ref.dx.size(); ++i) EXPECT_EQ(differing(other.dx[i], ref.dx[i]), 0);
    EXPECT_LE(relative_error(other.grads, ref.grads), 1e-6);
    other_order_bits += differing(other.grads, ref.grads);
    other_order_values += static_cast<int64_t>(ref.grads.size());
  }
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0)
    fmt::print("Ws in another order than B's: {} of {} gradient values differ in their bits (within 1e-6 of the "
               "largest)\n", other_order_bits, other_order_values);
}

}  // namespace
}  // namespace tripod
