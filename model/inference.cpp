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
                               int64_t max_tokens)
    : ops_(ops),
      par_(par),
      cfg_(cfg),
      shard_(VocabShard::of(cfg, par.grid.tp(), par.coords.tp)),
      H_local_(cfg.n_heads / par.grid.tp()),
      KV_local_(cfg.kv_heads() / par.grid.tp()),
      D_(cfg.head_dim()),
      F_local_(cfg.ffn() / par.grid.tp()),
      max_tokens_(max_tokens) {
  TRIPOD_CHECK(par.grid.pp() == 1, "inference runs with pp = 1 (got grid {})", par.grid.str());
  TRIPOD_CHECK(max_tokens >= 1 && max_tokens <= cfg.positions(), "inference: {} tokens for a model of {} positions",
               max_tokens, cfg.positions());
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
    // (B = 1, Hkv/tp, max_tokens, D): this rank's key/value heads.
    L.k_cache = ops.empty({1, KV_local_, max_tokens, D_}, ops.compute_dtype(), MemCategory::Activations);
    L.v_cache = ops.empty({1, KV_local_, max_tokens, D_}, ops.compute_dtype(), MemCategory::Activations);
  }
}

void InferenceModel::add_row_parallel(const Tensor& in, const LinearParams& p, Tensor& x) {
  Tensor partial = ops_.empty(x.shape(), ops_.compute_dtype(), MemCategory::Workspace);
  // The replicated bias joins the partial sums once, on TP rank 0 (as in training).
  ops_.linear_forward(in, p.weight(), par_.coords.tp == 0 ? p.bias() : Tensor{}, partial);
  if (par_.grid.tp() > 1) par_.tp->all_reduce(partial);
  ops_.add(x, partial, x);
}

std::vector<float> InferenceModel::forward(std::span<const int32_t> tokens, bool all_logits) {
  const int64_t n = static_cast<int64_t>(tokens.size()), C = cfg_.d_model, heads = H_local_ + 2 * KV_local_;
  TRIPOD_CHECK(n >= 1 && pos_ + n <= max_tokens_, "inference: tokens [{}, {}) beyond the {} cached positions", pos_,
               pos_ + n, max_tokens_);
  const DType dt = ops_.compute_dtype();
  Tensor tok = ops_.empty({n}, DType::I32, MemCategory::Activations);
  ops_.copy(Tensor::wrap(const_cast<int32_t*>(tokens.data()), {n}, DType::I32), tok);

  // x (n, C) = wte[tok] (+ wpe[pos_ + i]: with T = n, the lookup's row i takes position row i
  // of the table slice starting at pos_). Positions join on TP rank 0; the shards' sum is the row.
  Tensor x = ops_.empty({n, C}, dt, MemCategory::Activations);
  ops_.embedding_forward(tok, wte_->value, shard_.start,
                         par_.coords.tp == 0 && wpe_ ? wpe_->value.slice(pos_, pos_ + n) : Tensor{}, n, x);
  if (par_.grid.tp() > 1) par_.tp->all_reduce(x);

  Tensor h = ops_.empty({n, C}, dt, MemCategory::Workspace);
  NormActs stats;
  Tensor qkv = ops_.empty({n, heads * D_}, dt, MemCategory::Workspace);  // (1, n, heads, D)
  Tensor att = ops_.empty({n, H_local_ * D_}, dt, MemCategory::Workspace);  // (1, n, H/tp, D)
  Tensor fc = ops_.empty({n, (cfg_.swiglu() ? 2 : 1) * F_local_}, dt, MemCategory::Workspace);
  Tensor act = ops_.empty({n, F_local_}, dt, MemCategory::Workspace);
  for (Layer& L : layers_) {
    L.ln1.forward(ops_, x, h, stats, MemCategory::Workspace);
    ops_.linear_forward(h, L.attn.qkv.weight(), L.attn.qkv.bias(), qkv);
    if (cfg_.qk_norm) {
      Tensor rows = qkv.view({n, heads, D_});
      Tensor saved = ops_.empty({n, H_local_ + KV_local_, D_}, dt, MemCategory::Workspace);
      Tensor rstd = ops_.empty({n, H_local_ + KV_local_}, DType::F32, MemCategory::Workspace);
      ops_.qk_norm_forward(rows, H_local_, KV_local_, L.attn.qk_norm_weight(), static_cast<float>(cfg_.norm_eps), saved,
                           rstd);
    }
    if (cfg_.rope()) {  // the new tokens sit at positions pos_, pos_ + 1, ...
      Tensor rows = qkv.view({n, heads, D_});
      ops_.rope(rows, H_local_ + KV_local_, n, pos_, cfg_.rope_theta, /*inverse=*/false);
    }
    Tensor att4 = att.view({1, n, H_local_, D_});
    ops_.attention_decode(qkv.view({1, n, heads, D_}), L.k_cache, L.v_cache, pos_, att4);
    add_row_parallel(att, L.attn.proj, x);
    L.ln2.forward(ops_, x, h, stats, MemCategory::Workspace);
    if (L.moe) {
      Tensor partial = ops_.empty({n, C}, dt, MemCategory::Workspace);
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
  const int64_t first = all_logits ? 0 : n - 1, m = n - first;
  Tensor xs = x.slice(first, n);
  Tensor hf = h.slice(0, m);
  ln_f_.forward(ops_, xs, hf, stats, MemCategory::Workspace);
  const int tp = par_.grid.tp();
  const int64_t Vl = shard_.rows, V = cfg_.vocab_size;
  Tensor logits = ops_.empty({m, Vl}, dt, MemCategory::Workspace);
  ops_.linear_forward(hf, head_->value, Tensor{}, logits);
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
