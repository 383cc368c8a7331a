// The mixture-of-experts layer: router, dispatch (by a token dispatcher), grouped experts, shared
// experts, the auxiliary losses' gradients and the selection bias's update.
#include "model/moe.h"

#include <fmt/format.h>

#include <cmath>

namespace tripod {

namespace {

std::vector<const char*> fc_parts(const ModelConfig& cfg) {
  return cfg.swiglu() ? std::vector<const char*>{"gate", "up"} : std::vector<const char*>{"fc"};
}

// The routed experts over the rows of `r`'s plan: fc and act (plan.rows() of them used) and their
// combined, weighted output `out` (N, C), overwritten. Collective over the dispatcher's group.
void run_experts(Ops& ops, TokenDispatcher& d, const MoeParams& p, bool swiglu, const Tensor& h_full,
                 const MoeRouting& r, Tensor& fc, Tensor& act, Tensor& out) {
  const int64_t R = r.plan.rows(), C = h_full.size(1), rows = std::max<int64_t>(R, 1);
  const DType dt = ops.compute_dtype();
  Tensor xp = ops.empty({rows, C}, dt, MemCategory::Workspace);
  d.dispatch(h_full, r.plan, Tensor{}, xp);
  Tensor fc_rows = fc.slice(0, R), act_rows = act.slice(0, R);
  if (R > 0) ops.grouped_linear_forward(xp.slice(0, R), p.fc_weights(), r.plan.offsets, fc_rows);
  xp = Tensor{};
  Tensor yp = ops.empty({rows, C}, dt, MemCategory::Workspace);  // (no rows: every pair dropped or elsewhere)
  if (R > 0) {
    if (swiglu)
      ops.swiglu_forward(fc_rows, act_rows);
    else
      ops.gelu_forward(fc_rows, act_rows);
    Tensor yp_rows = yp.slice(0, R);
    ops.grouped_linear_forward(act_rows, p.proj_weights(), r.plan.offsets, yp_rows);
  }
  d.combine(yp, r.plan, r.weights, out);
}

// Allocates the router's tensors of N tokens in `category` (the dispatcher's plan allocates its own).
void allocate_routing(Ops& ops, int64_t N, int64_t E, int64_t k, MemCategory category, MoeRouting& r) {
  r.logits = ops.empty({N, E}, DType::F32, category);
  r.idx = ops.empty({N, k}, DType::I32, category);
  r.weights = ops.empty({N, k}, DType::F32, category);
}

}  // namespace

// ---- parameters ----------------------------------------------------------------------------------

MoeParams MoeParams::find(ParamRegistry& reg, const ModelConfig& cfg, const std::string& prefix, int first,
                          int count) {
  auto need = [&](const std::string& name) {
    Param* p = reg.find(prefix + "." + name);
    TRIPOD_CHECK(p, "parameter {}.{} is not on this rank", prefix, name);
    return p;
  };
  MoeParams m;
  m.router = need("router.weight");
  if (cfg.moe.selection_bias()) m.bias = need("expert_bias");
  if (count < 0) count = cfg.moe.experts - first;
  for (int e = first; e < first + count; ++e) {
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

// ---- the layer ---------------------------------------------------------------------------------------

std::unique_ptr<FeedForward> make_feed_forward(Ops& ops, const ParallelContext& par, const ModelConfig& cfg,
                                               ParamRegistry& reg, int layer, int chunk, Fp8Registry* fp8) {
  if (cfg.moe.sparse(layer)) return std::make_unique<MoeLayer>(ops, par, cfg, reg, layer, chunk);
  return std::make_unique<DenseFfn>(ops, par, cfg, reg, fmt::format("h.{}.mlp", layer), chunk, fp8, layer);
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
      first_expert_(par.grid.ep_rank(par.coords) * (cfg.moe.experts / par.grid.ep())) {
  const std::string prefix = fmt::format("h.{}.mlp", layer);
  const int r = par.coords.tp;
  const int64_t C = C_, E = moe_.experts, F = cfg.expert_ffn(), Fl = F_local_;
  const float std = 0.02f, proj_std = 0.02f / std::sqrt(2.0f * cfg.n_layers);
  reg.add({.name = prefix + ".router.weight", .global_shape = {E, C}, .decay = true, .init = Init::Normal,
           .stddev = std, .chunk = chunk});
  if (moe_.selection_bias())
    reg.add({.name = prefix + ".expert_bias", .global_shape = {E}, .init = Init::Zeros, .chunk = chunk,
             .buffer = true});
  // This rank's experts (all of them without expert parallelism), each like the dense MLP's TP
  // split: gate and up (or fc) column-parallel and packed into one GEMM weight, proj row-parallel.
  const std::vector<const char*> parts = fc_parts(cfg);
  const int local = static_cast<int>(E / par.grid.ep());
  for (int e = first_expert_; e < first_expert_ + local; ++e) {
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
  p_ = MoeParams::find(reg, cfg, prefix, first_expert_, local);
  reset_stats();
}

TokenDispatcher& MoeLayer::dispatcher() {
  if (!dispatcher_) dispatcher_ = make_token_dispatcher(ops_, par_, moe_.experts);
  return *dispatcher_;
}

void MoeLayer::reset_stats() {
  stats_ = MoeStepStats{};
  stats_.routed.assign(moe_.experts, 0.0);
}

void MoeLayer::route(const Tensor& h_full, const MicroShape& ms, MoeRouting& r) {
  const int64_t N = h_full.size(0), E = moe_.experts, k = moe_.top_k;
  allocate_routing(ops_, N, E, k, MemCategory::Activations, r);
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
  dispatcher().plan(r.idx, r.weights, moe_.capacity(N), r.plan, MemCategory::Activations);
  std::vector<float> s(E + 1);
  Tensor sh = Tensor::wrap(s.data(), {E + 1}, DType::F32);
  ops_.copy(stats, sh);
  // This rank's counts (its tokens', wherever their experts are), then the micro-batch's over its
  // context-parallel slices (the balancing loss is the whole sequences').
  r.routed = r.plan.routed;
  for (int64_t e = 0; e < E; ++e) stats_.routed[e] += static_cast<double>(r.routed[e]);
  stats_.dropped += static_cast<double>(N * k - r.plan.sent);
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
  const int64_t N = h_full.size(0);
  if (replay)
    TRIPOD_CHECK(a.routing.defined(), "layer {}: a replayed forward without the router's decision", layer_);
  else
    route(h_full, ms, a.routing);
  // Without expert parallelism the rows are held at their bound (the memory plan's, exact); with
  // it, at what arrived (the plan counts the most that can).
  const int64_t rows =
      par_.grid.ep() > 1 ? std::max<int64_t>(a.routing.plan.rows(), 1) : moe_.routed_rows(N);
  const DType dt = ops_.compute_dtype();
  a.experts.fc = ops_.empty({rows, (swiglu_ ? 2 : 1) * F_local_}, dt, MemCategory::Activations);
  a.experts.act = ops_.empty({rows, F_local_}, dt, MemCategory::Activations);
  run_experts(ops_, dispatcher(), p_, swiglu_, h_full, a.routing, a.experts.fc, a.experts.act, out_partial);
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
  const int64_t N = dout_full.size(0), E = moe_.experts, k = moe_.top_k, R = r.plan.rows();
  const int64_t rows = std::max<int64_t>(R, 1);
  const DType dt = ops_.compute_dtype();
  TokenDispatcher& d = dispatcher();
  // Through the experts: u = the output gradient in expert order; g = u proj^T, whose row dot with
  // act is the gradient of the row's weight and which times the weight is act's gradient. Every
  // dispatcher call is made even without rows here (under expert parallelism the others' tokens
  // still travel).
  Tensor dweights = ops_.empty({N, k}, DType::F32, MemCategory::Workspace);
  Tensor dfc = ops_.empty({a.experts.fc.size(0), a.experts.fc.size(1)}, dt, category);
  Tensor u = ops_.empty({rows, C_}, dt, MemCategory::Workspace);
  d.dispatch(dout_full, r.plan, Tensor{}, u);
  Tensor g = ops_.empty({rows, F_local_}, dt, MemCategory::Workspace);
  if (R > 0) {
    Tensor g_rows = g.slice(0, R);
    ops_.grouped_linear_backward_input(u.slice(0, R), p_.proj_weights(), r.plan.offsets, g_rows);
  }
  u = Tensor{};
  d.combine_backward(g, a.experts.act, r.plan, r.weights, dweights);
  Tensor dfc_rows = dfc.slice(0, R);
  if (R > 0) {
    Tensor fc_rows = a.experts.fc.slice(0, R), g_rows = g.slice(0, R);
    if (swiglu_)
      ops_.swiglu_backward(fc_rows, g_rows, dfc_rows);
    else
      ops_.gelu_backward(fc_rows, g_rows, dfc_rows);
  }
  g = Tensor{};
  Tensor dxp = ops_.empty({rows, C_}, dt, MemCategory::Workspace);
  if (R > 0) {
    Tensor dxp_rows = dxp.slice(0, R);
    ops_.grouped_linear_backward_input(dfc_rows, p_.fc_weights(), r.plan.offsets, dxp_rows);
  }
  d.combine(dxp, r.plan, Tensor{}, dh_full);
  dxp = Tensor{};
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
  r.logits = r.idx = Tensor{};
  r.plan.keep_for_weight_gradients();
  p.routing = std::move(r);
  fa = FfnActs{};
}

void MoeLayer::backward_weight(const Tensor& dout_full, const Tensor& h_full, const MicroShape&, FfnPending& p) {
  const MoeRouting& r = p.routing;
  const int64_t R = r.plan.rows(), rows = std::max<int64_t>(R, 1);
  const DType dt = ops_.compute_dtype();
  TokenDispatcher& d = dispatcher();
  std::vector<Tensor> dproj, dfc;
  for (const LinearParams& l : p_.proj) dproj.push_back(l.weight_grad());
  for (const LinearParams& l : p_.fc) dfc.push_back(l.weight_grad());
  // proj: dW += (w u)^T act over each expert's rows; fc: dW += dfc^T x. Both inputs are dispatched
  // again rather than kept from I (under expert parallelism: exchanged again, as sequence
  // parallelism gathers its inputs again in W).
  Tensor uw = ops_.empty({rows, C_}, dt, MemCategory::Workspace);
  d.dispatch(dout_full, r.plan, r.weights, uw);
  if (R > 0) ops_.grouped_linear_backward_weight(uw.slice(0, R), p.act.slice(0, R), r.plan.offsets, dproj);
  uw = Tensor{};
  Tensor xp = ops_.empty({rows, C_}, dt, MemCategory::Workspace);
  d.dispatch(h_full, r.plan, Tensor{}, xp);
  if (R > 0) ops_.grouped_linear_backward_weight(p.dfc.slice(0, R), xp.slice(0, R), r.plan.offsets, dfc);
  xp = Tensor{};
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
  allocate_routing(ops, N, E, k, MemCategory::Workspace, r);
  Tensor logits = ops.empty({N, E}, dt, MemCategory::Workspace);
  ops.linear_forward(h, p.router->value, Tensor{}, logits);
  ops.copy(logits, r.logits);
  Tensor stats = ops.empty({E + 1}, DType::F32, MemCategory::Workspace);
  ops.moe_route(r.logits, p.bias ? p.bias->value : Tensor{}, moe.router == MoeRouter::Sigmoid, moe.normalize_top_k,
                r.idx, r.weights, stats);
  LocalDispatcher d(ops, E);  // inference runs without expert parallelism
  d.plan(r.idx, r.weights, /*capacity=*/-1, r.plan, MemCategory::Workspace);  // dropless
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
