// Mixture-of-experts ops on the CPU: the grouped GEMMs (one sgemm per expert over its rows), the
// router's top-k and its backward, the dispatch order, the permutations, and the per-head q/k
// RMSNorm. Reductions run in a fixed order (per row, or sequentially over rows), so results do not
// depend on the thread count.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_ops.h"

namespace tripod::cpu {

namespace {

void check_groups(std::span<const int64_t> offsets, size_t groups, int64_t rows, const char* op) {
  TRIPOD_CHECK(offsets.size() == groups + 1 && offsets.front() == 0 && offsets.back() <= rows,
               "{}: {} offsets for {} groups over {} rows", op, offsets.size(), groups, rows);
  for (size_t g = 0; g < groups; ++g) TRIPOD_CHECK(offsets[g] <= offsets[g + 1], "{}: offsets not ascending", op);
}

// One router row: scores s (softmax or sigmoid), the log-sum-exp of the logits, and the balancing
// probabilities P (softmax: s; sigmoid: s normalised to sum 1).
struct RouterRow {
  std::vector<float> s, p;
  float lse = 0, ssum = 0;
  void compute(const float* l, int64_t E, bool sigmoid) {
    s.resize(E);
    p.resize(E);
    float m = l[0];
    for (int64_t e = 1; e < E; ++e) m = std::max(m, l[e]);
    float z = 0;
    for (int64_t e = 0; e < E; ++e) z += std::exp(l[e] - m);
    lse = m + std::log(z);
    ssum = 0;
    for (int64_t e = 0; e < E; ++e) {
      s[e] = sigmoid ? 1.f / (1.f + std::exp(-l[e])) : std::exp(l[e] - lse);
      ssum += s[e];
    }
    for (int64_t e = 0; e < E; ++e) p[e] = sigmoid ? s[e] / ssum : s[e];
  }
};

}  // namespace

void CpuOps::grouped_linear_forward(const Tensor& x, std::span<const Tensor> w, std::span<const int64_t> offsets,
                                    Tensor& y) {
  ScopedTimer timer(*this, OpFamily::Gemm);
  TRIPOD_CHECK(!w.empty(), "grouped_linear_forward: no groups");
  const int64_t O = w[0].size(0), I = w[0].numel() / O;
  const int64_t R = x.numel() / I;
  check_groups(offsets, w.size(), R, "grouped_linear_forward");
  TRIPOD_CHECK(x.numel() == R * I && y.numel() >= offsets.back() * O, "grouped_linear_forward x {} w {} y {}", x.str(),
               w[0].str(), y.str());
  for (size_t g = 0; g < w.size(); ++g) {
    const int64_t r0 = offsets[g], n = offsets[g + 1] - r0;
    TRIPOD_CHECK(w[g].numel() == O * I, "grouped_linear_forward: w[{}] {} is not ({}, {})", g, w[g].str(), O, I);
    if (n == 0) continue;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, O, I, 1.f, x.data<float>() + r0 * I, I, w[g].data<float>(),
                I, 0.f, y.data<float>() + r0 * O, O);
  }
}

void CpuOps::grouped_linear_backward_input(const Tensor& dy, std::span<const Tensor> w,
                                           std::span<const int64_t> offsets, Tensor& dx) {
  ScopedTimer timer(*this, OpFamily::Gemm);
  TRIPOD_CHECK(!w.empty(), "grouped_linear_backward_input: no groups");
  const int64_t O = w[0].size(0), I = w[0].numel() / O, R = dy.numel() / O;
  check_groups(offsets, w.size(), R, "grouped_linear_backward_input");
  TRIPOD_CHECK(dx.numel() >= offsets.back() * I, "grouped_linear_backward_input dy {} dx {}", dy.str(), dx.str());
  for (size_t g = 0; g < w.size(); ++g) {
    const int64_t r0 = offsets[g], n = offsets[g + 1] - r0;
    if (n == 0) continue;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, I, O, 1.f, dy.data<float>() + r0 * O, O,
                w[g].data<float>(), I, 0.f, dx.data<float>() + r0 * I, I);
  }
}

void CpuOps::grouped_linear_backward_weight(const Tensor& dy, const Tensor& x, std::span<const int64_t> offsets,
                                            std::span<Tensor> dw) {
  ScopedTimer timer(*this, OpFamily::Gemm);
  TRIPOD_CHECK(!dw.empty(), "grouped_linear_backward_weight: no groups");
  const int64_t O = dw[0].size(0), I = dw[0].numel() / O, R = x.numel() / I;
  check_groups(offsets, dw.size(), R, "grouped_linear_backward_weight");
  TRIPOD_CHECK(dy.numel() >= offsets.back() * O, "grouped_linear_backward_weight dy {} x {}", dy.str(), x.str());
  for (size_t g = 0; g < dw.size(); ++g) {
    const int64_t r0 = offsets[g], n = offsets[g + 1] - r0;
    TRIPOD_CHECK(dw[g].numel() == O * I && dw[g].dtype() == DType::F32, "grouped_linear_backward_weight: dw[{}] {}", g,
                 dw[g].str());
    if (n == 0) continue;
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, O, I, n, 1.f, dy.data<float>() + r0 * O, O,
                x.data<float>() + r0 * I, I, 1.f, dw[g].data<float>(), I);
  }
}

void CpuOps::moe_route(const Tensor& logits, const Tensor& bias, bool sigmoid, bool normalize, Tensor& idx,
                       Tensor& weights, Tensor& stats) {
  ScopedTimer timer(*this, OpFamily::Moe);
  TRIPOD_CHECK(logits.dim() == 2 && logits.dtype() == DType::F32, "moe_route: logits {} must be (N, E) f32",
               logits.str());
  const int64_t N = logits.size(0), E = logits.size(1), k = idx.size(1);
  TRIPOD_CHECK(idx.dim() == 2 && idx.size(0) == N && k >= 1 && k <= E && weights.numel() == N * k &&
                   stats.numel() == E + 1 && (!bias.defined() || bias.numel() == E),
               "moe_route: logits {} idx {} weights {} stats {} bias {}", logits.str(), idx.str(), weights.str(),
               stats.str(), bias.str());
  const float* pl = logits.data<float>();
  const float* pb = bias.defined() ? bias.data<float>() : nullptr;
  int32_t* pi = idx.data<int32_t>();
  float* pw = weights.data<float>();
  std::vector<float> p(N * E), lse(N);
#pragma omp parallel
  {
    RouterRow row;
    std::vector<char> taken(E);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < N; ++t) {
      row.compute(pl + t * E, E, sigmoid);
      std::fill(taken.begin(), taken.end(), 0);
      float sum = 0;
      for (int64_t j = 0; j < k; ++j) {
        int64_t best = -1;
        float best_v = 0;
        for (int64_t e = 0; e < E; ++e) {
          if (taken[e]) continue;
          const float v = row.s[e] + (pb ? pb[e] : 0.f);
          if (best < 0 || v > best_v) best = e, best_v = v;
        }
        taken[best] = 1;
        pi[t * k + j] = static_cast<int32_t>(best);
        pw[t * k + j] = row.s[best];
        sum += row.s[best];
      }
      if (normalize)
        for (int64_t j = 0; j < k; ++j) pw[t * k + j] /= sum;
      std::copy(row.p.begin(), row.p.end(), p.begin() + t * E);
      lse[t] = row.lse;
    }
  }
  std::vector<double> acc(E + 1, 0.0);  // in token order
  for (int64_t t = 0; t < N; ++t) {
    for (int64_t e = 0; e < E; ++e) acc[e] += p[t * E + e];
    acc[E] += static_cast<double>(lse[t]) * lse[t];
  }
  for (int64_t e = 0; e <= E; ++e) stats.data<float>()[e] = static_cast<float>(acc[e]);
}

void CpuOps::moe_route_backward(const Tensor& logits, const Tensor& idx, const Tensor& dweights, const Tensor& aux,
                                float z_scale, bool sigmoid, bool normalize, Tensor& dlogits) {
  ScopedTimer timer(*this, OpFamily::Moe);
  const int64_t N = logits.size(0), E = logits.size(1), k = idx.size(1);
  TRIPOD_CHECK(dweights.numel() == N * k && dlogits.numel() == N * E && (!aux.defined() || aux.numel() == E),
               "moe_route_backward: logits {} idx {} dweights {} aux {} dlogits {}", logits.str(), idx.str(),
               dweights.str(), aux.str(), dlogits.str());
  const float* pl = logits.data<float>();
  const int32_t* pi = idx.data<int32_t>();
  const float* pdw = dweights.data<float>();
  const float* pa = aux.defined() ? aux.data<float>() : nullptr;
  float* pd = dlogits.data<float>();
#pragma omp parallel
  {
    RouterRow row;
    std::vector<float> ds(E);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < N; ++t) {
      row.compute(pl + t * E, E, sigmoid);
      std::fill(ds.begin(), ds.end(), 0.f);
      const int32_t* it = pi + t * k;
      const float* dw = pdw + t * k;
      // Through the weights: w_j = s_{i_j} (/ Z, Z = the k chosen scores' sum).
      if (normalize) {
        float z = 0, dot = 0;
        for (int64_t j = 0; j < k; ++j) z += row.s[it[j]];
        for (int64_t j = 0; j < k; ++j) dot += dw[j] * row.s[it[j]] / z;
        for (int64_t j = 0; j < k; ++j) ds[it[j]] += (dw[j] - dot) / z;
      } else {
        for (int64_t j = 0; j < k; ++j) ds[it[j]] += dw[j];
      }
      // Through the balancing probabilities P: softmax P = s; sigmoid P = s / sum(s).
      if (pa) {
        if (!sigmoid) {
          for (int64_t e = 0; e < E; ++e) ds[e] += pa[e];
        } else {
          float dot = 0;
          for (int64_t e = 0; e < E; ++e) dot += pa[e] * row.p[e];
          for (int64_t e = 0; e < E; ++e) ds[e] += (pa[e] - dot) / row.ssum;
        }
      }
      float* d = pd + t * E;
      const float* l = pl + t * E;
      if (!sigmoid) {
        float dot = 0;
        for (int64_t e = 0; e < E; ++e) dot += row.s[e] * ds[e];
        for (int64_t e = 0; e < E; ++e) d[e] = row.s[e] * (ds[e] - dot);
      } else {
        for (int64_t e = 0; e < E; ++e) d[e] = ds[e] * row.s[e] * (1.f - row.s[e]);
      }
      // The z-loss: d(lse^2)/dl = 2 lse softmax(l).
      if (z_scale != 0.f)
        for (int64_t e = 0; e < E; ++e) d[e] += z_scale * 2.f * row.lse * std::exp(l[e] - row.lse);
    }
  }
}

void CpuOps::moe_dispatch(const Tensor& idx, int64_t experts, int64_t capacity, Tensor& routed, Tensor& row_of,
                          Tensor& slot_of) {
  ScopedTimer timer(*this, OpFamily::Moe);
  const int64_t P = idx.numel(), E = experts;
  TRIPOD_CHECK(routed.numel() == E && row_of.numel() == P, "moe_dispatch: idx {} routed {} row_of {}", idx.str(),
               routed.str(), row_of.str());
  const int32_t* pi = idx.data<int32_t>();
  int32_t* pr = routed.data<int32_t>();
  std::fill(pr, pr + E, 0);
  for (int64_t p = 0; p < P; ++p) {
    TRIPOD_CHECK(pi[p] >= 0 && pi[p] < E, "moe_dispatch: expert {} of pair {} is not in [0, {})", pi[p], p, E);
    ++pr[pi[p]];
  }
  std::vector<int64_t> start(E), taken(E, 0);
  int64_t rows = 0;
  for (int64_t e = 0; e < E; ++e) {
    start[e] = rows;
    rows += capacity < 0 ? pr[e] : std::min<int64_t>(pr[e], capacity);
  }
  TRIPOD_CHECK(slot_of.numel() >= rows, "moe_dispatch: slot_of {} for {} kept rows", slot_of.str(), rows);
  int32_t* pro = row_of.data<int32_t>();
  int32_t* pso = slot_of.data<int32_t>();
  for (int64_t p = 0; p < P; ++p) {
    const int32_t e = pi[p];
    if (capacity >= 0 && taken[e] >= capacity) {
      pro[p] = -1;
      continue;
    }
    const int64_t r = start[e] + taken[e]++;
    pro[p] = static_cast<int32_t>(r);
    pso[r] = static_cast<int32_t>(p);
  }
}

void CpuOps::moe_permute(const Tensor& x, const Tensor& slot_of, int64_t k, const Tensor& weights, Tensor& xp) {
  ScopedTimer timer(*this, OpFamily::Moe);
  const int64_t R = xp.size(0), C = xp.numel() / std::max<int64_t>(R, 1);
  TRIPOD_CHECK(x.numel() % C == 0 && slot_of.numel() >= R, "moe_permute: x {} slot_of {} xp {}", x.str(),
               slot_of.str(), xp.str());
  const float* px = x.data<float>();
  const int32_t* ps = slot_of.data<int32_t>();
  const float* pw = weights.defined() ? weights.data<float>() : nullptr;
  float* po = xp.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < R; ++r) {
    const float* src = px + (ps[r] / k) * C;
    float* dst = po + r * C;
    if (pw) {
      const float w = pw[ps[r]];
      for (int64_t c = 0; c < C; ++c) dst[c] = src[c] * w;
    } else {
      std::memcpy(dst, src, C * sizeof(float));
    }
  }
}

void CpuOps::moe_unpermute(const Tensor& yp, const Tensor& row_of, const Tensor& weights, Tensor& y) {
  ScopedTimer timer(*this, OpFamily::Moe);
  const int64_t N = y.size(0), C = y.numel() / N, P = row_of.numel(), k = P / N;
  TRIPOD_CHECK(P == N * k && (!weights.defined() || weights.numel() == P), "moe_unpermute: yp {} row_of {} y {}",
               yp.str(), row_of.str(), y.str());
  const float* pyp = yp.data<float>();
  const int32_t* pr = row_of.data<int32_t>();
  const float* pw = weights.defined() ? weights.data<float>() : nullptr;
  float* py = y.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < N; ++t) {
    float* out = py + t * C;
    std::fill(out, out + C, 0.f);
    for (int64_t j = 0; j < k; ++j) {
      const int32_t r = pr[t * k + j];
      if (r < 0) continue;
      const float w = pw ? pw[t * k + j] : 1.f;
      const float* src = pyp + static_cast<int64_t>(r) * C;
      for (int64_t c = 0; c < C; ++c) out[c] += w * src[c];
    }
  }
}

void CpuOps::moe_combine_backward(Tensor& g, const Tensor& act, const Tensor& slot_of, const Tensor& weights,
                                  Tensor& dweights) {
  ScopedTimer timer(*this, OpFamily::Moe);
  const int64_t R = g.size(0), F = g.numel() / std::max<int64_t>(R, 1);
  TRIPOD_CHECK(act.numel() >= R * F && slot_of.numel() >= R && dweights.dtype() == DType::F32,
               "moe_combine_backward: g {} act {} slot_of {} dweights {}", g.str(), act.str(), slot_of.str(),
               dweights.str());
  float* pg = g.data<float>();
  const float* pa = act.data<float>();
  const int32_t* ps = slot_of.data<int32_t>();
  const float* pw = weights.data<float>();
  float* pd = dweights.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < R; ++r) {
    float* gr = pg + r * F;
    const float* ar = pa + r * F;
    float dot = 0;
#pragma omp simd reduction(+ : dot)
    for (int64_t f = 0; f < F; ++f) dot += ar[f] * gr[f];
    pd[ps[r]] = dot;
    const float w = pw[ps[r]];
    for (int64_t f = 0; f < F; ++f) gr[f] *= w;
  }
}

void CpuOps::qk_norm_forward(Tensor& qkv, int64_t hq, int64_t hk, const Tensor& w, float eps, Tensor& saved,
                             Tensor& rstd) {
  ScopedTimer timer(*this, OpFamily::LayerNorm);
  TRIPOD_CHECK(qkv.dim() == 3 && hq + hk <= qkv.size(1) && w.numel() == 2 * qkv.size(2), "qk_norm: qkv {} w {}",
               qkv.str(), w.str());
  const int64_t N = qkv.size(0), H = qkv.size(1), D = qkv.size(2), n = hq + hk;
  TRIPOD_CHECK(saved.numel() == N * n * D && rstd.numel() == N * n, "qk_norm: saved {} rstd {}", saved.str(),
               rstd.str());
  float* px = qkv.data<float>();
  float* ps = saved.data<float>();
  float* pr = rstd.data<float>();
  const float* pw = w.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < N; ++t)
    for (int64_t h = 0; h < n; ++h) {
      float* x = px + (t * H + h) * D;
      std::memcpy(ps + (t * n + h) * D, x, D * sizeof(float));
      float ss = 0;
#pragma omp simd reduction(+ : ss)
      for (int64_t d = 0; d < D; ++d) ss += x[d] * x[d];
      const float r = 1.0f / std::sqrt(ss / D + eps);
      const float* wr = pw + (h < hq ? 0 : D);
      for (int64_t d = 0; d < D; ++d) x[d] = x[d] * r * wr[d];
      pr[t * n + h] = r;
    }
}

void CpuOps::qk_norm_backward(Tensor& dqkv, int64_t hq, const Tensor& saved, const Tensor& w, const Tensor& rstd,
                              Tensor& dw) {
  ScopedTimer timer(*this, OpFamily::LayerNorm);
  const int64_t N = dqkv.size(0), H = dqkv.size(1), D = dqkv.size(2), n = saved.numel() / (N * D);
  TRIPOD_CHECK(n <= H && rstd.numel() == N * n && dw.numel() == 2 * D && dw.dtype() == DType::F32,
               "qk_norm_backward: dqkv {} saved {} rstd {} dw {}", dqkv.str(), saved.str(), rstd.str(), dw.str());
  float* pd = dqkv.data<float>();
  const float* px = saved.data<float>();
  const float* pr = rstd.data<float>();
  const float* pw = w.data<float>();
  // The weights' gradient first (it reads dy): per column, rows summed in order.
  float* pdw = dw.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t d = 0; d < D; ++d) {
    float sq = 0, sk = 0;
    for (int64_t t = 0; t < N; ++t)
      for (int64_t h = 0; h < n; ++h) {
        const float v = pd[(t * H + h) * D + d] * px[(t * n + h) * D + d] * pr[t * n + h];
        (h < hq ? sq : sk) += v;
      }
    pdw[d] += sq;
    pdw[D + d] += sk;
  }
  // dx = r (w dy - xhat mean(w dy xhat)), xhat = x r.
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < N; ++t)
    for (int64_t h = 0; h < n; ++h) {
      float* dy = pd + (t * H + h) * D;
      const float* x = px + (t * n + h) * D;
      const float r = pr[t * n + h];
      const float* wr = pw + (h < hq ? 0 : D);
      float dot = 0;
      for (int64_t d = 0; d < D; ++d) dot += wr[d] * dy[d] * x[d] * r;
      dot /= D;
      for (int64_t d = 0; d < D; ++d) dy[d] = (wr[d] * dy[d] - x[d] * r * dot) * r;
    }
}

}  // namespace tripod::cpu
