// Action times from layer shapes, the simulated schedule, DP reduction, optimizer and memory.
#include "plan/cost_model.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "model/gpt.h"
#include "config/layout.h"
#include "parallel/pipeline/simulate.h"

namespace tripod {

namespace {

// Where the ranks of each axis sit: tp fastest, then cp, then dp, then pp; nodes of g consecutive
// ranks. The gradients reduce over DP x CP (dp_intra: that group within a node); an EP group is
// ep consecutive DP x CP indices, tp * ep consecutive ranks (ep_intra).
struct GpuPlacement {
  bool tp_intra, cp_intra, dp_intra, pp_intra, ep_intra;
};
GpuPlacement place(const ParallelConfig& p, int g) {
  return {p.tp <= g, p.tp * p.cp <= g, p.tp * p.cp * p.dp <= g, p.tp * p.cp * p.dp * p.pp <= g, p.tp * p.ep <= g};
}

// T and N are this rank's tokens (seq_len / cp per sequence under context parallelism). A mixture
// of experts' sparse layers: E experts of width Fe, top k, shared experts of total width Fs, rows
// R = the pairs an EP rank's experts compute per micro-batch (N k when balanced and dropless; the
// capacity's bound when less), split over ep ranks with `dispatcher`.
struct LayerShape {
  int64_t B, T, N, Ns, C, F, H, KV, D, t, V, a, cp;
  bool sp, swiglu, rms, rope;
  int64_t E = 0, k = 0, Fe = 0, Fs = 0, R = 0, ep = 1;
  MoeDispatcher dispatcher = MoeDispatcher::AllToAll;
};

LayerShape shape_of(const Config& cfg, const Hardware& hw) {
  const ModelConfig& m = cfg.model;
  const int t = cfg.parallel.tp;
  const bool sp = cfg.parallel.sequence_parallel && t > 1;
  LayerShape s{};
  s.B = cfg.train.micro_batch_size;
  s.cp = cfg.parallel.cp;
  s.T = m.seq_len / s.cp;
  s.N = s.B * s.T;
  s.Ns = sp ? s.N / t : s.N;
  s.C = m.d_model;
  s.F = m.ffn();
  s.H = m.n_heads;
  s.KV = m.kv_heads();
  s.swiglu = m.swiglu();
  s.rms = m.rms();
  s.rope = m.rope();
  s.D = m.head_dim();
  s.t = t;
  s.V = m.padded_vocab(t);
  s.a = hw.act_bytes();
  s.sp = sp;
  if (m.moe.enabled()) {
    s.E = m.moe.experts;
    s.k = m.moe.top_k;
    s.Fe = m.expert_ffn();
    s.Fs = int64_t{m.moe.shared_experts} * s.Fe;
    s.R = m.moe.routed_rows(s.N);
    s.ep = cfg.parallel.ep;
    s.dispatcher = cfg.parallel.moe_dispatcher;
  }
  return s;
}

// The TP collectives entering and leaving one region (the conjugate pairs of
// parallel/tensor_parallel/mappings): an all-reduce of the full activation, or under sequence
// parallelism an all-gather on entry and a reduce-scatter on exit.
double tp_region(const LayerShape& s, const Hardware& hw, bool intra) {
  if (s.t == 1) return 0;
  const int64_t bytes = s.N * s.C * s.a;
  if (s.sp)
    return hw.collective_time(Collective::AllGather, s.t, bytes, intra) +
           hw.collective_time(Collective::ReduceScatter, s.t, bytes, intra);
  return hw.collective_time(Collective::AllReduce, s.t, bytes, intra);
}

// The weight-gradient share of a GEMM's backward (dX = dY W and dW = dY^T X, timed together by
// Hardware::gemm_time): dW's time as a GEMM of its own shape over both.
double weight_grad_time(const Hardware& hw, int64_t m, int64_t n, int64_t k) {
  const double dx = hw.gemm_time(m, k, n, false), dw = hw.gemm_time(n, k, m, false);
  return dx + dw > 0 ? hw.gemm_time(m, n, k, true) * dw / (dx + dw) : 0;
}

struct LayerTimes {
  ChunkTimes::Split fwd, bwd;  // comm: TP collectives, and CP's exposed exchanges
  double attn_fwd = 0;         // the attention forward (what selective recomputation reruns)
  double weight = 0;           // the GEMMs' weight gradients: W's share of bwd
};

// A layer's times; `sparse`: its MLP is a mixture of experts (s.E > 0), whose EP group sits
// within a node when `ep_intra`.
LayerTimes layer_times(const LayerShape& s, const Hardware& hw, bool intra, bool cp_intra, CpComm cp_comm,
                       bool sparse = false, bool ep_intra = true) {
  LayerTimes l;
  // Per TP rank: query and key/value heads (grouped-query attention for Llama), the MLP's first
  // GEMM (fc, or the packed gate and up of SwiGLU) and its second; or, for a mixture of experts,
  // the router (every TP rank routes every token), the experts' grouped GEMMs over their R rows
  // (timed as one GEMM of R rows: balanced experts) and the shared experts' over every token.
  const int64_t Cl = s.C / s.t, Fl = s.F / s.t, qkv = (s.H + 2 * s.KV) * s.D / s.t, sw = s.swiglu ? 2 : 1;
  std::vector<std::array<int64_t, 3>> gemms = {{s.N, qkv, s.C}, {s.N, s.C, Cl}};
  int64_t act = s.N * Fl;  // elements through the MLP's activation
  if (sparse) {
    const int64_t Fel = s.Fe / s.t, Fsl = s.Fs / s.t;
    gemms.push_back({s.N, s.E, s.C});
    gemms.push_back({s.R, sw * Fel, s.C});
    gemms.push_back({s.R, s.C, Fel});
    if (Fsl > 0) {
      gemms.push_back({s.N, sw * Fsl, s.C});
      gemms.push_back({s.N, s.C, Fsl});
    }
    act = s.R * Fel + s.N * Fsl;
  } else {
    gemms.push_back({s.N, sw * Fl, s.C});
    gemms.push_back({s.N, s.C, Fl});
  }
  for (const auto& g : gemms) {
    l.fwd.gemm += hw.gemm_time(g[0], g[1], g[2], false);
    l.bwd.gemm += hw.gemm_time(g[0], g[1], g[2], true);
    l.weight += weight_grad_time(hw, g[0], g[1], g[2]);
  }
  if (sparse) {
    // The dispatch and combine copies of the R rows (forward: one each; backward: I's dispatch and
    // combine, W's two dispatches), as elementwise passes over R C elements.
    const double copy = hw.elementwise_time(Elementwise::Add, s.R * s.C, false);
    l.fwd.elementwise += 2 * copy;
    l.bwd.elementwise += 4 * copy;
    l.weight += 2 * copy;
    if (s.ep > 1) {
      // Rows between EP ranks: all-to-all, each rank's R rows out and back (an all-to-all of b bytes
      // per rank moves what an all-gather into b bytes moves: (ep - 1) / ep of them), twice forward
      // and four times backward (I's two, W's two dispatches again); all-gather: every EP rank's N
      // tokens gathered, the per-token sums reduce-scattered back. Exposed: nothing overlaps them.
      const int ep = static_cast<int>(s.ep);
      double out, back;
      if (s.dispatcher == MoeDispatcher::AllToAll) {
        out = back = hw.collective_time(Collective::AllGather, ep, s.R * s.C * s.a, ep_intra);
      } else {
        out = hw.collective_time(Collective::AllGather, ep, s.ep * s.N * s.C * s.a, ep_intra);
        back = hw.collective_time(Collective::ReduceScatter, ep, s.ep * s.N * s.C * s.a, ep_intra);
      }
      l.fwd.comm += out + back;
      l.bwd.comm += 3 * out + back;
      l.weight += 2 * out;
    }
  }
  // Under context parallelism a rank computes 1/cp of a sequence's causal (query, key) pairs: as
  // many as cp causal sequences of its T = seq_len / cp tokens.
  const int64_t pairs = s.B * (s.H / s.t) * s.cp;
  l.attn_fwd = l.fwd.attention = hw.attention_time(pairs, s.T, s.D, false);
  l.bwd.attention = hw.attention_time(pairs, s.T, s.D, true);
  if (s.rope) {  // the query and key heads rotated before the attention, the gradients back after
    const int64_t rotated = s.N * (s.H + s.KV) / s.t * s.D;
    l.fwd.attention += hw.elementwise_time(Elementwise::Rope, rotated, false);
    l.bwd.attention += hw.elementwise_time(Elementwise::Rope, rotated, true);
  }
  if (s.cp > 1) {
    // Keys and values of this rank's tokens (this TP rank's key/value heads); their gradients in
    // f32. All-gather: a gather forward, a gather and a reduce-scatter backward, all exposed.
    // Ring: cp - 1 block sends forward, cp - 1 blocks and cp gradient sums backward, hidden
    // behind the attention they overlap except what outlasts it.
    const int64_t kv = s.N * 2 * (s.KV / s.t) * s.D * s.a, dkv = kv / s.a * 4;
    if (cp_comm == CpComm::AllGather) {
      const double gather = hw.collective_time(Collective::AllGather, static_cast<int>(s.cp), kv, cp_intra);
      l.fwd.comm += gather;
      l.bwd.comm += gather + hw.collective_time(Collective::ReduceScatter, static_cast<int>(s.cp), dkv * s.cp, cp_intra);
    } else {
      const double hop = hw.collective_time(Collective::SendRecv, 2, kv, cp_intra);
      const double hop_grad = hw.collective_time(Collective::SendRecv, 2, dkv, cp_intra);
      l.fwd.comm += std::max(0.0, (s.cp - 1) * hop - l.fwd.attention * (s.cp - 1) / s.cp);
      l.bwd.comm += std::max(0.0, (s.cp - 1) * hop + s.cp * hop_grad - l.bwd.attention * (s.cp - 1) / s.cp);
    }
  }
  const Elementwise norm = s.rms ? Elementwise::RmsNorm : Elementwise::LayerNorm;
  // A dense GELU on CUDA runs in its GEMMs' epilogues (cuBLASLt's GELU_AUX forward, DGELU
  // backward), timed with them: one more pass over the activation each way (the pre-activation
  // written, then read), half a GELU forward's two.
  const bool fused_gelu = !s.swiglu && !sparse && hw.device == Device::CUDA;
  for (bool b : {false, true}) {
    ChunkTimes::Split& d = b ? l.bwd : l.fwd;
    d.elementwise += 2 * hw.elementwise_time(norm, s.Ns * s.C, b) + 2 * hw.elementwise_time(Elementwise::Add, s.Ns * s.C, b);
    if (fused_gelu)
      d.gemm += hw.elementwise_time(Elementwise::Gelu, act, false) / 2;
    else
      d.elementwise += hw.elementwise_time(s.swiglu ? Elementwise::SwiGlu : Elementwise::Gelu, act, b);
  }
  // Two regions (attention, MLP) per layer, in each direction.
  const double tp = 2 * tp_region(s, hw, intra);
  l.fwd.comm += tp;
  l.bwd.comm += tp;
  return l;
}

// The pieces every stage is made of: a layer (by its index within the chunk, for recomputation)
// and what the first and the last stage add.
struct StageParts {
  ChunkTimes layer[3];  // indexed by RecomputeMode (None, Selective, Full)
  ChunkTimes dense[3];  // a mixture of experts' dense layers (model layers [0, first_dense)), likewise
  int first_dense = 0;
  ChunkTimes first, last;
  const RecomputeConfig* recompute = nullptr;

  // Layer i of a chunk (recomputation applies by it), model layer `global` (dense or sparse by it).
  const ChunkTimes& layer_at(int i, int global) const {
    const RecomputeMode mode =
        recompute->mode != RecomputeMode::None && recompute->applies_to(i) ? recompute->mode : RecomputeMode::None;
    return (global < first_dense ? dense : layer)[static_cast<int>(mode)];
  }
  const ChunkTimes& layer_at(int i) const { return layer_at(i, i); }
  // Stage v of `stages` holding `n_layers` layers from model layer `first_layer`.
  ChunkTimes chunk(int v, int stages, int n_layers, int first_layer = 0) const {
    ChunkTimes c;
    auto add = [&c](const ChunkTimes& x) {
      c.forward += x.forward;
      c.backward += x.backward;
      c.weight += x.weight;
      c.f += x.f;
      c.b += x.b;
    };
    for (int i = 0; i < n_layers; ++i) add(layer_at(i, first_layer + i));
    if (v == 0) add(first);
    if (v == stages - 1) add(last);
    return c;
  }
};

StageParts stage_parts(const Config& cfg, const Hardware& hw) {
  const ParallelConfig& p = cfg.parallel;
  const LayerShape s = shape_of(cfg, hw);
  const GpuPlacement pl = place(p, hw.gpus_per_node);
  const bool moe = cfg.model.moe.enabled();
  const LayerTimes layer = layer_times(s, hw, pl.tp_intra, pl.cp_intra, p.cp_comm, moe, pl.ep_intra);
  const LayerTimes dense = moe ? layer_times(s, hw, pl.tp_intra, pl.cp_intra, p.cp_comm) : layer;
  StageParts parts;
  parts.recompute = &cfg.recompute;
  parts.first_dense = moe ? cfg.model.moe.first_dense : 0;
  for (RecomputeMode mode : {RecomputeMode::None, RecomputeMode::Selective, RecomputeMode::Full})
    for (bool sparse : {true, false}) {
      const LayerTimes& t = sparse ? layer : dense;
      ChunkTimes& c = (sparse ? parts.layer : parts.dense)[static_cast<int>(mode)];
      c.f = t.fwd;
      c.b = t.bwd;
      c.weight = t.weight;
      if (mode == RecomputeMode::Full) c.b += t.fwd;  // the layer's whole forward again, collectives included
      else if (mode == RecomputeMode::Selective) c.b.attention += t.attn_fwd;
    }
  const int64_t bytes = s.N * s.C * s.a;
  {  // embedding: the vocabulary-parallel lookup, summed (or scattered) over TP; its backward is
     // the table's gradient alone (W)
    ChunkTimes& c = parts.first;
    c.f.elementwise = hw.elementwise_time(Elementwise::Embedding, s.N * s.C, false);
    c.b.elementwise = hw.elementwise_time(Elementwise::Embedding, s.N * s.C, true);
    c.weight = c.b.elementwise;
    c.f.comm = s.t == 1 ? 0
               : s.sp   ? hw.collective_time(Collective::ReduceScatter, s.t, bytes, pl.tp_intra)
                        : hw.collective_time(Collective::AllReduce, s.t, bytes, pl.tp_intra);
    c.b.comm = s.sp ? hw.collective_time(Collective::AllGather, s.t, bytes, pl.tp_intra) : 0;
  }
  {  // the final norm, the head's GEMM, the vocabulary-parallel cross-entropy
    ChunkTimes& c = parts.last;
    const int64_t Vl = s.V / s.t;
    for (bool b : {false, true}) {
      ChunkTimes::Split& d = b ? c.b : c.f;
      d.elementwise = hw.elementwise_time(s.rms ? Elementwise::RmsNorm : Elementwise::LayerNorm, s.Ns * s.C, b) +
                      hw.elementwise_time(Elementwise::CrossEntropy, s.N * Vl, b);
      d.gemm = hw.gemm_time(s.N, Vl, s.C, b);
    }
    c.weight = weight_grad_time(hw, s.N, Vl, s.C);
    if (s.t > 1) {
      // The input enters the vocabulary-parallel GEMM (all-gathered under SP; its gradient
      // all-reduced, or reduce-scattered under SP); the per-token statistics are all-gathered.
      const double stats = hw.collective_time(Collective::AllGather, s.t, s.N * 3 * 4 * s.t, pl.tp_intra);
      const double in = s.sp ? hw.collective_time(Collective::AllGather, s.t, bytes, pl.tp_intra) : 0;
      c.f.comm = stats + in;
      c.b.comm = hw.collective_time(s.sp ? Collective::ReduceScatter : Collective::AllReduce, s.t, bytes, pl.tp_intra);
    }
  }
  for (ChunkTimes* c : {&parts.layer[0], &parts.layer[1], &parts.layer[2], &parts.dense[0], &parts.dense[1],
                        &parts.dense[2], &parts.first, &parts.last}) {
    c->forward = c->f.total();
    c->backward = c->b.total();
  }
  return parts;
}

}  // namespace

std::vector<ChunkTimes> stage_times(const Config& cfg, const Hardware& hw, const std::vector<int>& layers) {
  const StageParts parts = stage_parts(cfg, hw);
  const int stages = static_cast<int>(layers.size());
  std::vector<ChunkTimes> out;
  int first_layer = 0;
  for (int v = 0; v < stages; ++v) {
    out.push_back(parts.chunk(v, stages, layers[v], first_layer));
    first_layer += layers[v];
  }
  return out;
}

std::vector<ChunkTimes> stage_times(const Config& cfg, const Hardware& hw) {
  return stage_times(cfg, hw, stage_layers(cfg));
}

std::vector<int> balanced_layers_per_stage(const Config& cfg, const Hardware& hw) {
  const ParallelConfig& p = cfg.parallel;
  const int L = cfg.model.n_layers, S = p.pp * p.vp;
  TRIPOD_INPUT_CHECK(L >= S,
                     "model.n_layers = {} is fewer than the pp*vp = {}*{} = {} pipeline stages; every stage needs a layer",
                     L, p.pp, p.vp, S);
  const StageParts parts = stage_parts(cfg, hw);
  // A stage's cost is what its ends add plus the prefix sum of its layers' costs: cost(v, n) =
  // extra[v] + prefix[n], increasing in n. For a bound T each stage takes at most the largest n
  // with cost(v, n) <= T; the least T whose maxima add up to L (each >= 1) is among the costs
  // cost(v, n) themselves, found by bisection over them.
  std::vector<double> prefix(L + 1, 0);
  for (int i = 0; i < L; ++i) prefix[i + 1] = prefix[i] + parts.layer_at(i).forward + parts.layer_at(i).backward;
  std::vector<double> extra(S, 0);
  for (int v = 0; v < S; ++v) {
    const ChunkTimes none = parts.chunk(v, S, 0);
    extra[v] = none.forward + none.backward;
  }
  const int most = L - S + 1;  // the most layers one stage can have
  auto cost = [&](int v, int n) { return extra[v] + prefix[n]; };
  auto most_within = [&](int v, double bound) {  // the largest n in [0, most] with cost(v, n) <= bound
    const auto end = prefix.begin() + most + 1;
    auto above = [&](double b, double pre) { return b < extra[v] + pre; };  // cost(v, n) as `cost` sums it
    return static_cast<int>(std::upper_bound(prefix.begin(), end, bound, above) - prefix.begin()) - 1;
  };
  auto feasible = [&](double bound) {
    int64_t total = 0;
    for (int v = 0; v < S; ++v) {
      const int n = most_within(v, bound);
      if (n < 1) return false;
      total += n;
    }
    return total >= L;
  };
  std::vector<double> bounds;
  for (int v = 0; v < S; ++v)
    if (v == 0 || v == S - 1 || v == 1)  // the middle stages all cost the same
      for (int n = 1; n <= most; ++n) bounds.push_back(cost(v, n));
  std::sort(bounds.begin(), bounds.end());
  bounds.erase(std::unique(bounds.begin(), bounds.end()), bounds.end());
  // cost(v, most) for every v is always feasible (each stage may then take `most` >= 1 layers).
  size_t lo = 0, hi = bounds.size() - 1;
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    if (feasible(bounds[mid])) hi = mid;
    else lo = mid + 1;
  }
  std::vector<int> counts(S);
  int64_t total = 0;
  for (int v = 0; v < S; ++v) total += counts[v] = most_within(v, bounds[lo]);
  // Too many layers within the bound: take them off the costliest stages (the later one on a tie).
  while (total > L) {
    int worst = -1;
    for (int v = 0; v < S; ++v)
      if (counts[v] > 1 && (worst < 0 || cost(v, counts[v]) >= cost(worst, counts[worst]))) worst = v;
    --counts[worst];
    --total;
  }
  return counts;
}

void balance_stages(Config& cfg, const Hardware& hw) {
  ParallelConfig& p = cfg.parallel;
  if (!p.balance_layers) return;
  p.layers_per_stage = balanced_layers_per_stage(cfg, hw);
}

std::string resolve_layer_split(Config& cfg) {
  if (!cfg.parallel.balance_layers) return fmt::format("layers per virtual stage: {}", split_str(stage_layers(cfg)));
  const Hardware hw = balance_hardware(cfg);
  balance_stages(cfg, hw);
  std::vector<std::string> costs;
  for (const ChunkTimes& c : stage_times(cfg, hw)) costs.push_back(fmt::format("{:.3g}", 1e3 * (c.forward + c.backward)));
  return fmt::format("layers per virtual stage: {} (\"auto\", balanced on {}: predicted forward+backward per "
                     "micro-batch {} ms)",
                     split_str(cfg.parallel.layers_per_stage), hw.name, fmt::join(costs, " / "));
}

Hardware balance_hardware(const Config& cfg) {
  if (!cfg.parallel.hardware.empty()) return load_hardware(cfg.parallel.hardware);
  return default_hardware(cfg.train.device);
}

StepPrediction predict_step(const Config& cfg, const Hardware& hw) {
  const Schedule schedule = make_schedule(cfg);
  return predict_step(cfg, hw, schedule, plan_pipeline(schedule));
}

StepPrediction predict_step(const Config& cfg, const Hardware& hw, const Schedule& schedule, const PipePlan& plan) {
  const ParallelConfig& p = cfg.parallel;
  const LayerShape s = shape_of(cfg, hw);
  const GpuPlacement pl = place(p, hw.gpus_per_node);
  StepPrediction out;
  out.stages = stage_times(cfg, hw);

  // The schedule with these times; stage-to-stage messages carry one (sliced) activation.
  PipeCosts costs;
  StageCosts stages;
  for (const ChunkTimes& c : out.stages) {
    stages.forward.push_back(c.forward);
    stages.backward.push_back(c.backward);
    stages.weight.push_back(c.weight);  // what I and W take apart in the zero-bubble schedules
  }
  out.p2p_s = p.pp > 1 ? hw.collective_time(Collective::SendRecv, 2, s.Ns * s.C * s.a, pl.pp_intra) : 0;
  costs.comm = out.p2p_s;
  const Simulation sim = simulate(schedule, plan, costs, stages);
  out.pipeline_s = sim.makespan;
  out.bubble = sim.bubble;

  // Memory and gradient synchronisation of the first, second and last pipeline rank (tp, dp and cp
  // coordinate 0): their layouts say what each reduces and whether a tied table's copies meet.
  // The pipeline ranks between the second and the last reduce as the second does.
  const RankGrid grid = p.grid();
  std::vector<int> pp_ranks = {0};
  if (p.pp > 1) pp_ranks.push_back(p.pp - 1);
  if (p.pp > 2) pp_ranks.push_back(1);
  struct Sync {
    double reduce = 0, last_bucket = 0, tied = 0;  // all buckets, the rank's first (finished last), the tied table's
    bool ends = false;                             // the tied table's copies meet here (first and last rank)
  };
  std::vector<Sync> sync(p.pp);
  double gather = 0;
  int64_t owned = 0, in_flight = 0;  // the bytes of a bucket being reduced (one more fills meanwhile)
  for (int q : pp_ranks) {
    const RankLayout l = make_rank_layout(cfg, grid.rank({.tp = 0, .dp = 0, .pp = q}), schedule, plan);
    RankMemory m = plan_rank_memory(cfg, l);
    if (m.total() > out.memory.total()) {
      out.memory = m;
      owned = l.grad_sync.owned_elements();
    }
    Sync& y = sync[q];
    for (const ReduceGroup& g : l.grad_sync.groups) {
      if (g.size == 1) continue;
      in_flight = std::max(in_flight, g.bucket_bytes);
      for (const GradBucket& b : g.buckets) {
        const double t = hw.collective_time(g.sharded ? Collective::ReduceScatter : Collective::AllReduce, g.size,
                                            b.span.size() * 4, pl.dp_intra);
        y.reduce += t;
        if (&b == &g.buckets.front()) y.last_bucket = t;
      }
      if (g.sharded) gather = std::max(gather, hw.collective_time(Collective::AllGather, g.size, m.params, pl.dp_intra));
    }
    // The tied table's copies on the pipeline's first and last rank sum their gradients first.
    if (l.grad_sync.tied == GradSync::Tied::PipelineEnds) {
      y.tied = hw.collective_time(Collective::AllReduce, 2, l.grad_sync.tied_table.size() * 4, pl.pp_intra);
      y.ends = true;
    }
  }
  for (int q = 1; q + 1 < p.pp; ++q) sync[q] = sync[1];
  // Each pipeline rank reduces its f32 gradients in its buckets, each started as the final
  // backward of each chunk makes it final (the last backward of the first chunk to finish); the
  // rank's first bucket (its first chunk's, finished last) ends it.
  std::vector<double> end(p.pp), done(p.pp);
  double step_end = 0;
  for (int q = 0; q < p.pp; ++q) {
    const RankSimulation& rs = sim.ranks[q];
    end[q] = rs.timeline.back().end;
    double window_start = end[q];
    std::vector<char> seen(p.vp, 0);
    for (auto it = rs.timeline.rbegin(); it != rs.timeline.rend(); ++it)
      if (!it->action.forward() && !seen[it->action.chunk]) {
        seen[it->action.chunk] = 1;
        window_start = std::min(window_start, it->start);
      }
    const Sync& y = sync[q];
    done[q] = (hw.overlap_dp ? std::max(end[q] + y.last_bucket, window_start + y.reduce) : end[q] + y.reduce) + y.tied;
    step_end = std::max(step_end, done[q]);
    out.dp_exposed_s = std::max(out.dp_exposed_s, done[q] - end[q]);
  }

  // Optimizer: zeroing and the grad-norm pass over the gradients, one world all-reduce, AdamW
  // over the owned elements, and the distributed optimizer's all-gather of the new values.
  const int64_t flat = out.memory.grads / 4;
  out.optimizer_s = 2 * hw.elementwise_time(Elementwise::Add, flat, false) / 3 +
                    hw.collective_time(Collective::AllReduce, grid.world_size(), 16, grid.world_size() <= hw.gpus_per_node) +
                    hw.elementwise_time(Elementwise::AdamW, owned, false);
  out.optimizer_s += gather;
  out.step_time_s = step_end + out.optimizer_s;

  // The step of each pipeline rank by where its time goes: its chunks' work for every
  // micro-batch, the DP and embedding reductions past its backward, the optimizer, and the rest
  // (waiting between actions, and for the slowest rank at the end of the step) idle. The tied
  // table's all-reduce ends on both pipeline ends together: the end that finished first waits in
  // it (as a run measures it: inside the collective).
  double ends_done = 0;
  for (int q = 0; q < p.pp; ++q)
    if (sync[q].ends) ends_done = std::max(ends_done, done[q]);
  for (int q = 0; q < p.pp; ++q)
    if (sync[q].ends) done[q] = ends_done;
  const int M = schedule.microbatches;
  double tp_comm = 0;
  for (int q = 0; q < p.pp; ++q) {
    StepBreakdown b;
    double busy = 0;
    for (int c = 0; c < p.vp; ++c) {
      const ChunkTimes& t = out.stages[schedule.stage(q, c)];
      b.gemm += M * (t.f.gemm + t.b.gemm);
      b.attention += M * (t.f.attention + t.b.attention);
      b.elementwise += M * (t.f.elementwise + t.b.elementwise);
      b.communication += M * (t.f.comm + t.b.comm);
      busy += M * (t.forward + t.backward);
    }
    tp_comm = std::max(tp_comm, b.communication);
    b.communication += done[q] - end[q];
    b.pipeline_idle = std::max(0.0, step_end - busy - (done[q] - end[q]));
    b.optimizer = out.optimizer_s;
    b.step = out.step_time_s;
    out.ranks.push_back(b);
    for (int i = 0; i < StepBreakdown::kParts; ++i) out.breakdown.part(i) += b.part(i) / p.pp;
  }
  out.breakdown.step = out.step_time_s;
  // Exposed communication: the TP collectives inside the busiest rank's actions, the DP and
  // embedding reductions past its backward, and the optimizer's all-gather.
  out.exposed_comm = (tp_comm + out.dp_exposed_s + gather) / out.step_time_s;

  const double tokens = static_cast<double>(cfg.train.global_batch_size) * cfg.model.seq_len;
  out.tokens_per_s = tokens / out.step_time_s;
  const double flops = cfg.model.flops_per_token(p.tp) * out.tokens_per_s / grid.world_size();
  out.model_tflops_per_gpu = flops / 1e12;
  out.mfu = flops / hw.peak_flops;

  // Overheads beyond the plan: one layer's activation gradients during its backward (qkv,
  // attention output, both MLP halves, three residual-width tensors; the head's logits are
  // differentiated in place), the DP buckets in flight (one reducing, one filling) and the
  // hardware's reserved memory.
  const int64_t Cl = s.C / s.t, Fl = s.F / s.t;
  out.workspace_bytes = (s.N * (3 * Cl + Cl + (s.swiglu ? 3 : 2) * Fl) + 3 * s.Ns * s.C) * s.a;
  out.comm_bytes = 2 * in_flight;
  out.reserved_bytes = static_cast<int64_t>(hw.reserved_memory);
  return out;
}

}  // namespace tripod
