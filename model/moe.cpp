// The mixture-of-experts layer: router, local dispatch, grouped experts, shared experts, the
// auxiliary losses' gradients and the selection bias's update.
#include "model/moe.h"

#include <fmt/format.h>

#include <cmath>

namespace tripod {

namespace {

std::vector<const char*> fc_parts(const ModelConfig& cfg) {
  return cfg.swiglu() ? std::vector<const char*>{"gate", "up"} : std::vector<const char*>{"fc"};
}

// The routed experts over the kept rows of `r`: fc and act (rows() of them used) and their
// combined, weighted output `out` (N, C), overwritten.
void run_experts(Ops& ops, TokenDispatcher& d, const MoeParams& p, bool swiglu, const Tensor& h_full,
                 const MoeRouting& r, Tensor& fc, Tensor& act, Tensor& out) {
  const int64_t R = r.rows(), C = h_full.size(1);
  const DType dt = ops.compute_dtype();
  Tensor yp;
  if (R > 0) {
    Tensor xp = ops.empty({R, C}, dt, MemCategory::Workspace);
    d.dispatch(h_full, r, /*weighted=*/false, xp);
    Tensor fc_rows = fc.slice(0, R), act_rows = act.slice(0, R);
    ops.grouped_linear_forward(xp, p.fc_weights(), r.offsets, fc_rows);
    xp = Tensor{};
    if (swiglu)
      ops.swiglu_forward(fc_rows, act_rows);
    else
      ops.gelu_forward(fc_rows, act_rows);
    yp = ops.empty({R, C}, dt, MemCategory::Workspace);
    ops.grouped_linear_forward(act_rows, p.proj_weights(), r.offsets, yp);
  } else {
    yp = ops.empty({1, C}, dt, MemCategory::Workspace);  // no rows: every pair dropped
  }
  d.combine(yp, r, /*weighted=*/true, out);
}

// Allocates the routing tensors of N tokens (N k pairs, `rows` rows) in `category`.
void allocate_routing(Ops& ops, int64_t N, int64_t E, int64_t k, int64_t rows, MemCategory category, MoeRouting& r) {
  r.logits = ops.empty({N, E}, DType::F32, category);
  r.idx = ops.empty({N, k}, DType::I32, category);
  r.weights = ops.empty({N, k}, DType::F32, category);
  r.row_of = ops.empty({N * k}, DType::I32, category);
  r.slot_of = ops.empty({std::max<int64_t>(rows, 1)}, DType::I32, category);
}

}  // namespace

// ---- parameters ----------------------------------------------------------------------------------

MoeParams MoeParams::find(ParamRegistry& reg, const ModelConfig& cfg, const std::string& prefix) {
  auto need = [&](const std::string& name) {
    Param* p = reg.find(prefix + "." + name);
    TRIPOD_CHECK(p, "parameter {}.{} is not on this rank", prefix, name);
    return p;
  };
  MoeParams m;
  m.router = need("router.weight");
  if (cfg.moe.selection_bias()) m.bias = need("expert_bias");
  for (int e = 0; e < cfg.moe.experts; ++e) {
    LinearParams fc, proj;
    fc.reg = proj.reg = &reg;
    for (const char* part : fc_parts(cfg)) fc.w.push_back(need(fmt::format("experts.{}.{}.weight", e, part)));
    proj.w.push_back(need(fmt::format("experts.{}.proj.weight", e)));
    m.fc.push_back(std::move(fc));
    m.proj.push_back(std::move(proj));
  }
  if (cfg.moe.shared_experts > 0) m.shared = MlpParams::find(reg, cfg, prefix + ".shared", /*bias=*/false);
  return m;
}

std::vector<Tensor> MoeParams::fc_weights() const {
  std::vector<Tensor> out;
  for (const LinearParams& l : fc) out.push_back(l.weight());
  return out;
}

std::vector<Tensor> MoeParams::proj_weights() const {
  std::vector<Tensor> out;
  for (const LinearParams& l : proj) out.push_back(l.weight());
  return out;
}

// ---- the local dispatcher --------------------------------------------------------------------------

void LocalDispatcher::plan(MoeRouting& r, int64_t experts, int64_t capacity) {
  Tensor routed = ops_.empty({experts}, DType::I32, MemCategory::Workspace);
  ops_.moe_dispatch(r.idx, experts, capacity, routed, r.row_of, r.slot_of);
  std::vector<int32_t> host(experts);
  Tensor h = Tensor::wrap(host.data(), {experts}, DType::I32);
  ops_.copy(routed, h);  // the grouped GEMMs' sizes are needed on the host
  r.routed.assign(host.begin(), host.end());
  r.offsets.assign(experts + 1, 0);
  for (int64_t e = 0; e < experts; ++e)
    r.offsets[e + 1] = r.offsets[e] + (capacity < 0 ? host[e] : std::min<int64_t>(host[e], capacity));
}

void LocalDispatcher::dispatch(const Tensor& x, const MoeRouting& r, bool weighted, Tensor& xp) {
  ops_.moe_permute(x, r.slot_of, r.weights.size(1), weighted ? r.weights : Tensor{}, xp);
}

void LocalDispatcher::combine(const Tensor& yp, const MoeRouting& r, bool weighted, Tensor& y) {
  ops_.moe_unpermute(yp, r.row_of, weighted ? r.weights : Tensor{}, y);
}

// ---- the layer ---------------------------------------------------------------------------------------

std::unique_ptr<FeedForward> make_feed_forward(Ops& ops, const ParallelContext& par, const ModelConfig& cfg,
                                               ParamRegistry& reg, int layer, int chunk) {
  if (cfg.moe.sparse(layer)) return std::make_unique<MoeLayer>(ops, par, cfg, reg, layer, chunk);
  return std::make_unique<DenseFfn>(ops, par, cfg, reg, fmt::format("h.{}.mlp", layer), chunk);
}

MoeLayer::MoeLayer(Ops& ops, const ParallelContext& par, const ModelConfig& cfg, ParamRegistry& reg, int layer,
                   int chunk)
    : ops_(ops),
      par_(par),
      moe_(cfg.moe),
      swiglu_(cfg.swiglu()),
      layer_(layer),
      C_(cfg.d_model),
      F_local_(cfg.expert_ffn() / par.grid.tp()),
      dispatcher_(ops) {
  const std::string prefix = fmt::format("h.{}.mlp", layer);
  const int r = par.coords.tp;
  const int64_t C = C_, E = moe_.experts, F = cfg.expert_ffn(), Fl = F_local_;
  const float std = 0.02f, proj_std = 0.02f / std::sqrt(2.0f * cfg.n_layers);
  reg.add({.name = prefix + ".router.weight", .global_shape = {E, C}, .decay = true, .init = Init::Normal,
           .stddev = std, .chunk = chunk});
  if (moe_.selection_bias())
    reg.add({.name = prefix + ".expert_bias", .global_shape = {E}, .init = Init::Zeros, .chunk = chunk,
             .buffer = true});
  // Expert by expert, each like the dense MLP's TP split: gate and up (or fc) column-parallel and
  // packed into one GEMM weight, proj row-parallel.
  const std::vector<const char*> parts = fc_parts(cfg);
  for (int e = 0; e < E; ++e) {
    for (size_t i = 0; i < parts.size(); ++i)
      reg.add({.name = fmt::format("{}.experts.{}.{}.weight", prefix, e, parts[i]), .global_shape = {F, C},
               .shard_dim = 0, .shard_offset = r * Fl, .shard_size = Fl, .decay = true, .init = Init::Normal,
               .stddev = std, .chunk = chunk, .packed = i > 0, .expert = e});
    reg.add({.name = fmt::format("{}.experts.{}.proj.weight", prefix, e), .global_shape = {C, F}, .shard_dim = 1,
             .shard_offset = r * Fl, .shard_size = Fl, .decay = true, .init = Init::Normal, .stddev = proj_std,
             .chunk = chunk, .expert = e});
  }
  if (moe_.shared_experts > 0)
    shared_.emplace(ops, par, cfg, reg, prefix + ".shared", chunk, int64_t{moe_.shared_experts} * F, /*bias=*/false);
  p_ = MoeParams::find(reg, cfg, prefix);
  reset_stats();
}

void MoeLayer::reset_stats() {
  stats_ = MoeStepStats{};
  stats_.routed.assign(moe_.experts, 0.0);
}

void MoeLayer::route(const Tensor& h_full, const MicroShape& ms, MoeRouting& r) {
  const int64_t N = h_full.size(0), E = moe_.experts, k = moe_.top_k;
  allocate_routing(ops_, N, E, k, moe_.routed_rows(N), MemCategory::Activations, r);
  if (ops_.compute_dtype() == DType::F32) {
    ops_.linear_forward(h_full, p_.router->value, Tensor{}, r.logits);
  } else {
    Tensor logits = ops_.empty({N, E}, ops_.compute_dtype(), MemCategory::Workspace);
    ops_.linear_forward(h_full, p_.router->value, Tensor{}, logits);
    ops_.copy(logits, r.logits);
  }
  Tensor stats = ops_.empty({E + 1}, DType::F32, MemCategory::Workspace);
  ops_.moe_route(r.logits, p_.bias ? p_.bias->value : Tensor{}, moe_.router == MoeRouter::Sigmoid,
                 moe_.normalize_top_k, r.idx, r.weights, stats);
  dispatcher_.plan(r, E, moe_.capacity(N));
  std::vector<float> s(E + 1);
  Tensor sh = Tensor::wrap(s.data(), {E + 1}, DType::F32);
  ops_.copy(stats, sh);
  // This rank's counts, then the micro-batch's over its context-parallel slices (the balancing
  // loss is the whole sequences').
  for (int64_t e = 0; e < E; ++e) {
    stats_.routed[e] += static_cast<double>(r.routed[e]);
    stats_.dropped += static_cast<double>(r.routed[e] - (r.offsets[e + 1] - r.offsets[e]));
  }
  r.tokens = N * ms.cp;
  if (ms.cp > 1) {
    std::vector<float> counts(r.routed.begin(), r.routed.end());  // exact: fewer than 2^24 per micro-batch
    Tensor host = Tensor::wrap(counts.data(), {E}, DType::F32);
    Tensor dev = ops_.empty({E}, DType::F32, MemCategory::Workspace);
    ops_.copy(host, dev);
    par_.cp->all_reduce(dev);
    ops_.copy(dev, host);
    for (int64_t e = 0; e < E; ++e) r.routed[e] = static_cast<int64_t>(std::llround(counts[e]));
  }
  // This rank's share of the micro-batch's losses: E sum_e (routed_e / T) (P_e sum here / T), and
  // the sum of lse^2 here / T.
  const double T = static_cast<double>(r.tokens);
  double aux = 0;
  for (int64_t e = 0; e < E; ++e) aux += static_cast<double>(r.routed[e]) * s[e];
  stats_.aux += static_cast<double>(E) * aux / (T * T);
  stats_.z += s[E] / T;
}

void MoeLayer::forward(const Tensor& h_full, const MicroShape& ms, bool replay, FfnActs& fa, Tensor& out_partial) {
  MoeActs& a = fa.moe;
  const int64_t N = h_full.size(0), rows = moe_.routed_rows(N);
  if (replay)
    TRIPOD_CHECK(a.routing.defined(), "layer {}: a replayed forward without the router's decision", layer_);
  else
    route(h_full, ms, a.routing);
  const DType dt = ops_.compute_dtype();
  a.experts.fc = ops_.empty({rows, (swiglu_ ? 2 : 1) * F_local_}, dt, MemCategory::Activations);
  a.experts.act = ops_.empty({rows, F_local_}, dt, MemCategory::Activations);
  run_experts(ops_, dispatcher_, p_, swiglu_, h_full, a.routing, a.experts.fc, a.experts.act, out_partial);
  if (shared_) {
    Tensor s = ops_.empty({N, C_}, dt, MemCategory::Workspace);
    shared_->forward(h_full, a.shared, s);
    ops_.add(out_partial, s, out_partial);
  }
}

void MoeLayer::keep_for_recompute(FfnActs& a) {
  MoeRouting kept = std::move(a.moe.routing);
  a = FfnActs{};
  a.moe.routing = std::move(kept);
}

void MoeLayer::backward_input(const Tensor& dout_full, const MicroShape& ms, FfnActs& fa, Tensor& dh_full,
                              FfnPending& p, MemCategory category) {
  MoeActs& a = fa.moe;
  MoeRouting& r = a.routing;
  const int64_t N = dout_full.size(0), E = moe_.experts, k = moe_.top_k, R = r.rows();
  const DType dt = ops_.compute_dtype();
  // Through the experts: u = the output gradient in expert order; g = u proj^T, whose row dot with
  // act is the gradient of the row's weight and which times the weight is act's gradient.
  Tensor dweights = ops_.empty({N, k}, DType::F32, MemCategory::Workspace);
  ops_.fill(dweights, 0.f);
  Tensor dfc = ops_.empty({a.experts.fc.size(0), a.experts.fc.size(1)}, dt, category);
  if (R > 0) {
    Tensor u = ops_.empty({R, C_}, dt, MemCategory::Workspace);
    dispatcher_.dispatch(dout_full, r, /*weighted=*/false, u);
    Tensor g = ops_.empty({R, F_local_}, dt, MemCategory::Workspace);
    ops_.grouped_linear_backward_input(u, p_.proj_weights(), r.offsets, g);
    u = Tensor{};
    ops_.moe_combine_backward(g, a.experts.act.slice(0, R), r.slot_of, r.weights, dweights);
    Tensor dfc_rows = dfc.slice(0, R), fc_rows = a.experts.fc.slice(0, R);
    if (swiglu_)
      ops_.swiglu_backward(fc_rows, g, dfc_rows);
    else
      ops_.gelu_backward(fc_rows, g, dfc_rows);
    g = Tensor{};
    Tensor dxp = ops_.empty({R, C_}, dt, MemCategory::Workspace);
    ops_.grouped_linear_backward_input(dfc_rows, p_.fc_weights(), r.offsets, dxp);
    dispatcher_.combine(dxp, r, /*weighted=*/false, dh_full);
  } else {
    ops_.fill(dh_full, 0.f);
  }
  a.experts.fc = Tensor{};
  // Each TP rank holds a slice of every expert: the weights' gradients are partial sums.
  if (par_.grid.tp() > 1) par_.tp->all_reduce(dweights);

  // Through the router, with the losses' gradients: d(aux)/dP_e(t) = coeff E routed_e / T, and
  // d(z)/d(lse_t^2) = coeff; each times the step's per-token scale (the mean over micro-batches
  // of a per-micro-batch mean is the mean over the batch's tokens).
  Tensor aux;
  if (moe_.aux_loss_coeff > 0) {
    std::vector<float> g(E);
    for (int64_t e = 0; e < E; ++e)
      g[e] = static_cast<float>(moe_.aux_loss_coeff * static_cast<double>(E) * static_cast<double>(r.routed[e]) /
                                static_cast<double>(r.tokens) * ms.grad_scale);
    aux = ops_.empty({E}, DType::F32, MemCategory::Workspace);
    Tensor host = Tensor::wrap(g.data(), {E}, DType::F32);
    ops_.copy(host, aux);
  }
  const float z_scale = static_cast<float>(moe_.z_loss_coeff * ms.grad_scale);
  p.dlogits = ops_.empty({N, E}, dt, category);
  ops_.moe_route_backward(r.logits, r.idx, dweights, aux, z_scale, moe_.router == MoeRouter::Sigmoid,
                          moe_.normalize_top_k, p.dlogits);
  // Every TP rank computed the router's whole gradient; its input's share joins the TP sum once.
  if (par_.coords.tp == 0) {
    Tensor dh = ops_.empty({N, C_}, dt, MemCategory::Workspace);
    ops_.linear_backward_input(p.dlogits, p_.router->value, dh);
    ops_.add(dh_full, dh, dh_full);
  }
  if (shared_) {
    Tensor dh = ops_.empty({N, C_}, dt, MemCategory::Workspace);
    p.shared_dfc = shared_->backward_input(dout_full, a.shared, dh, category);
    p.shared_act = a.shared.act;
    ops_.add(dh_full, dh, dh_full);
  }
  p.dfc = dfc;
  p.act = a.experts.act;
  // The weight gradients need the rows' order and weights, not the router's other tensors.
  r.logits = r.idx = r.row_of = Tensor{};
  p.routing = std::move(r);
  fa = FfnActs{};
}

void MoeLayer::backward_weight(const Tensor& dout_full, const Tensor& h_full, const MicroShape&, FfnPending& p) {
  const MoeRouting& r = p.routing;
  const int64_t R = r.rows();
  const DType dt = ops_.compute_dtype();
  if (R > 0) {
    std::vector<Tensor> dproj, dfc;
    for (const LinearParams& l : p_.proj) dproj.push_back(l.weight_grad());
    for (const LinearParams& l : p_.fc) dfc.push_back(l.weight_grad());
    // proj: dW += (w u)^T act over each expert's rows; fc: dW += dfc^T x.
    Tensor uw = ops_.empty({R, C_}, dt, MemCategory::Workspace);
    dispatcher_.dispatch(dout_full, r, /*weighted=*/true, uw);
    ops_.grouped_linear_backward_weight(uw, p.act.slice(0, R), r.offsets, dproj);
    uw = Tensor{};
    Tensor xp = ops_.empty({R, C_}, dt, MemCategory::Workspace);
    dispatcher_.dispatch(h_full, r, /*weighted=*/false, xp);
    ops_.grouped_linear_backward_weight(p.dfc.slice(0, R), xp, r.offsets, dfc);
  }
  Tensor router_grad = p_.router->grad, none;
  ops_.linear_backward_weight(p.dlogits, h_full, router_grad, none);
  if (shared_) shared_->backward_weight(dout_full, p.shared_act, p.shared_dfc, h_full);
  p = FfnPending{};
}

void MoeLayer::update_bias(const std::vector<double>& routed) {
  if (!p_.bias) return;
  const int64_t E = moe_.experts;
  TRIPOD_CHECK(static_cast<int64_t>(routed.size()) == E, "layer {}: {} expert counts for {} experts", layer_,
               routed.size(), E);
  double mean = 0;
  for (double c : routed) mean += c;
  mean /= static_cast<double>(E);
  std::vector<float> b(E);
  Tensor host = Tensor::wrap(b.data(), {E}, DType::F32);
  ops_.copy(p_.bias->value, host);
  const float rate = static_cast<float>(moe_.bias_update_rate);
  for (int64_t e = 0; e < E; ++e) b[e] += routed[e] < mean ? rate : (routed[e] > mean ? -rate : 0.f);
  ops_.copy(host, p_.bias->value);
}

void MoeLayer::infer(Ops& ops, const ParallelContext& par, const ModelConfig& cfg, const MoeParams& p,
                     const Tensor& h, Tensor& out_partial) {
  const MoeConfig& moe = cfg.moe;
  const int64_t N = h.size(0), C = cfg.d_model, E = moe.experts, k = moe.top_k;
  const int64_t Fl = cfg.expert_ffn() / par.grid.tp();
  const DType dt = ops.compute_dtype();
  MoeRouting r;
  allocate_routing(ops, N, E, k, N * k, MemCategory::Workspace, r);  // dropless
  Tensor logits = ops.empty({N, E}, dt, MemCategory::Workspace);
  ops.linear_forward(h, p.router->value, Tensor{}, logits);
  ops.copy(logits, r.logits);
  Tensor stats = ops.empty({E + 1}, DType::F32, MemCategory::Workspace);
  ops.moe_route(r.logits, p.bias ? p.bias->value : Tensor{}, moe.router == MoeRouter::Sigmoid, moe.normalize_top_k,
                r.idx, r.weights, stats);
  LocalDispatcher d(ops);
  d.plan(r, E, -1);
  Tensor fc = ops.empty({N * k, (cfg.swiglu() ? 2 : 1) * Fl}, dt, MemCategory::Workspace);
  Tensor act = ops.empty({N * k, Fl}, dt, MemCategory::Workspace);
  run_experts(ops, d, p, cfg.swiglu(), h, r, fc, act, out_partial);
  if (p.shared) {
    const int64_t Fs = int64_t{moe.shared_experts} * cfg.expert_ffn() / par.grid.tp();
    Tensor sfc = ops.empty({N, (cfg.swiglu() ? 2 : 1) * Fs}, dt, MemCategory::Workspace);
    Tensor sact = ops.empty({N, Fs}, dt, MemCategory::Workspace);
    Mlp::activate(ops, cfg.swiglu(), *p.shared, h, sfc, sact);
    Tensor s = ops.empty({N, C}, dt, MemCategory::Workspace);
    ops.linear_forward(sact, p.shared->proj.weight(), Tensor{}, s);
    ops.add(out_partial, s, out_partial);
  }
}

}  // namespace tripod
