// Token dispatchers: local, all-to-all and all-gather (token_dispatcher.h).
#include "parallel/expert_parallel/token_dispatcher.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"

namespace tripod {

void DispatchPlan::keep_for_weight_gradients() { row_of = dst_of = row_of_all = Tensor{}; }

namespace {

// Adds the wall time of its scope to `seconds` (TokenDispatcher::seconds).
class Clock {
 public:
  explicit Clock(double& seconds) : seconds_(seconds), t0_(std::chrono::steady_clock::now()) {}
  ~Clock() { seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }
  Clock(const Clock&) = delete;
  Clock& operator=(const Clock&) = delete;

 private:
  double& seconds_;
  std::chrono::steady_clock::time_point t0_;
};

// An i32 tensor of `n` (at least 1) elements in `category` holding `host` (n values).
Tensor upload_i32(Ops& ops, const std::vector<int32_t>& host, MemCategory category) {
  Tensor t = ops.empty({std::max<int64_t>(static_cast<int64_t>(host.size()), 1)}, DType::I32, category);
  if (!host.empty()) {
    Tensor h = Tensor::wrap(const_cast<int32_t*>(host.data()), {static_cast<int64_t>(host.size())}, DType::I32);
    Tensor head = t.flat(0, static_cast<int64_t>(host.size()));
    ops.copy(h, head);
  }
  return t;
}

std::vector<int32_t> download_i32(Ops& ops, const Tensor& t) {
  std::vector<int32_t> host(t.numel());
  Tensor h = Tensor::wrap(host.data(), {t.numel()}, DType::I32);
  ops.copy(t, h);
  return host;
}

// The token side of every dispatcher but all-gather's: this rank's pairs in expert order, the
// first `capacity` of each expert kept; the counts on the host. Returns the kept count per expert.
std::vector<int64_t> plan_token_side(Ops& ops, const Tensor& idx, int64_t experts, int64_t capacity, DispatchPlan& p,
                                     MemCategory category) {
  const int64_t N = idx.size(0), k = idx.size(1);
  p.tokens = N;
  p.k = k;
  const int64_t rows_max = capacity < 0 ? N * k : std::min(N * k, capacity * experts);
  p.row_of = ops.empty({N * k}, DType::I32, category);
  p.slot_of = ops.empty({std::max<int64_t>(rows_max, 1)}, DType::I32, category);
  Tensor routed = ops.empty({experts}, DType::I32, MemCategory::Workspace);
  ops.moe_dispatch(idx, experts, capacity, routed, p.row_of, p.slot_of);
  const std::vector<int32_t> host = download_i32(ops, routed);  // the grouped GEMMs' sizes are host values
  p.routed.assign(host.begin(), host.end());
  std::vector<int64_t> kept(experts);
  p.sent = 0;
  for (int64_t e = 0; e < experts; ++e) {
    kept[e] = capacity < 0 ? host[e] : std::min<int64_t>(host[e], capacity);
    p.sent += kept[e];
  }
  return kept;
}

// A rows x C scratch tensor of x's dtype with at least one row (collectives need a buffer even
// when nothing travels).
Tensor rows_like(Ops& ops, int64_t rows, int64_t C, DType dt) {
  return ops.empty({std::max<int64_t>(rows, 1), C}, dt, MemCategory::Workspace);
}

std::vector<int64_t> times(const std::vector<int64_t>& counts, int64_t c) {
  std::vector<int64_t> out(counts);
  for (int64_t& v : out) v *= c;
  return out;
}

}  // namespace

// ---- local -------------------------------------------------------------------------------------------

void LocalDispatcher::plan(const Tensor& idx, const Tensor&, int64_t capacity, DispatchPlan& p, MemCategory category) {
  Clock clock(seconds_);
  const std::vector<int64_t> kept = plan_token_side(ops_, idx, experts_, capacity, p, category);
  p.offsets.assign(experts_ + 1, 0);
  for (int64_t e = 0; e < experts_; ++e) p.offsets[e + 1] = p.offsets[e] + kept[e];
}

void LocalDispatcher::dispatch(const Tensor& x, const DispatchPlan& p, const Tensor& weights, Tensor& xp) {
  Clock clock(seconds_);
  const int64_t R = p.rows();
  if (R == 0) return;
  Tensor rows = xp.slice(0, R);
  ops_.moe_permute(x, p.slot_of, p.k, weights, rows);
}

void LocalDispatcher::combine(const Tensor& yp, const DispatchPlan& p, const Tensor& weights, Tensor& y) {
  Clock clock(seconds_);
  ops_.moe_unpermute(yp, p.row_of, weights, y);
}

void LocalDispatcher::combine_backward(Tensor& g, const Tensor& act, const DispatchPlan& p, const Tensor& weights,
                                       Tensor& dweights) {
  Clock clock(seconds_);
  ops_.fill(dweights, 0.f);
  const int64_t R = p.rows();
  if (R == 0) return;
  Tensor rows = g.slice(0, R);
  ops_.moe_combine_backward(rows, act.slice(0, R), p.slot_of, weights, dweights);
}

// ---- all-to-all ------------------------------------------------------------------------------------

void AllToAllDispatcher::plan(const Tensor& idx, const Tensor&, int64_t capacity, DispatchPlan& p,
                              MemCategory category) {
  Clock clock(seconds_);
  const int n = ep_.size(), me = ep_.rank();
  const int64_t E = experts_, El = E / n;
  const std::vector<int64_t> kept = plan_token_side(ops_, idx, E, capacity, p, category);
  // Counts first: every EP rank's kept pairs per expert, K[q][e] (exact in i32).
  std::vector<int32_t> mine(kept.begin(), kept.end());
  Tensor in = upload_i32(ops_, mine, MemCategory::Workspace);
  Tensor all = ops_.empty({n * E}, DType::I32, MemCategory::Workspace);
  ep_.all_gather(in, all);
  const std::vector<int32_t> K = download_i32(ops_, all);
  auto count = [&](int q, int64_t e) { return static_cast<int64_t>(K[q * E + e]); };
  // Rows to rank q are those of its experts, contiguous in the token side's expert order; rows from
  // rank q are its rows for this rank's experts, in their order.
  p.send_counts.assign(n, 0);
  p.recv_counts.assign(n, 0);
  for (int q = 0; q < n; ++q)
    for (int64_t e = 0; e < El; ++e) {
      p.send_counts[q] += kept[q * El + e];
      p.recv_counts[q] += count(q, me * El + e);
    }
  // Expert-side row (local expert e, source q, i-th) arrives at recv_at[q] + (q's rows for
  // experts before e) + i.
  std::vector<int64_t> recv_at(n + 1, 0);
  for (int q = 0; q < n; ++q) recv_at[q + 1] = recv_at[q] + p.recv_counts[q];
  p.offsets.assign(El + 1, 0);
  for (int64_t e = 0; e < El; ++e) {
    p.offsets[e + 1] = p.offsets[e];
    for (int q = 0; q < n; ++q) p.offsets[e + 1] += count(q, me * El + e);
  }
  const int64_t R = p.rows();
  std::vector<int32_t> src_of(R), dst_of(R);
  std::vector<int64_t> before(n, 0);  // per source: its rows for this rank's experts so far
  int64_t r = 0;
  for (int64_t e = 0; e < El; ++e)
    for (int q = 0; q < n; ++q) {
      const int64_t c = count(q, me * El + e);
      for (int64_t i = 0; i < c; ++i, ++r) {
        const int64_t at = recv_at[q] + before[q] + i;
        src_of[r] = static_cast<int32_t>(at);
        dst_of[at] = static_cast<int32_t>(r);
      }
      before[q] += c;
    }
  p.src_of = upload_i32(ops_, src_of, category);
  p.dst_of = upload_i32(ops_, dst_of, category);
}

void AllToAllDispatcher::dispatch(const Tensor& x, const DispatchPlan& p, const Tensor& weights, Tensor& xp) {
  Clock clock(seconds_);
  const int64_t C = x.size(1), S = p.sent, R = p.rows();
  // Out: the token side's rows (weighted here, where the weights are), then source after source.
  Tensor send = rows_like(ops_, S, C, x.dtype()), recv = rows_like(ops_, R, C, x.dtype());
  if (S > 0) {
    Tensor rows = send.slice(0, S);
    ops_.moe_permute(x, p.slot_of, p.k, weights, rows);
  }
  ep_.all_to_all_v(send, times(p.send_counts, C), recv, times(p.recv_counts, C));
  send = Tensor{};
  if (R > 0) {
    Tensor rows = xp.slice(0, R);
    ops_.gather_rows(recv, p.src_of, rows);  // expert after expert
  }
}

void AllToAllDispatcher::combine(const Tensor& yp, const DispatchPlan& p, const Tensor& weights, Tensor& y) {
  Clock clock(seconds_);
  const int64_t C = y.size(1), S = p.sent, R = p.rows();
  Tensor back = rows_like(ops_, R, C, yp.dtype()), recv = rows_like(ops_, S, C, yp.dtype());
  if (R > 0) {
    Tensor rows = back.slice(0, R);
    ops_.gather_rows(yp, p.dst_of, rows);  // source after source
  }
  ep_.all_to_all_v(back, times(p.recv_counts, C), recv, times(p.send_counts, C));
  back = Tensor{};
  ops_.moe_unpermute(recv, p.row_of, weights, y);  // weighted where the weights are
}

void AllToAllDispatcher::combine_backward(Tensor& g, const Tensor& act, const DispatchPlan& p, const Tensor& weights,
                                          Tensor& dweights) {
  Clock clock(seconds_);
  const int64_t S = p.sent, R = p.rows(), N = p.tokens, k = p.k;
  // Each row's weight travels to its expert: the token side's weights in row order, then source
  // after source (src_of indexes them as it does the rows).
  Tensor w_send = ops_.empty({std::max<int64_t>(S, 1), 1}, DType::F32, MemCategory::Workspace);
  Tensor w_recv = ops_.empty({std::max<int64_t>(R, 1)}, DType::F32, MemCategory::Workspace);
  if (S > 0) {
    Tensor rows = w_send.slice(0, S);
    ops_.gather_rows(weights.view({N * k, 1}), p.slot_of, rows);
  }
  ep_.all_to_all_v(w_send, p.send_counts, w_recv, p.recv_counts);
  // Every row's <act, g> lands at its arrival position and goes back the way it came.
  Tensor d_recv = ops_.empty({std::max<int64_t>(R, 1)}, DType::F32, MemCategory::Workspace);
  if (R > 0) {
    Tensor rows = g.slice(0, R);
    ops_.moe_combine_backward(rows, act.slice(0, R), p.src_of, w_recv, d_recv);
  }
  Tensor d_send = ops_.empty({std::max<int64_t>(S, 1), 1}, DType::F32, MemCategory::Workspace);
  ep_.all_to_all_v(d_recv, p.recv_counts, d_send, p.send_counts);
  Tensor pairs = dweights.view({N * k, 1});
  ops_.gather_rows(d_send, p.row_of, pairs);  // dropped pairs: 0
}

// ---- all-gather ------------------------------------------------------------------------------------

void AllGatherDispatcher::plan(const Tensor& idx, const Tensor& weights, int64_t capacity, DispatchPlan& p,
                               MemCategory category) {
  Clock clock(seconds_);
  const int n = ep_.size(), me = ep_.rank();
  const int64_t N = idx.size(0), k = idx.size(1), E = experts_, El = E / n, P = N * k;
  p.tokens = N;
  p.k = k;
  // Every EP rank's choices and weights.
  Tensor idx_all = ops_.empty({n * P}, DType::I32, MemCategory::Workspace);
  ep_.all_gather(idx.view({P}), idx_all);
  p.weights_all = ops_.empty({n * P}, DType::F32, category);
  ep_.all_gather(weights.view({P}), p.weights_all);
  const std::vector<int32_t> all = download_i32(ops_, idx_all);
  // Each source's first `capacity` pairs per expert are kept (moe_dispatch's rule, applied to the
  // pairs of each rank alone); this rank's experts take theirs, source after source.
  std::vector<std::vector<int32_t>> rows_of(El);  // per local expert, its pairs in order
  p.routed.assign(E, 0);
  p.sent = 0;
  std::vector<int64_t> taken(E);
  for (int q = 0; q < n; ++q) {
    std::fill(taken.begin(), taken.end(), 0);
    for (int64_t i = 0; i < P; ++i) {
      const int32_t e = all[q * P + i];
      TRIPOD_CHECK(e >= 0 && e < E, "allgather dispatch: expert {} of pair {} of EP rank {}", e, i, q);
      if (q == me) ++p.routed[e];
      if (capacity >= 0 && taken[e] >= capacity) continue;
      ++taken[e];
      if (q == me) ++p.sent;
      if (e / El == me) rows_of[e % El].push_back(static_cast<int32_t>(q * P + i));
    }
  }
  p.offsets.assign(El + 1, 0);
  for (int64_t e = 0; e < El; ++e) p.offsets[e + 1] = p.offsets[e] + static_cast<int64_t>(rows_of[e].size());
  std::vector<int32_t> pair_of, row_of_all(n * P, -1);
  pair_of.reserve(p.rows());
  for (int64_t e = 0; e < El; ++e)
    for (int32_t pair : rows_of[e]) {
      row_of_all[pair] = static_cast<int32_t>(pair_of.size());
      pair_of.push_back(pair);
    }
  p.pair_of = upload_i32(ops_, pair_of, category);
  p.row_of_all = upload_i32(ops_, row_of_all, category);
}

void AllGatherDispatcher::dispatch(const Tensor& x, const DispatchPlan& p, const Tensor& weights, Tensor& xp) {
  Clock clock(seconds_);
  const int64_t N = x.size(0), C = x.size(1), R = p.rows();
  Tensor x_all = ops_.empty({ep_.size() * N, C}, x.dtype(), MemCategory::Workspace);
  ep_.all_gather(x, x_all);
  if (R == 0) return;
  Tensor rows = xp.slice(0, R);
  ops_.moe_permute(x_all, p.pair_of, p.k, weights.defined() ? p.weights_all : Tensor{}, rows);
}

void AllGatherDispatcher::combine(const Tensor& yp, const DispatchPlan& p, const Tensor& weights, Tensor& y) {
  Clock clock(seconds_);
  const int64_t N = y.size(0), C = y.size(1);
  // This rank's experts' share of every token of the group (zeros where it has none), summed over
  // the group and scattered back to the tokens' ranks.
  Tensor y_all = ops_.empty({ep_.size() * N, C}, y.dtype(), MemCategory::Workspace);
  ops_.moe_unpermute(yp, p.row_of_all, weights.defined() ? p.weights_all : Tensor{}, y_all);
  ep_.reduce_scatter(y_all, y);
}

void AllGatherDispatcher::combine_backward(Tensor& g, const Tensor& act, const DispatchPlan& p, const Tensor&,
                                           Tensor& dweights) {
  Clock clock(seconds_);
  const int64_t R = p.rows();
  Tensor d_all = ops_.empty({ep_.size() * p.tokens * p.k}, DType::F32, MemCategory::Workspace);
  ops_.fill(d_all, 0.f);
  if (R > 0) {
    Tensor rows = g.slice(0, R);
    ops_.moe_combine_backward(rows, act.slice(0, R), p.pair_of, p.weights_all, d_all);
  }
  Tensor pairs = dweights.view({p.tokens * p.k});
  ep_.reduce_scatter(d_all, pairs);  // one rank holds each pair's value, the others add zeros
}

std::unique_ptr<TokenDispatcher> make_token_dispatcher(Ops& ops, const ParallelContext& par, int64_t experts) {
  const int ep = par.grid.ep();
  if (ep == 1) return std::make_unique<LocalDispatcher>(ops, experts);
  TRIPOD_CHECK(par.ep && par.ep->size() == ep && experts % ep == 0,
               "expert parallelism over {} ranks needs the EP communicator and experts ({}) divisible by it", ep,
               experts);
  if (par.moe_dispatcher == MoeDispatcher::AllGather) return std::make_unique<AllGatherDispatcher>(ops, *par.ep, experts);
  return std::make_unique<AllToAllDispatcher>(ops, *par.ep, experts);
}

}  // namespace tripod
