// The KV-cached inference forward and token sampling.
#include "model/inference.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

namespace tripod {

namespace {

Param* need(ParamRegistry& reg, const std::string& name) {
  Param* p = reg.find(name);
  TRIPOD_CHECK(p, "inference: parameter {} is not on this rank (the model must be built with pp = 1)", name);
  return p;
}

}  // namespace

InferenceModel::InferenceModel(Ops& ops, const ParallelContext& par, const ModelConfig& cfg, ParamRegistry& reg,
                               int64_t max_tokens, int64_t rows)
    : ops_(ops),
      par_(par),
      cfg_(cfg),
      shard_(VocabShard::of(cfg, par.grid.tp(), par.coords.tp)),
      H_local_(cfg.n_heads / par.grid.tp()),
      KV_local_(cfg.kv_heads() / par.grid.tp()),
      D_(cfg.head_dim()),
      F_local_(cfg.ffn() / par.grid.tp()),
      max_tokens_(max_tokens),
      rows_(rows) {
  TRIPOD_CHECK(par.grid.pp() == 1, "inference runs with pp = 1 (got grid {})", par.grid.str());
  TRIPOD_CHECK(max_tokens >= 1 && max_tokens <= cfg.positions() && rows >= 1,
               "inference: {} rows of {} tokens for a model of {} positions", rows, max_tokens, cfg.positions());
  wte_ = need(reg, "wte");
  wpe_ = cfg.rope() ? nullptr : need(reg, "wpe");
  head_ = cfg.tie_embeddings ? wte_ : need(reg, "lm_head.weight");
  ln_f_ = Norm::find(reg, "ln_f", cfg);
  for (int l = 0; l < cfg.n_layers; ++l) {
    const std::string h = fmt::format("h.{}.", l);
    Layer& L = layers_.emplace_back();
    L.ln1 = Norm::find(reg, h + "ln_1", cfg);
    L.ln2 = Norm::find(reg, h + "ln_2", cfg);
    L.attn = AttentionParams::find(reg, cfg, h + "attn");
    if (cfg.moe.sparse(l))
      L.moe = MoeParams::find(reg, cfg, h + "mlp");
    else
      L.mlp = MlpParams::find(reg, cfg, h + "mlp", cfg.bias);
    // (rows, Hkv/tp, max_tokens, D): this rank's key/value heads.
    L.k_cache = ops.empty({rows, KV_local_, max_tokens, D_}, ops.compute_dtype(), MemCategory::Activations);
    L.v_cache = ops.empty({rows, KV_local_, max_tokens, D_}, ops.compute_dtype(), MemCategory::Activations);
  }
}

void InferenceModel::add_row_parallel(const Tensor& in, const LinearParams& p, Tensor& x) {
  Tensor partial = ops_.empty(x.shape(), ops_.compute_dtype(), MemCategory::Workspace);
  // The replicated bias joins the partial sums once, on TP rank 0 (as in training).
  ops_.linear_forward(in, p.weight(), par_.coords.tp == 0 ? p.bias() : Tensor{}, partial);
  if (par_.grid.tp() > 1) par_.tp->all_reduce(partial);
  ops_.add(x, partial, x);
}

namespace {

Tensor device_i32(Ops& ops, std::span<const int32_t> v) {
  Tensor t = ops.empty({static_cast<int64_t>(v.size())}, DType::I32, MemCategory::Workspace);
  ops.copy(Tensor::wrap(const_cast<int32_t*>(v.data()), {static_cast<int64_t>(v.size())}, DType::I32), t);
  return t;
}

}  // namespace

void InferenceModel::rewind(int64_t pos) {
  TRIPOD_CHECK(pos >= 0 && pos <= pos_, "inference: rewind to {} from position {}", pos, pos_);
  pos_ = pos;
}

void InferenceModel::share_prefix(int64_t rows) {
  TRIPOD_CHECK(rows >= 1 && rows <= rows_, "inference: {} rows of {} cached", rows, rows_);
  if (pos_ == 0) return;
  for (Layer& L : layers_)
    for (Tensor* cache : {&L.k_cache, &L.v_cache}) {
      // Row r's key/value head j holds its positions [0, pos_) as one block of pos_ x D values.
      Tensor blocks = cache->view({rows_ * KV_local_ * max_tokens_, D_});
      for (int64_t r = 1; r < rows; ++r)
        for (int64_t j = 0; j < KV_local_; ++j) {
          const int64_t from = j * max_tokens_, to = (r * KV_local_ + j) * max_tokens_;
          Tensor dst = blocks.slice(to, to + pos_);
          ops_.copy(blocks.slice(from, from + pos_), dst);
        }
    }
}

std::vector<float> InferenceModel::forward(std::span<const int32_t> tokens, bool all_logits) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  TRIPOD_CHECK(n >= 1 && pos_ + n <= max_tokens_, "inference: tokens [{}, {}) beyond the {} cached positions", pos_,
               pos_ + n, max_tokens_);
  std::vector<int32_t> pos(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) pos[t] = static_cast<int32_t>(pos_ + t);
  return run(device_i32(ops_, tokens), device_i32(ops_, pos), 1, n, Tensor{}, Tensor{}, /*last_only=*/!all_logits,
             Tensor{});
}

std::vector<float> InferenceModel::forward_rows(std::span<const int32_t> tokens, std::span<const int64_t> lengths,
                                                std::span<const int32_t> targets) {
  const int64_t rows = static_cast<int64_t>(lengths.size());
  TRIPOD_CHECK(rows >= 1 && rows <= rows_, "inference: {} rows of {} cached", rows, rows_);
  int64_t n = 0, N = 0;
  for (int64_t len : lengths) {
    TRIPOD_CHECK(len >= 1, "inference: an empty row");
    n = std::max(n, len);
    N += len;
  }
  TRIPOD_CHECK(N == static_cast<int64_t>(tokens.size()) && N == static_cast<int64_t>(targets.size()) &&
                   pos_ + n <= max_tokens_,
               "inference: {} tokens for rows of {} (sum), positions [{}, {}) of {}", tokens.size(), N, pos_, pos_ + n,
               max_tokens_);
  // Token i of row r sits at position pos_ + i, and at row r * n + i of the padded layout.
  std::vector<int32_t> pos, to_real, to_padded(static_cast<size_t>(rows * n), -1);
  for (int64_t r = 0, k = 0; r < rows; ++r)
    for (int64_t i = 0; i < lengths[r]; ++i, ++k) {
      pos.push_back(static_cast<int32_t>(pos_ + i));
      to_real.push_back(static_cast<int32_t>(r * n + i));
      to_padded[r * n + i] = static_cast<int32_t>(k);
    }
  const bool padded = N < rows * n;
  return run(device_i32(ops_, tokens), device_i32(ops_, pos), rows, n,
             padded ? device_i32(ops_, to_padded) : Tensor{}, padded ? device_i32(ops_, to_real) : Tensor{},
             /*last_only=*/false, device_i32(ops_, targets));
}

std::vector<float> InferenceModel::run(const Tensor& tok, const Tensor& positions, int64_t rows, int64_t n,
                                       const Tensor& to_padded, const Tensor& to_real, bool last_only,
                                       const Tensor& targets) {
  const int64_t N = tok.numel(), C = cfg_.d_model, heads = H_local_ + 2 * KV_local_;
  TRIPOD_CHECK(!last_only || rows == 1, "inference: the last token's logits of {} rows", rows);
  const DType dt = ops_.compute_dtype();
  // x (N, C) = wte[tok] (+ wpe[position]: positions join on TP rank 0; the shards' sum is the row).
  Tensor x = ops_.empty({N, C}, dt, MemCategory::Activations);
  if (par_.coords.tp == 0 && wpe_)
    ops_.embedding_forward_positions(tok, wte_->value, shard_.start, wpe_->value, positions, x);
  else
    ops_.embedding_forward(tok, wte_->value, shard_.start, Tensor{}, N, x);
  if (par_.grid.tp() > 1) par_.tp->all_reduce(x);

  Tensor h = ops_.empty({N, C}, dt, MemCategory::Workspace);
  NormActs stats;
  Tensor qkv = ops_.empty({N, heads * D_}, dt, MemCategory::Workspace);  // (N, heads, D)
  Tensor att = ops_.empty({N, H_local_ * D_}, dt, MemCategory::Workspace);  // (N, H/tp, D)
  Tensor fc = ops_.empty({N, (cfg_.swiglu() ? 2 : 1) * F_local_}, dt, MemCategory::Workspace);
  Tensor act = ops_.empty({N, F_local_}, dt, MemCategory::Workspace);
  // Attention runs on rows x n, padded rows' zeros at their ends where the rows differ in length.
  const bool padded = to_padded.defined();
  Tensor qkv_rows = padded ? ops_.empty({rows * n, heads * D_}, dt, MemCategory::Workspace) : qkv;
  Tensor att_rows = padded ? ops_.empty({rows * n, H_local_ * D_}, dt, MemCategory::Workspace) : att;
  for (Layer& L : layers_) {
    L.ln1.forward(ops_, x, h, stats, MemCategory::Workspace);
    ops_.linear_forward(h, L.attn.qkv.weight(), L.attn.qkv.bias(), qkv);
    Tensor per_head = qkv.view({N, heads, D_});
    if (cfg_.qk_norm) {
      Tensor saved = ops_.empty({N, H_local_ + KV_local_, D_}, dt, MemCategory::Workspace);
      Tensor rstd = ops_.empty({N, H_local_ + KV_local_}, DType::F32, MemCategory::Workspace);
      ops_.qk_norm_forward(per_head, H_local_, KV_local_, L.attn.qk_norm_weight(), static_cast<float>(cfg_.norm_eps),
                           saved, rstd);
    }
    if (cfg_.rope()) ops_.rope_positions(per_head, H_local_ + KV_local_, positions, cfg_.rope_theta, /*inverse=*/false);
    if (padded) ops_.gather_rows(qkv, to_padded, qkv_rows);
    Tensor att4 = att_rows.view({rows, n, H_local_, D_});
    Tensor k = L.k_cache.slice(0, rows), v = L.v_cache.slice(0, rows);
    ops_.attention_decode(qkv_rows.view({rows, n, heads, D_}), k, v, pos_, att4);
    if (padded) ops_.gather_rows(att_rows, to_real, att);
    add_row_parallel(att, L.attn.proj, x);
    L.ln2.forward(ops_, x, h, stats, MemCategory::Workspace);
    if (L.moe) {
      Tensor partial = ops_.empty({N, C}, dt, MemCategory::Workspace);
      MoeLayer::infer(ops_, par_, cfg_, *L.moe, h, partial);
      if (par_.grid.tp() > 1) par_.tp->all_reduce(partial);
      ops_.add(x, partial, x);
    } else {
      Mlp::activate(ops_, cfg_.swiglu(), *L.mlp, h, fc, act);
      add_row_parallel(act, L.mlp->proj, x);
    }
  }
  pos_ += n;

  // The head on the rows asked for: ln_f, then logits against this rank's vocabulary rows.
  Tensor xs = last_only ? x.slice(N - 1, N) : x;
  const int64_t m = xs.size(0);
  Tensor hf = h.slice(0, m);
  ln_f_.forward(ops_, xs, hf, stats, MemCategory::Workspace);
  const int tp = par_.grid.tp();
  const int64_t Vl = shard_.rows, V = cfg_.vocab_size;
  Tensor logits = ops_.empty({m, Vl}, dt, MemCategory::Workspace);
  ops_.linear_forward(hf, head_->value, Tensor{}, logits);
  if (targets.defined()) {
    // Each token's loss as the training head computes it: the shards' (max, sum-exp, target
    // logit) combined, so the full logits never exist on one rank.
    Tensor stats = ops_.empty({m, 3}, DType::F32, MemCategory::Workspace);
    ops_.xent_stats(logits, targets, shard_.start, shard_.valid, stats);
    Tensor parts = stats.view({1, m, 3});
    if (tp > 1) {
      parts = ops_.empty({tp, m, 3}, DType::F32, MemCategory::Workspace);
      par_.tp->all_gather(stats, parts);
    }
    Tensor lse = ops_.empty({m}, DType::F32, MemCategory::Workspace);
    Tensor losses = ops_.empty({m}, DType::F32, MemCategory::Workspace);
    ops_.xent_combine(parts, lse, losses);
    std::vector<float> out(static_cast<size_t>(m));
    Tensor out_t = Tensor::wrap(out.data(), {m}, DType::F32);
    ops_.copy(losses, out_t);
    return out;
  }
  Tensor all = logits;
  if (tp > 1) {
    all = ops_.empty({tp, m, Vl}, dt, MemCategory::Workspace);
    par_.tp->all_gather(logits, all);
  }
  std::vector<float> host(static_cast<size_t>(tp * m * Vl));
  Tensor host_t = Tensor::wrap(host.data(), {tp * m * Vl}, DType::F32);
  ops_.copy(all.view({tp * m * Vl}), host_t);
  // Block r of the gathered logits holds columns [r*Vl, (r+1)*Vl) of every row; the padding
  // columns (>= vocab_size) are dropped.
  std::vector<float> out(static_cast<size_t>(m * V));
  for (int r = 0; r < tp; ++r)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t c = 0; c < Vl && r * Vl + c < V; ++c) out[i * V + r * Vl + c] = host[(r * m + i) * Vl + c];
  return out;
}

int32_t sample_token(std::span<const float> logits, const SamplingOptions& o, std::mt19937_64& rng) {
  const int64_t V = static_cast<int64_t>(logits.size());
  TRIPOD_CHECK(V >= 1, "sampling from no logits");
  if (o.temperature == 0) return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  // Candidates by decreasing logit (ties: lower id first), cut to top_k.
  std::vector<int32_t> ids(V);
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  if (o.top_k > 0 && o.top_k < V) ids.resize(o.top_k);
  std::vector<double> p(ids.size());
  const double top = logits[ids[0]];
  double z = 0;
  for (size_t i = 0; i < ids.size(); ++i) z += (p[i] = std::exp((logits[ids[i]] - top) / o.temperature));
  // Nucleus: the shortest prefix whose probability reaches top_p.
  size_t keep = ids.size();
  if (o.top_p < 1) {
    double cum = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      cum += p[i] / z;
      if (cum >= o.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double mass = 0;
  for (size_t i = 0; i < keep; ++i) mass += p[i];
  // u in [0, 1) from the top 53 bits: the same on every platform (std distributions are not).
  const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53 * mass;
  double cum = 0;
  for (size_t i = 0; i < keep; ++i) {
    cum += p[i];
    if (u < cum) return ids[i];
  }
  return ids[keep - 1];
}

}  // namespace tripod
