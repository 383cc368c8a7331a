// FP8 linear layers: casts, scales, the step's reductions and the delayed recipe's histories.
#include "model/fp8.h"

#include <cmath>

#include "kernels/fp8.h"
#include "model/gpt.h"

namespace tripod {

namespace {

Fp8Format format_of(Fp8Operand op) { return op == Fp8Operand::DY ? Fp8Format::E5M2 : Fp8Format::E4M3; }
DType dtype_of(Fp8Operand op) { return op == Fp8Operand::DY ? DType::F8E5M2 : DType::F8E4M3; }

Tensor as_matrix(const Tensor& t, int64_t cols) { return t.view({t.numel() / cols, cols}); }

// The four linears of a layer: (out, in) of their TP-local weights.
std::array<std::pair<int64_t, int64_t>, 4> linear_shapes(const ModelConfig& m, int tp) {
  const int64_t C = m.d_model, D = m.head_dim(), F = m.ffn();
  return {{{(m.n_heads + 2 * m.kv_heads()) * D / tp, C},
           {C, m.n_heads * D / tp},
           {(m.swiglu() ? 2 : 1) * F / tp, C},
           {C, F / tp}}};
}

constexpr int64_t kStateFloats = 2 * kFp8Operands + kFp8Amaxes + kFp8Operands;  // scales, amaxes, counts

}  // namespace

// ---- one linear layer ------------------------------------------------------------------------

bool Fp8Linear::tp_sharded(Fp8Operand op) const {
  switch (op) {
    case Fp8Operand::W: return true;                 // every linear's weight is split over TP
    case Fp8Operand::X: return row_parallel_;        // a row-parallel linear's input is split
    case Fp8Operand::DY: return !row_parallel_;      // a column-parallel linear's output is split
  }
  return false;
}

bool Fp8Linear::counts(Fp8Operand op) const {
  const ParallelContext& par = reg_->par_;
  if (op == Fp8Operand::W) return par.grid.dpcp_rank(par.coords) == 0;  // the same weight on every DP x CP rank
  return tp_sharded(op) || par.coords.tp == 0;  // an input or gradient every TP rank holds whole: TP rank 0
}

Tensor Fp8Linear::slot(const Tensor& t, int index, int width) const { return t.slice(index, index + 1).view({width}); }

Tensor Fp8Linear::step_amax(Fp8Operand op) const {
  const int64_t i = kFp8Amaxes * index_ + static_cast<int>(op);
  return reg_->amax_.flat(i, i + 1);
}

Fp8Linear::Cast Fp8Linear::cast(Fp8Operand op, const Tensor& x, bool want_q, bool want_qt, bool count) {
  Fp8Registry& r = *reg_;
  Ops& ops = r.ops_;
  const ParallelContext& par = r.par_;
  const int64_t R = x.size(0), C = x.size(1);
  const int s = kFp8Operands * index_ + static_cast<int>(op);
  Cast c;
  if (r.cfg_.recipe == Fp8Recipe::Delayed) {
    c.scale = slot(r.scales_, s, 2);
  } else {
    // Current scaling: the amax of the whole tensor, over the ranks holding parts of it.
    Tensor amax = ops.empty({1}, DType::F32, MemCategory::Workspace);
    ops.fp8_amax(x, amax);
    if (tp_sharded(op) && par.grid.tp() > 1) par.tp->all_reduce(amax, ReduceOp::Max);
    if (op != Fp8Operand::W && par.grid.cp() > 1) par.cp->all_reduce(amax, ReduceOp::Max);
    // The weight's scale stays in the state for the step; the others are the cast's own.
    c.scale = op == Fp8Operand::W ? slot(r.scales_, s, 2)
                                  : ops.empty({2}, DType::F32, MemCategory::Workspace);
    Tensor record = step_amax(op);
    ops.fp8_scale(amax, fp8_max(format_of(op)), r.cfg_.margin, c.scale, record);
  }
  if (want_q) c.q = ops.empty({R, C}, dtype_of(op), MemCategory::Workspace);
  if (want_qt) c.qt = ops.empty({C, R}, dtype_of(op), MemCategory::Workspace);
  // Delayed scaling takes the step's amax in the cast's own pass; tensorwise had it above.
  Tensor amax = r.cfg_.recipe == Fp8Recipe::Delayed ? step_amax(op) : Tensor{};
  Tensor sat = count && counts(op) ? r.saturated_.flat(s, s + 1) : Tensor{};
  ops.fp8_quantize(x, c.scale, c.q, c.qt, amax, sat);
  return c;
}

void Fp8Linear::ensure_weight(const Tensor& w) {
  if (weight_valid_) return;
  const Tensor w2 = as_matrix(w, wq_.size(1));
  TRIPOD_CHECK(w2.size(0) == wq_.size(0), "FP8 linear {}: weight {} but registered ({}, {})", name_, w.str(),
               wq_.size(0), wq_.size(1));
  Fp8Registry& r = *reg_;
  Ops& ops = r.ops_;
  const int s = kFp8Operands * index_ + static_cast<int>(Fp8Operand::W);
  Tensor scale = slot(r.scales_, s, 2), record = step_amax(Fp8Operand::W), none;
  if (r.cfg_.recipe == Fp8Recipe::Tensorwise) {
    Tensor amax = ops.empty({1}, DType::F32, MemCategory::Workspace);
    ops.fp8_amax(w2, amax);
    if (r.par_.grid.tp() > 1) r.par_.tp->all_reduce(amax, ReduceOp::Max);
    ops.fp8_scale(amax, kFp8E4M3Max, r.cfg_.margin, scale, record);
  }
  Tensor sat = counts(Fp8Operand::W) ? r.saturated_.flat(s, s + 1) : Tensor{};
  ops.fp8_quantize(w2, scale, wq_, wqt_, r.cfg_.recipe == Fp8Recipe::Delayed ? record : none, sat);
  weight_valid_ = true;
}

void Fp8Linear::forward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y) {
  ensure_weight(w);
  Ops& ops = reg_->ops_;
  const int64_t I = wq_.size(1), O = wq_.size(0);
  Cast xc = cast(Fp8Operand::X, as_matrix(x, I), /*want_q=*/true, /*want_qt=*/false, /*count=*/false);
  const int ws_index = kFp8Operands * index_ + static_cast<int>(Fp8Operand::W);
  Tensor ws = slot(reg_->scales_, ws_index, 2);
  Tensor y2 = as_matrix(y, O), out_amax = reg_->amax_.flat(kFp8Amaxes * index_ + 3, kFp8Amaxes * index_ + 4);
  ops.fp8_gemm(xc.q, xc.scale, wq_, ws, b, /*accumulate=*/false, y2, out_amax);
}

void Fp8Linear::backward_input(const Tensor& dy, const Tensor& w, Tensor& dx) {
  ensure_weight(w);  // valid since the forward, unless a checkpoint was loaded in between
  Ops& ops = reg_->ops_;
  const int64_t I = wq_.size(1), O = wq_.size(0);
  // dy and its transpose in one pass; its clipped elements counted here, once per micro-batch.
  const Tensor dy2 = as_matrix(dy, O);
  Cast dyc = cast(Fp8Operand::DY, dy2, /*want_q=*/true, /*want_qt=*/true, /*count=*/true);
  const int ws_index = kFp8Operands * index_ + static_cast<int>(Fp8Operand::W);
  Tensor ws = slot(reg_->scales_, ws_index, 2), dx2 = as_matrix(dx, I), none;
  ops.fp8_gemm(dyc.q, dyc.scale, wqt_, ws, Tensor{}, /*accumulate=*/false, dx2, none);
  dyc.q = Tensor{};
  dy_cast_ = {.storage = dy.storage_ref(), .data = dy.raw(), .shape = dy2.shape(), .cast = std::move(dyc)};
}

void Fp8Linear::backward_weight(const Tensor& dy, const Tensor& x, Tensor& dw, Tensor& db) {
  Ops& ops = reg_->ops_;
  const int64_t I = wq_.size(1), O = wq_.size(0);
  const Tensor dy2 = as_matrix(dy, O);
  // The cast backward_input made of this very tensor, or a new one (the same bytes: the same
  // scale, delayed or from the same amax).
  const bool same = !dy_cast_.storage.expired() && dy_cast_.storage.lock() == dy.storage_ref().lock() &&
                    dy_cast_.data == dy.raw() && dy_cast_.shape == dy2.shape();
  Cast dyc = same ? std::move(dy_cast_.cast)
                  : cast(Fp8Operand::DY, dy2, /*want_q=*/false, /*want_qt=*/true, /*count=*/false);
  dy_cast_ = DyCast{};
  // x's clipped elements are counted here, where each micro-batch's cast happens once (a
  // recomputed forward casts x twice).
  Cast xc = cast(Fp8Operand::X, as_matrix(x, I), /*want_q=*/false, /*want_qt=*/true, /*count=*/true);
  Tensor dw2 = as_matrix(dw, I), none;
  ops.fp8_gemm(dyc.qt, dyc.scale, xc.qt, xc.scale, Tensor{}, /*accumulate=*/true, dw2, none);
  if (db.defined()) ops.bias_backward(as_matrix(dy, O), db);
}

// ---- the registry ----------------------------------------------------------------------------

Fp8Registry::Fp8Registry(Ops& ops, const ParallelContext& par, const Fp8Config& cfg, int n_layers)
    : ops_(ops), par_(par), cfg_(cfg), n_layers_(n_layers) {}

Fp8Linear* Fp8Registry::add(const std::string& name, int layer, int kind, bool row_parallel, int64_t out,
                            int64_t in) {
  TRIPOD_CHECK(!scales_.defined(), "FP8 linear {} registered after allocation", name);
  TRIPOD_CHECK(fp8_layer(layer) && kind >= 0 && kind < 4, "FP8 linear {}: layer {} kind {}", name, layer, kind);
  Fp8Linear& l = linears_.emplace_back();
  l.reg_ = this;
  l.name_ = name;
  l.index_ = static_cast<int>(linears_.size()) - 1;
  l.global_ = 4 * layer + kind;
  l.row_parallel_ = row_parallel;
  l.wq_ = ops_.empty({out, in}, DType::F8E4M3, MemCategory::Params);
  l.wqt_ = ops_.empty({in, out}, DType::F8E4M3, MemCategory::Params);
  return &l;
}

void Fp8Registry::allocate() {
  const int64_t G = size();
  if (G == 0) return;
  scales_ = ops_.empty({G * kFp8Operands, 2}, DType::F32, MemCategory::Params);
  amax_ = ops_.empty({G * kFp8Amaxes}, DType::F32, MemCategory::Params);
  saturated_ = ops_.empty({G * kFp8Operands}, DType::F32, MemCategory::Params);
  host_scales_.assign(G * kFp8Operands, 1.f);
  used_scales_ = host_scales_;
  history_.assign(G * kFp8Operands * cfg_.amax_history, 0.f);
  upload_scales();
  ops_.fill(amax_, 0.f);
  ops_.fill(saturated_, 0.f);
}

void Fp8Registry::upload_scales() {
  std::vector<float> pairs(2 * host_scales_.size());
  for (size_t i = 0; i < host_scales_.size(); ++i) {
    pairs[2 * i] = host_scales_[i];
    pairs[2 * i + 1] = 1.f / host_scales_[i];
  }
  Tensor dst = scales_.view({static_cast<int64_t>(pairs.size())});
  ops_.copy(Tensor::wrap(pairs.data(), {static_cast<int64_t>(pairs.size())}, DType::F32), dst);
}

void Fp8Registry::begin_step() {
  if (size() == 0) return;
  ops_.fill(amax_, 0.f);
  ops_.fill(saturated_, 0.f);
  weights_changed();
}

void Fp8Registry::weights_changed() {
  for (Fp8Linear& l : linears_) l.weight_valid_ = false;
}

void Fp8Registry::end_step(bool skipped) {
  if (cfg_.recipe != Fp8Recipe::Delayed || size() == 0) return;
  // Every rank of a TP and of a DP x CP group holds the same layers, so these collectives match.
  if (par_.grid.tp() > 1) par_.tp->all_reduce(amax_, ReduceOp::Max);
  if (par_.grid.size(Axis::DPCP) > 1) par_.dpcp->all_reduce(amax_, ReduceOp::Max);
  used_scales_ = host_scales_;
  if (skipped) return;  // the step did not happen: neither do its amaxes
  std::vector<float> amax(amax_.numel());
  Tensor host_amax = Tensor::wrap(amax.data(), {amax_.numel()}, DType::F32);
  ops_.copy(amax_, host_amax);
  ops_.synchronize();
  const int H = cfg_.amax_history;
  const float margin = std::ldexp(1.f, -cfg_.margin);
  for (int g = 0; g < size(); ++g)
    for (int o = 0; o < kFp8Operands; ++o) {
      const int s = kFp8Operands * g + o;
      float* h = history_.data() + static_cast<size_t>(s) * H;
      std::copy_backward(h, h + H - 1, h + H);
      h[0] = amax[kFp8Amaxes * g + o];
      float a = 0.f;  // the max of the history; a NaN never wins, an infinity keeps the scale
      for (int i = 0; i < H; ++i) a = h[i] > a ? h[i] : a;
      host_scales_[s] = fp8_scale_from_amax(a, fp8_max(format_of(static_cast<Fp8Operand>(o))), margin, host_scales_[s]);
    }
  upload_scales();
}

Fp8Stats Fp8Registry::gather_stats(int64_t step, Communicator& world) {
  const int G = size();
  constexpr int kPer = kFp8Operands + kFp8Amaxes + kFp8Operands + 1;  // scale, amax, saturated, present
  const int64_t slots = 4LL * n_layers_;
  std::vector<double> all(static_cast<size_t>(slots * kPer), 0.0);
  if (G > 0) {
    // The amaxes of tensorwise casts (delayed reduced them in end_step) and every count, over the
    // ranks holding parts of the same tensors: each layer's figures end up on its TP rank 0 of
    // DP x CP rank 0.
    if (cfg_.recipe == Fp8Recipe::Tensorwise) {
      if (par_.grid.tp() > 1) par_.tp->all_reduce(amax_, ReduceOp::Max);
      if (par_.grid.size(Axis::DPCP) > 1) par_.dpcp->all_reduce(amax_, ReduceOp::Max);
    }
    if (par_.grid.tp() > 1) par_.tp->all_reduce(saturated_);
    if (par_.grid.size(Axis::DPCP) > 1) par_.dpcp->all_reduce(saturated_);
    std::vector<float> amax(amax_.numel()), sat(saturated_.numel());
    Tensor host_amax = Tensor::wrap(amax.data(), {amax_.numel()}, DType::F32);
    Tensor host_sat = Tensor::wrap(sat.data(), {saturated_.numel()}, DType::F32);
    ops_.copy(amax_, host_amax);
    ops_.copy(saturated_, host_sat);
    ops_.synchronize();
    if (par_.coords.tp == 0 && par_.grid.dpcp_rank(par_.coords) == 0) {
      const float margin = std::ldexp(1.f, -cfg_.margin);
      for (const Fp8Linear& l : linears_) {
        double* row = all.data() + static_cast<size_t>(l.global_) * kPer;
        for (int o = 0; o < kFp8Operands; ++o) {
          const float a = amax[kFp8Amaxes * l.index_ + o];
          const float fmax = fp8_max(format_of(static_cast<Fp8Operand>(o)));
          row[o] = cfg_.recipe == Fp8Recipe::Delayed ? used_scales_[kFp8Operands * l.index_ + o]
                                                     : fp8_scale_from_amax(a, fmax, margin, 1.f);
          row[kFp8Operands + kFp8Amaxes + o] = sat[kFp8Operands * l.index_ + o];
        }
        for (int k = 0; k < kFp8Amaxes; ++k) row[kFp8Operands + k] = amax[kFp8Amaxes * l.index_ + k];
        row[kPer - 1] = 1;  // this linear is in FP8 (an MoE layer's experts are not)
      }
    }
  }
  CpuAllocator host;
  Tensor t = Tensor::empty(host, {static_cast<int64_t>(all.size())}, DType::F64, MemCategory::Workspace);
  std::copy(all.begin(), all.end(), t.data<double>());
  world.all_reduce(t);  // each layer's row comes from one rank; the rest add zeros
  Fp8Stats out;
  out.step = step;
  if (world.rank() != 0) return out;
  const double* p = t.data<double>();
  static const char* kinds[4] = {"attn.qkv", "attn.proj", "mlp.fc", "mlp.proj"};
  for (int layer = 0; layer < n_layers_; ++layer) {
    for (int k = 0; k < 4; ++k) {
      const double* row = p + static_cast<size_t>(4 * layer + k) * kPer;
      if (row[kPer - 1] == 0) continue;
      out.names.push_back(fmt::format("h.{}.{}", layer, kinds[k]));
      std::array<double, kFp8Operands> sc{}, sa{};
      std::array<double, kFp8Amaxes> am{};
      for (int o = 0; o < kFp8Operands; ++o) {
        sc[o] = row[o];
        sa[o] = row[kFp8Operands + kFp8Amaxes + o];
      }
      for (int k2 = 0; k2 < kFp8Amaxes; ++k2) am[k2] = row[kFp8Operands + k2];
      out.scale.push_back(sc);
      out.amax.push_back(am);
      out.saturated.push_back(sa);
    }
  }
  return out;
}

std::vector<std::pair<std::string, std::vector<float>>> Fp8Registry::state() const {
  std::vector<std::pair<std::string, std::vector<float>>> out;
  const int H = cfg_.amax_history;
  for (const Fp8Linear& l : linears_) {
    std::vector<float> v(static_cast<size_t>(kFp8Operands) * (1 + H));
    for (int o = 0; o < kFp8Operands; ++o) {
      const int s = kFp8Operands * l.index_ + o;
      v[o * (1 + H)] = host_scales_[s];
      std::copy_n(history_.data() + static_cast<size_t>(s) * H, H, v.data() + o * (1 + H) + 1);
    }
    out.emplace_back(l.name_, std::move(v));
  }
  return out;
}

int Fp8Registry::load_state(const std::vector<std::pair<std::string, std::vector<float>>>& saved) {
  const int H = cfg_.amax_history;
  int restored = 0;
  for (const Fp8Linear& l : linears_)
    for (const auto& [name, v] : saved) {
      if (name != l.name_) continue;
      const int64_t Hs = static_cast<int64_t>(v.size()) / kFp8Operands - 1;
      TRIPOD_CHECK(Hs >= 1 && static_cast<int64_t>(v.size()) == kFp8Operands * (1 + Hs),
                   "FP8 state of {}: {} floats", name, v.size());
      for (int o = 0; o < kFp8Operands; ++o) {
        const int s = kFp8Operands * l.index_ + o;
        host_scales_[s] = v[o * (1 + Hs)];
        float* h = history_.data() + static_cast<size_t>(s) * H;
        std::fill(h, h + H, 0.f);
        std::copy_n(v.data() + o * (1 + Hs) + 1, std::min<int64_t>(H, Hs), h);
      }
      ++restored;
    }
  used_scales_ = host_scales_;
  if (size() > 0) upload_scales();
  weights_changed();
  return restored;
}

// ---- dispatch --------------------------------------------------------------------------------

void linear_forward(Ops& ops, Fp8Linear* fp8, const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y) {
  if (fp8)
    fp8->forward(x, w, b, y);
  else
    ops.linear_forward(x, w, b, y);
}

void linear_backward_input(Ops& ops, Fp8Linear* fp8, const Tensor& dy, const Tensor& w, Tensor& dx) {
  if (fp8)
    fp8->backward_input(dy, w, dx);
  else
    ops.linear_backward_input(dy, w, dx);
}

void linear_backward_weight(Ops& ops, Fp8Linear* fp8, const Tensor& dy, const Tensor& x, Tensor& dw, Tensor& db) {
  if (fp8)
    fp8->backward_weight(dy, x, dw, db);
  else
    ops.linear_backward_weight(dy, x, dw, db);
}

std::string fp8_summary(const ModelConfig& cfg, const Fp8Config& fp8) {
  int n = 0, moe_layers = 0, first = -1, last = -1;
  for (int l = 0; l < cfg.n_layers; ++l) {
    const int k = fp8.linears(cfg, l);
    if (k == 0) continue;
    n += k;
    moe_layers += k == 2;
    if (first < 0) first = l;
    last = l;
  }
  std::string out = fmt::format("{} linears in FP8 (layers {}-{} of {})", n, first, last, cfg.n_layers);
  if (moe_layers > 0)
    out += fmt::format("; in the {} mixture-of-experts layers among them the attention's only (routers and experts stay in bf16)",
                       moe_layers);
  return out;
}

int fp8_linear_count(const ModelConfig& cfg, const Fp8Config& fp8, const std::vector<ChunkLayout>& chunks) {
  int n = 0;
  for (const ChunkLayout& c : chunks)
    for (int l = c.layer_begin; l < c.layer_end; ++l) n += fp8.linears(cfg, l);
  return n;
}

int64_t fp8_persistent_bytes(const ModelConfig& cfg, const Fp8Config& fp8, int tp,
                             const std::vector<ChunkLayout>& chunks) {
  int64_t linears = 0, cast_bytes = 0;
  const auto shapes = linear_shapes(cfg, tp);
  for (const ChunkLayout& c : chunks)
    for (int l = c.layer_begin; l < c.layer_end; ++l) {
      const int kinds = fp8.linears(cfg, l);  // the first `kinds` of (qkv, proj, mlp.fc, mlp.proj)
      for (int k = 0; k < kinds; ++k) cast_bytes += 2 * shapes[k].first * shapes[k].second;
      linears += kinds;
    }
  return cast_bytes + linears * kStateFloats * 4;
}

}  // namespace tripod
