// Every CPU op against a double-precision reference: forwards directly, backwards against
// central finite differences of the reference forward.
#include <algorithm>
#include <cstring>
#include <functional>
#include <numeric>

#include "kernels/op.h"
#include "test_util.h"

namespace tripod {
namespace {

using test::host_tensor;
using test::random_tensor;
using test::to_double;
using Vec = std::vector<double>;

// d/dx of f at x by central differences (in double, so h can be small).
Vec numeric_grad(const std::function<double(const Vec&)>& f, Vec x, double h = 1e-6) {
  Vec g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    double keep = x[i];
    x[i] = keep + h;
    double fp = f(x);
    x[i] = keep - h;
    double fm = f(x);
    x[i] = keep;
    g[i] = (fp - fm) / (2 * h);
  }
  return g;
}

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

class CpuKernels : public ::testing::Test {
 protected:
  std::unique_ptr<Ops> ops = make_ops(Device::CPU);
};

// ---- LayerNorm --------------------------------------------------------------------------------
Vec ref_layernorm(const Vec& x, const Vec& w, const Vec& b, int64_t N, int64_t C) {
  Vec y(N * C);
  for (int64_t n = 0; n < N; ++n) {
    double m = 0, v = 0;
    for (int64_t c = 0; c < C; ++c) m += x[n * C + c];
    m /= C;
    for (int64_t c = 0; c < C; ++c) v += (x[n * C + c] - m) * (x[n * C + c] - m);
    v /= C;
    double r = 1.0 / std::sqrt(v + 1e-5);
    for (int64_t c = 0; c < C; ++c) y[n * C + c] = (x[n * C + c] - m) * r * w[c] + b[c];
  }
  return y;
}

TEST_F(CpuKernels, LayerNormForwardBackward) {
  const int64_t N = 5, C = 7;
  Tensor x = random_tensor({N, C}, 1), w = random_tensor({C}, 2), b = random_tensor({C}, 3);
  Tensor y = host_tensor({N, C}), mean = host_tensor({N}), rstd = host_tensor({N});
  ops->layernorm_forward(x, w, b, 1e-5f, y, mean, rstd);
  Vec X = to_double(x), W = to_double(w), Bv = to_double(b);
  EXPECT_CLOSE(y, ref_layernorm(X, W, Bv, N, C), 1e-5, 1e-5);

  Tensor dy = random_tensor({N, C}, 4);
  Vec G = to_double(dy);
  // Outputs accumulate: start them from known values.
  Tensor dx = random_tensor({N, C}, 5), dw = random_tensor({C}, 6), db = random_tensor({C}, 7);
  Vec dx0 = to_double(dx), dw0 = to_double(dw), db0 = to_double(db);
  ops->layernorm_backward(dy, x, w, mean, rstd, dx, dw, db);
  Vec gx = numeric_grad([&](const Vec& v) { return dot(G, ref_layernorm(v, W, Bv, N, C)); }, X);
  Vec gw = numeric_grad([&](const Vec& v) { return dot(G, ref_layernorm(X, v, Bv, N, C)); }, W);
  Vec gb = numeric_grad([&](const Vec& v) { return dot(G, ref_layernorm(X, W, v, N, C)); }, Bv);
  for (size_t i = 0; i < gx.size(); ++i) gx[i] += dx0[i];
  for (size_t i = 0; i < gw.size(); ++i) gw[i] += dw0[i], gb[i] += db0[i];
  EXPECT_CLOSE(dx, gx, 1e-4, 1e-4);
  EXPECT_CLOSE(dw, gw, 1e-4, 1e-4);
  EXPECT_CLOSE(db, gb, 1e-4, 1e-4);
}

// ---- Linear ----------------------------------------------------------------------------------
Vec ref_linear(const Vec& x, const Vec& w, const Vec& b, int64_t N, int64_t I, int64_t O) {
  Vec y(N * O);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o) {
      double s = b.empty() ? 0 : b[o];
      for (int64_t i = 0; i < I; ++i) s += x[n * I + i] * w[o * I + i];
      y[n * O + o] = s;
    }
  return y;
}

TEST_F(CpuKernels, LinearForwardBackward) {
  const int64_t N = 6, I = 5, O = 4;
  Tensor x = random_tensor({N, I}, 11), w = random_tensor({O, I}, 12), b = random_tensor({O}, 13);
  Tensor y = host_tensor({N, O});
  ops->linear_forward(x, w, b, y);
  Vec X = to_double(x), W = to_double(w), Bv = to_double(b);
  EXPECT_CLOSE(y, ref_linear(X, W, Bv, N, I, O), 1e-5, 1e-5);
  Tensor y_nb = host_tensor({N, O});
  ops->linear_forward(x, w, Tensor{}, y_nb);
  EXPECT_CLOSE(y_nb, ref_linear(X, W, {}, N, I, O), 1e-5, 1e-5);

  Tensor dy = random_tensor({N, O}, 14);
  Vec G = to_double(dy);
  Tensor dx = host_tensor({N, I}), dw = random_tensor({O, I}, 15), db = random_tensor({O}, 16);
  Vec dw0 = to_double(dw), db0 = to_double(db);
  ops->linear_backward(dy, x, w, dx, dw, db);
  Vec gx = numeric_grad([&](const Vec& v) { return dot(G, ref_linear(v, W, Bv, N, I, O)); }, X);
  Vec gw = numeric_grad([&](const Vec& v) { return dot(G, ref_linear(X, v, Bv, N, I, O)); }, W);
  Vec gb = numeric_grad([&](const Vec& v) { return dot(G, ref_linear(X, W, v, N, I, O)); }, Bv);
  for (size_t i = 0; i < gw.size(); ++i) gw[i] += dw0[i];
  for (size_t i = 0; i < gb.size(); ++i) gb[i] += db0[i];
  EXPECT_CLOSE(dx, gx, 1e-4, 1e-4);
  EXPECT_CLOSE(dw, gw, 1e-4, 1e-4);
  EXPECT_CLOSE(db, gb, 1e-4, 1e-4);
}

// ---- GELU -------------------------------------------------------------------------------------
double ref_gelu(double v) { return 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))); }

TEST_F(CpuKernels, GeluForwardBackward) {
  const int64_t n = 257;
  Tensor x = random_tensor({n}, 21, 3.f);
  x.data<float>()[0] = 0.f;
  x.data<float>()[1] = 12.f;
  x.data<float>()[2] = -12.f;
  x.data<float>()[3] = 1e-4f;
  Tensor y = host_tensor({n});
  ops->gelu_forward(x, y);
  Vec X = to_double(x), ref(n), dref(n);
  for (int64_t i = 0; i < n; ++i) {
    ref[i] = ref_gelu(X[i]);
    dref[i] = (ref_gelu(X[i] + 1e-6) - ref_gelu(X[i] - 1e-6)) / 2e-6;
  }
  EXPECT_CLOSE(y, ref, 1e-6, 1e-5);
  Tensor dy = host_tensor({n});
  ops->fill(dy, 1.f);
  ops->gelu_backward(x, dy, dy);  // in place, as the MLP uses it
  EXPECT_CLOSE(dy, dref, 1e-5, 1e-4);
}

// ---- causal attention ---------------------------------------------------------------------------
// qkv (B, T, 3, H, D) -> out (B, T, H, D)
Vec ref_attention(const Vec& qkv, int64_t B, int64_t T, int64_t H, int64_t D) {
  Vec out(B * T * H * D, 0.0);
  auto at = [&](int64_t b, int64_t t, int64_t w, int64_t h, int64_t d) {
    return qkv[(((b * T + t) * 3 + w) * H + h) * D + d];
  };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> s(t + 1);
        double m = -1e300;
        for (int64_t j = 0; j <= t; ++j) {
          double v = 0;
          for (int64_t d = 0; d < D; ++d) v += at(b, t, 0, h, d) * at(b, j, 1, h, d);
          s[j] = v / std::sqrt(static_cast<double>(D));
          m = std::max(m, s[j]);
        }
        double z = 0;
        for (auto& v : s) z += (v = std::exp(v - m));
        for (int64_t d = 0; d < D; ++d) {
          double o = 0;
          for (int64_t j = 0; j <= t; ++j) o += s[j] / z * at(b, j, 2, h, d);
          out[((b * T + t) * H + h) * D + d] = o;
        }
      }
  return out;
}

TEST_F(CpuKernels, AttentionForwardBackwardSavedAndRecomputed) {
  const int64_t B = 2, T = 5, H = 3, D = 4;
  Tensor qkv = random_tensor({B, T, 3, H, D}, 31);
  Tensor out = host_tensor({B, T, H, D}), lse = host_tensor({B, H, T}), probs = host_tensor({B, H, T, T});
  ops->attention_forward(qkv, out, lse, probs);
  Vec Q = to_double(qkv);
  EXPECT_CLOSE(out, ref_attention(Q, B, T, H, D), 1e-5, 1e-5);
  // Without saved probabilities the forward gives the same bits.
  Tensor out2 = host_tensor({B, T, H, D}), lse2 = host_tensor({B, H, T});
  ops->attention_forward(qkv, out2, lse2, *std::make_unique<Tensor>());
  EXPECT_EQ(0, std::memcmp(out.raw(), out2.raw(), out.nbytes()));
  EXPECT_EQ(0, std::memcmp(lse.raw(), lse2.raw(), lse.nbytes()));

  Tensor dout = random_tensor({B, T, H, D}, 32);
  Vec G = to_double(dout);
  Tensor dqkv = host_tensor({B, T, 3, H, D}), dqkv2 = host_tensor({B, T, 3, H, D});
  ops->attention_backward(dout, qkv, out, lse, probs, dqkv);
  ops->attention_backward(dout, qkv, out, lse, Tensor{}, dqkv2);
  Vec g = numeric_grad([&](const Vec& v) { return dot(G, ref_attention(v, B, T, H, D)); }, Q);
  EXPECT_CLOSE(dqkv, g, 1e-4, 1e-4);
  // Selective recomputation is exact: the same gradient bits as with saved probabilities.
  EXPECT_EQ(0, std::memcmp(dqkv.raw(), dqkv2.raw(), dqkv.nbytes()));
}

// Attention against a KV cache: a prefill of 3 tokens, then one token at a time, gives each
// token the causal attention of the whole sequence; the caches hold exactly the keys and values
// at their positions and nothing beyond.
TEST_F(CpuKernels, AttentionDecodeMatchesCausalAttention) {
  const int64_t B = 2, T = 7, H = 3, D = 5, Tmax = 9;
  Tensor qkv = random_tensor({B, T, 3, H, D}, 41);
  const Vec Q = to_double(qkv);
  Tensor k_cache = host_tensor({B, H, Tmax, D}), v_cache = host_tensor({B, H, Tmax, D});
  const float sentinel = 12345.f;
  ops->fill(k_cache, sentinel);
  ops->fill(v_cache, sentinel);
  Vec got(B * T * H * D);
  // Tokens [t0, t0 + n) of every sequence as one (B, n, 3, H, D) tensor.
  for (auto [t0, n] : std::vector<std::pair<int64_t, int64_t>>{{0, 3}, {3, 1}, {4, 1}, {5, 1}, {6, 1}}) {
    Tensor part = host_tensor({B, n, 3, H, D}), out = host_tensor({B, n, H, D});
    for (int64_t b = 0; b < B; ++b)
      std::memcpy(part.data<float>() + b * n * 3 * H * D, qkv.data<float>() + (b * T + t0) * 3 * H * D,
                  n * 3 * H * D * sizeof(float));
    ops->attention_decode(part, k_cache, v_cache, t0, out);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < n * H * D; ++i) got[(b * T + t0) * H * D + i] = out.data<float>()[b * n * H * D + i];
  }
  Tensor all = host_tensor({B, T, H, D});
  for (int64_t i = 0; i < all.numel(); ++i) all.data<float>()[i] = static_cast<float>(got[i]);
  EXPECT_CLOSE(all, ref_attention(Q, B, T, H, D), 1e-5, 1e-5);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t p = 0; p < Tmax; ++p)
        for (int64_t d = 0; d < D; ++d) {
          const int64_t c = ((b * H + h) * Tmax + p) * D + d;
          const float k = p < T ? qkv.data<float>()[(((b * T + p) * 3 + 1) * H + h) * D + d] : sentinel;
          const float v = p < T ? qkv.data<float>()[(((b * T + p) * 3 + 2) * H + h) * D + d] : sentinel;
          ASSERT_EQ(k_cache.data<float>()[c], k) << "k_cache b=" << b << " h=" << h << " p=" << p;
          ASSERT_EQ(v_cache.data<float>()[c], v) << "v_cache b=" << b << " h=" << h << " p=" << p;
        }
  Tensor one = host_tensor({B, 1, 3, H, D}), out = host_tensor({B, 1, H, D});
  EXPECT_THROW(ops->attention_decode(one, k_cache, v_cache, Tmax, out), Error) << "a position beyond the cache";
}

// ---- grouped-query attention -------------------------------------------------------------------
// qkv (B, T, H + 2 Hkv, D) -> out (B, T, H, D); query head h reads key/value head h / (H / Hkv).
Vec ref_gqa(const Vec& qkv, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D) {
  Vec out(B * T * H * D, 0.0);
  const int64_t W = H + 2 * Hkv;
  auto at = [&](int64_t b, int64_t t, int64_t head, int64_t d) { return qkv[((b * T + t) * W + head) * D + d]; };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t) {
        const int64_t kh = H + h / (H / Hkv), vh = H + Hkv + h / (H / Hkv);
        std::vector<double> s(t + 1);
        double m = -1e300;
        for (int64_t j = 0; j <= t; ++j) {
          double v = 0;
          for (int64_t d = 0; d < D; ++d) v += at(b, t, h, d) * at(b, j, kh, d);
          s[j] = v / std::sqrt(static_cast<double>(D));
          m = std::max(m, s[j]);
        }
        double z = 0;
        for (auto& v : s) z += (v = std::exp(v - m));
        for (int64_t d = 0; d < D; ++d) {
          double o = 0;
          for (int64_t j = 0; j <= t; ++j) o += s[j] / z * at(b, j, vh, d);
          out[((b * T + t) * H + h) * D + d] = o;
        }
      }
  return out;
}

TEST_F(CpuKernels, GroupedQueryAttentionForwardBackwardAndDecode) {
  const int64_t B = 2, T = 5, H = 4, D = 4;
  for (int64_t Hkv : {1, 2}) {  // multi-query and two groups of two
    SCOPED_TRACE(Hkv);
    const int64_t W = H + 2 * Hkv;
    Tensor qkv = random_tensor({B, T, W, D}, 81 + Hkv);
    Tensor out = host_tensor({B, T, H, D}), lse = host_tensor({B, H, T}), probs = host_tensor({B, H, T, T});
    ops->attention_forward(qkv, out, lse, probs);
    Vec Q = to_double(qkv);
    EXPECT_CLOSE(out, ref_gqa(Q, B, T, H, Hkv, D), 1e-5, 1e-5);
    Tensor dout = random_tensor({B, T, H, D}, 85);
    Vec G = to_double(dout);
    Tensor dqkv = host_tensor({B, T, W, D}), dqkv2 = host_tensor({B, T, W, D});
    ops->attention_backward(dout, qkv, out, lse, probs, dqkv);
    ops->attention_backward(dout, qkv, out, lse, Tensor{}, dqkv2);
    Vec g = numeric_grad([&](const Vec& v) { return dot(G, ref_gqa(v, B, T, H, Hkv, D)); }, Q);
    EXPECT_CLOSE(dqkv, g, 1e-4, 1e-4);
    EXPECT_EQ(0, std::memcmp(dqkv.raw(), dqkv2.raw(), dqkv.nbytes()));
    // Decoding: a prefill of 2 tokens, then one at a time, against (B, Hkv, Tmax, D) caches.
    const int64_t Tmax = 6;
    Tensor kc = host_tensor({B, Hkv, Tmax, D}), vc = host_tensor({B, Hkv, Tmax, D});
    Vec got(B * T * H * D);
    for (auto [t0, n] : std::vector<std::pair<int64_t, int64_t>>{{0, 2}, {2, 1}, {3, 1}, {4, 1}}) {
      Tensor part = host_tensor({B, n, W, D}), o = host_tensor({B, n, H, D});
      for (int64_t b = 0; b < B; ++b)
        std::memcpy(part.data<float>() + b * n * W * D, qkv.data<float>() + (b * T + t0) * W * D,
                    n * W * D * sizeof(float));
      ops->attention_decode(part, kc, vc, t0, o);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < n * H * D; ++i) got[(b * T + t0) * H * D + i] = o.data<float>()[b * n * H * D + i];
    }
    Tensor all = host_tensor({B, T, H, D});
    for (int64_t i = 0; i < all.numel(); ++i) all.data<float>()[i] = static_cast<float>(got[i]);
    EXPECT_CLOSE(all, ref_gqa(Q, B, T, H, Hkv, D), 1e-5, 1e-5);
  }
  Tensor bad = random_tensor({1, 2, 7, 4}, 1), out = host_tensor({1, 2, 4, 4}), lse = host_tensor({1, 4, 2});
  EXPECT_THROW(ops->attention_forward(bad, out, lse, *std::make_unique<Tensor>()), Error)
      << "4 query heads and 3 more heads are not 2 Hkv";
}

// ---- RMSNorm ----------------------------------------------------------------------------------
Vec ref_rmsnorm(const Vec& x, const Vec& w, int64_t N, int64_t C, double eps) {
  Vec y(N * C);
  for (int64_t n = 0; n < N; ++n) {
    double ss = 0;
    for (int64_t c = 0; c < C; ++c) ss += x[n * C + c] * x[n * C + c];
    const double r = 1.0 / std::sqrt(ss / C + eps);
    for (int64_t c = 0; c < C; ++c) y[n * C + c] = x[n * C + c] * r * w[c];
  }
  return y;
}

TEST_F(CpuKernels, RmsNormForwardBackward) {
  const int64_t N = 5, C = 70;  // more than one 64-column block of the weight gradient
  const double eps = 1e-6;
  Tensor x = random_tensor({N, C}, 91), w = random_tensor({C}, 92);
  Tensor y = host_tensor({N, C}), rstd = host_tensor({N});
  ops->rmsnorm_forward(x, w, static_cast<float>(eps), y, rstd);
  Vec X = to_double(x), W = to_double(w);
  EXPECT_CLOSE(y, ref_rmsnorm(X, W, N, C, eps), 1e-5, 1e-5);
  Tensor dy = random_tensor({N, C}, 93);
  Vec G = to_double(dy);
  Tensor dx = random_tensor({N, C}, 94), dw = random_tensor({C}, 95);  // both accumulate
  Vec dx0 = to_double(dx), dw0 = to_double(dw);
  ops->rmsnorm_backward(dy, x, w, rstd, dx, dw);
  Vec gx = numeric_grad([&](const Vec& v) { return dot(G, ref_rmsnorm(v, W, N, C, eps)); }, X);
  Vec gw = numeric_grad([&](const Vec& v) { return dot(G, ref_rmsnorm(X, v, N, C, eps)); }, W);
  for (size_t i = 0; i < gx.size(); ++i) gx[i] += dx0[i];
  for (size_t i = 0; i < gw.size(); ++i) gw[i] += dw0[i];
  EXPECT_CLOSE(dx, gx, 1e-4, 1e-4);
  EXPECT_CLOSE(dw, gw, 1e-4, 1e-4);
}

// ---- per-head q/k RMSNorm ------------------------------------------------------------------------
// Heads [0, hq) of every row normalised with w row 0, [hq, hq + hk) with row 1; the rest untouched.
Vec ref_qk_norm(const Vec& x, const Vec& w, int64_t N, int64_t H, int64_t D, int64_t hq, int64_t hk, double eps) {
  Vec y = x;
  for (int64_t t = 0; t < N; ++t)
    for (int64_t h = 0; h < hq + hk; ++h) {
      const double* xr = x.data() + (t * H + h) * D;
      double ss = 0;
      for (int64_t d = 0; d < D; ++d) ss += xr[d] * xr[d];
      const double r = 1.0 / std::sqrt(ss / D + eps);
      for (int64_t d = 0; d < D; ++d) y[(t * H + h) * D + d] = xr[d] * r * w[(h < hq ? 0 : D) + d];
    }
  return y;
}

TEST_F(CpuKernels, QkNormForwardBackward) {
  const int64_t N = 3, hq = 2, hk = 1, H = hq + 2 * hk, D = 6;
  const double eps = 1e-6;
  Tensor qkv = random_tensor({N, H, D}, 300), w = random_tensor({2, D}, 301);
  Vec X = to_double(qkv), W = to_double(w);
  Tensor saved = host_tensor({N, hq + hk, D}), rstd = host_tensor({N, hq + hk});
  ops->qk_norm_forward(qkv, hq, hk, w, static_cast<float>(eps), saved, rstd);
  EXPECT_CLOSE(qkv, ref_qk_norm(X, W, N, H, D, hq, hk, eps), 1e-5, 1e-5);  // the value heads untouched too
  Tensor dqkv = random_tensor({N, H, D}, 302), dw = random_tensor({2, D}, 303);  // dw accumulates
  Vec G = to_double(dqkv), dw0 = to_double(dw);
  ops->qk_norm_backward(dqkv, hq, saved, w, rstd, dw);
  Vec gx = numeric_grad([&](const Vec& v) { return dot(G, ref_qk_norm(v, W, N, H, D, hq, hk, eps)); }, X);
  Vec gw = numeric_grad([&](const Vec& v) { return dot(G, ref_qk_norm(X, v, N, H, D, hq, hk, eps)); }, W);
  for (int64_t t = 0; t < N; ++t)  // value heads: the op leaves their gradient as it was
    for (int64_t i = (hq + hk) * D; i < H * D; ++i) gx[t * H * D + i] = G[t * H * D + i];
  for (size_t i = 0; i < gw.size(); ++i) gw[i] += dw0[i];
  EXPECT_CLOSE(dqkv, gx, 1e-4, 1e-4);
  EXPECT_CLOSE(dw, gw, 1e-4, 1e-4);
}

// ---- mixture of experts ----------------------------------------------------------------------------
bool same_bits(const Tensor& a, const Tensor& b);
Tensor clone(const Tensor& t);

// Each group's rows through its own weight: exactly the linear ops on those rows.
TEST_F(CpuKernels, GroupedLinearIsTheLinearOpsOverEachGroupsRows) {
  const int64_t I = 5, O = 3;
  const std::vector<int64_t> offsets = {0, 4, 4, 5, 9};  // an empty group, a one-row group
  const int64_t R = offsets.back();
  std::vector<Tensor> w, dw;
  for (int g = 0; g < 4; ++g) {
    w.push_back(random_tensor({O, I}, 310 + g));
    dw.push_back(random_tensor({O, I}, 320 + g));
  }
  Tensor x = random_tensor({R, I}, 330), dy = random_tensor({R, O}, 331);
  Tensor y = host_tensor({R, O}), dx = host_tensor({R, I});
  std::vector<Tensor> dw_want;
  for (const Tensor& t : dw) dw_want.push_back(clone(t));
  ops->grouped_linear_forward(x, w, offsets, y);
  ops->grouped_linear_backward_input(dy, w, offsets, dx);
  ops->grouped_linear_backward_weight(dy, x, offsets, dw);
  for (int g = 0; g < 4; ++g) {
    const int64_t r0 = offsets[g], r1 = offsets[g + 1];
    if (r0 == r1) {
      EXPECT_TRUE(same_bits(dw[g], dw_want[g])) << "an empty group's gradient is untouched";
      continue;
    }
    Tensor yg = host_tensor({r1 - r0, O}), dxg = host_tensor({r1 - r0, I}), none;
    ops->linear_forward(x.slice(r0, r1), w[g], none, yg);
    ops->linear_backward_input(dy.slice(r0, r1), w[g], dxg);
    ops->linear_backward_weight(dy.slice(r0, r1), x.slice(r0, r1), dw_want[g], none);
    EXPECT_TRUE(same_bits(y.slice(r0, r1), yg)) << g;
    EXPECT_TRUE(same_bits(dx.slice(r0, r1), dxg)) << g;
    EXPECT_TRUE(same_bits(dw[g], dw_want[g])) << g;
  }
}

// The router's objective in double for fixed choices: sum_j dw_j w_j + sum_e aux_e P_e + zs lse^2.
double ref_router_objective(const Vec& l, const std::vector<int32_t>& idx, const Vec& dw, const Vec& aux, double zs,
                            bool sigmoid, bool normalize) {
  const int64_t E = static_cast<int64_t>(l.size()), k = static_cast<int64_t>(idx.size());
  double m = l[0];
  for (double v : l) m = std::max(m, v);
  double z = 0;
  for (double v : l) z += std::exp(v - m);
  const double lse = m + std::log(z);
  Vec s(E);
  double ssum = 0;
  for (int64_t e = 0; e < E; ++e) ssum += s[e] = sigmoid ? 1 / (1 + std::exp(-l[e])) : std::exp(l[e] - lse);
  double chosen = 0, out = 0;
  for (int64_t j = 0; j < k; ++j) chosen += s[idx[j]];
  for (int64_t j = 0; j < k; ++j) out += dw[j] * s[idx[j]] / (normalize ? chosen : 1.0);
  for (int64_t e = 0; e < E; ++e) out += aux[e] * (sigmoid ? s[e] / ssum : s[e]);
  return out + zs * lse * lse;
}

TEST_F(CpuKernels, MoeRouteChoosesTopKByBiasedScoresAndItsBackwardMatchesFiniteDifferences) {
  const int64_t N = 6, E = 5, k = 2;
  for (bool sigmoid : {false, true})
    for (bool normalize : {false, true}) {
      SCOPED_TRACE(fmt::format("sigmoid {} normalize {}", sigmoid, normalize));
      Tensor logits = random_tensor({N, E}, 340, 2.f), bias = random_tensor({E}, 341, 0.3f);
      Tensor idx = host_tensor({N, k}, DType::I32), weights = host_tensor({N, k}), stats = host_tensor({E + 1});
      ops->moe_route(logits, bias, sigmoid, normalize, idx, weights, stats);
      const Vec L = to_double(logits), Bv = to_double(bias);
      Vec psum(E + 1, 0.0);
      for (int64_t t = 0; t < N; ++t) {
        const Vec l(L.begin() + t * E, L.begin() + (t + 1) * E);
        double m = *std::max_element(l.begin(), l.end()), z = 0, ssum = 0;
        for (double v : l) z += std::exp(v - m);
        const double lse = m + std::log(z);
        Vec s(E);
        for (int64_t e = 0; e < E; ++e) ssum += s[e] = sigmoid ? 1 / (1 + std::exp(-l[e])) : std::exp(l[e] - lse);
        // The choice: by s + bias, descending; the weights by s alone.
        std::vector<int64_t> order(E);
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return s[a] + Bv[a] > s[b] + Bv[b]; });
        double chosen = 0;
        for (int64_t j = 0; j < k; ++j) chosen += s[order[j]];
        for (int64_t j = 0; j < k; ++j) {
          EXPECT_EQ(idx.data<int32_t>()[t * k + j], order[j]) << "token " << t;
          EXPECT_NEAR(weights.data<float>()[t * k + j], s[order[j]] / (normalize ? chosen : 1.0), 1e-6);
        }
        for (int64_t e = 0; e < E; ++e) psum[e] += sigmoid ? s[e] / ssum : s[e];
        psum[E] += lse * lse;
      }
      EXPECT_CLOSE(stats, psum, 1e-5, 1e-5);
      // Backward for those choices.
      Tensor dweights = random_tensor({N, k}, 342), aux = random_tensor({E}, 343), dlogits = host_tensor({N, E});
      const float zs = 0.03f;
      ops->moe_route_backward(logits, idx, dweights, aux, zs, sigmoid, normalize, dlogits);
      const Vec DW = to_double(dweights), A = to_double(aux);
      Vec want;
      for (int64_t t = 0; t < N; ++t) {
        const std::vector<int32_t> it(idx.data<int32_t>() + t * k, idx.data<int32_t>() + (t + 1) * k);
        const Vec dw(DW.begin() + t * k, DW.begin() + (t + 1) * k);
        const Vec g = numeric_grad(
            [&](const Vec& l) { return ref_router_objective(l, it, dw, A, zs, sigmoid, normalize); },
            Vec(L.begin() + t * E, L.begin() + (t + 1) * E));
        want.insert(want.end(), g.begin(), g.end());
      }
      EXPECT_CLOSE(dlogits, want, 1e-5, 1e-4);
    }
}

// Pairs sorted by expert, in token order within each; the capacity keeps the first ones.
TEST_F(CpuKernels, MoeDispatchOrdersPairsByExpertAndDropsPastCapacity) {
  const int64_t E = 3, k = 2;
  Tensor idx = host_tensor({5, k}, DType::I32);
  const int32_t chosen[] = {0, 1, 1, 2, 0, 1, 1, 0, 1, 2};  // pairs 0..9; expert 1 chosen 4 times
  std::copy(chosen, chosen + 10, idx.data<int32_t>());
  for (int64_t capacity : {int64_t{-1}, int64_t{2}}) {
    Tensor routed = host_tensor({E}, DType::I32), row_of = host_tensor({10}, DType::I32);
    Tensor slot_of = host_tensor({10}, DType::I32);
    ops->moe_dispatch(idx, E, capacity, routed, row_of, slot_of);
    EXPECT_EQ(std::vector<int32_t>(routed.data<int32_t>(), routed.data<int32_t>() + E), (std::vector<int32_t>{3, 5, 2}));
    // dropless: expert 0 rows 0-2 (pairs 0, 4, 7), expert 1 rows 3-7 (pairs 1, 2, 5, 6, 8), expert 2 rows 8-9.
    // capacity 2: expert 0 rows 0-1 (pairs 0, 4), expert 1 rows 2-3 (pairs 1, 2), expert 2 rows 4-5
    // (pairs 3, 9); pairs 7 (expert 0) and 5, 6, 8 (expert 1) dropped.
    const std::vector<int32_t> want = capacity < 0 ? std::vector<int32_t>{0, 3, 4, 8, 1, 5, 6, 2, 7, 9}
                                                   : std::vector<int32_t>{0, 2, 3, 4, 1, -1, -1, -1, -1, 5};
    EXPECT_EQ(std::vector<int32_t>(row_of.data<int32_t>(), row_of.data<int32_t>() + 10), want);
    for (int p = 0; p < 10; ++p) {
      if (want[p] >= 0) {
        EXPECT_EQ(slot_of.data<int32_t>()[want[p]], p);
      }
    }
  }
}

// Permute gathers (and weighs) token rows; unpermute sums them back; the combine's backward is
// the weights' gradient and the weighted output gradient.
TEST_F(CpuKernels, MoePermutationsAndCombineBackward) {
  const int64_t N = 4, k = 2, C = 3, F = 5, E = 3;
  Tensor idx = host_tensor({N, k}, DType::I32);
  const int32_t chosen[] = {2, 0, 0, 1, 1, 2, 0, 2};
  std::copy(chosen, chosen + N * k, idx.data<int32_t>());
  Tensor routed = host_tensor({E}, DType::I32), row_of = host_tensor({N * k}, DType::I32);
  Tensor slot_of = host_tensor({N * k}, DType::I32);
  ops->moe_dispatch(idx, E, /*capacity=*/-1, routed, row_of, slot_of);
  Tensor x = random_tensor({N, C}, 350), w = random_tensor({N, k}, 351);
  Tensor xp = host_tensor({N * k, C}), xw = host_tensor({N * k, C});
  ops->moe_permute(x, slot_of, k, Tensor{}, xp);
  ops->moe_permute(x, slot_of, k, w, xw);
  for (int64_t r = 0; r < N * k; ++r) {
    const int32_t p = slot_of.data<int32_t>()[r];
    for (int64_t c = 0; c < C; ++c) {
      EXPECT_EQ(xp.data<float>()[r * C + c], x.data<float>()[(p / k) * C + c]);
      EXPECT_FLOAT_EQ(xw.data<float>()[r * C + c], x.data<float>()[(p / k) * C + c] * w.data<float>()[p]);
    }
  }
  Tensor yp = random_tensor({N * k, C}, 352), y = host_tensor({N, C});
  ops->moe_unpermute(yp, row_of, w, y);
  for (int64_t t = 0; t < N; ++t)
    for (int64_t c = 0; c < C; ++c) {
      double want = 0;
      for (int64_t j = 0; j < k; ++j)
        want += w.data<float>()[t * k + j] * yp.data<float>()[row_of.data<int32_t>()[t * k + j] * C + c];
      EXPECT_NEAR(y.data<float>()[t * C + c], want, 1e-6);
    }
  Tensor g = random_tensor({N * k, F}, 353), act = random_tensor({N * k, F}, 354), dweights = host_tensor({N, k});
  Tensor g0 = clone(g);
  ops->moe_combine_backward(g, act, slot_of, w, dweights);
  for (int64_t r = 0; r < N * k; ++r) {
    const int32_t p = slot_of.data<int32_t>()[r];
    double d = 0;
    for (int64_t f = 0; f < F; ++f) {
      d += static_cast<double>(act.data<float>()[r * F + f]) * g0.data<float>()[r * F + f];
      EXPECT_FLOAT_EQ(g.data<float>()[r * F + f], g0.data<float>()[r * F + f] * w.data<float>()[p]);
    }
    EXPECT_NEAR(dweights.data<float>()[p], d, 1e-5);
  }
}

// ---- the backward split into input and weight halves (zero-bubble pipelines) --------------------
bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}
Tensor clone(const Tensor& t) {
  Tensor c = host_tensor(t.shape());
  std::memcpy(c.raw(), t.raw(), t.nbytes());
  return c;
}

TEST_F(CpuKernels, BackwardHalvesGiveTheWholeBackwardsBits) {
  // Sizes past one column block of each kernel's parameter reductions (64 and 256 columns).
  const int64_t N = 9, C = 70, O = 300;
  Tensor none;
  {  // linear, with and without bias
    Tensor x = random_tensor({N, C}, 201), w = random_tensor({O, C}, 202), dy = random_tensor({N, O}, 203);
    for (bool bias : {true, false}) {
      SCOPED_TRACE(bias ? "linear with bias" : "linear");
      Tensor dx = host_tensor({N, C}), dw = random_tensor({O, C}, 204), db = bias ? random_tensor({O}, 205) : none;
      Tensor dx2 = host_tensor({N, C}), dw2 = clone(dw), db2 = bias ? clone(db) : none;
      ops->linear_backward(dy, x, w, dx, dw, db);
      ops->linear_backward_input(dy, w, dx2);
      ops->linear_backward_weight(dy, x, dw2, db2);
      EXPECT_TRUE(same_bits(dx, dx2));
      EXPECT_TRUE(same_bits(dw, dw2));
      if (bias) {
        EXPECT_TRUE(same_bits(db, db2));
      }
    }
  }
  Tensor x = random_tensor({N, C}, 211), w = random_tensor({C}, 212), b = random_tensor({C}, 213);
  Tensor dy = random_tensor({N, C}, 214), y = host_tensor({N, C}), mean = host_tensor({N}), rstd = host_tensor({N});
  {
    SCOPED_TRACE("layernorm");
    ops->layernorm_forward(x, w, b, 1e-5f, y, mean, rstd);
    Tensor dx = random_tensor({N, C}, 215), dw = random_tensor({C}, 216), db = random_tensor({C}, 217);
    Tensor dx2 = clone(dx), dw2 = clone(dw), db2 = clone(db);
    ops->layernorm_backward(dy, x, w, mean, rstd, dx, dw, db);
    Tensor dw_before = clone(dw2), dx_before = clone(dx2);
    ops->layernorm_backward(dy, x, w, mean, rstd, dx2, none, none);
    EXPECT_TRUE(same_bits(dw2, dw_before));  // the input half leaves the parameters' gradients alone
    ops->layernorm_backward(dy, x, w, mean, rstd, none, dw2, db2);
    EXPECT_TRUE(same_bits(dx, dx2));
    EXPECT_TRUE(same_bits(dw, dw2));
    EXPECT_TRUE(same_bits(db, db2));
    EXPECT_FALSE(same_bits(dx2, dx_before));
  }
  {
    SCOPED_TRACE("rmsnorm");
    ops->rmsnorm_forward(x, w, 1e-6f, y, rstd);
    Tensor dx = random_tensor({N, C}, 218), dw = random_tensor({C}, 219);
    Tensor dx2 = clone(dx), dw2 = clone(dw);
    ops->rmsnorm_backward(dy, x, w, rstd, dx, dw);
    Tensor dw_before = clone(dw2);
    ops->rmsnorm_backward(dy, x, w, rstd, dx2, none);
    EXPECT_TRUE(same_bits(dw2, dw_before));
    ops->rmsnorm_backward(dy, x, w, rstd, none, dw2);
    EXPECT_TRUE(same_bits(dx, dx2));
    EXPECT_TRUE(same_bits(dw, dw2));
  }
}

// ---- rotary embeddings ------------------------------------------------------------------------
// Hugging Face's rotate_half over rows of (N, heads, D): row n at position pos0 + n % T.
Vec ref_rope(const Vec& x, int64_t N, int64_t heads, int64_t rot, int64_t D, int64_t T, int64_t pos0, double theta) {
  Vec y = x;
  const int64_t h = D / 2;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t hd = 0; hd < rot; ++hd)
      for (int64_t i = 0; i < h; ++i) {
        const double a = static_cast<double>(pos0 + n % T) / std::pow(theta, 2.0 * i / D);
        const double x1 = x[(n * heads + hd) * D + i], x2 = x[(n * heads + hd) * D + i + h];
        y[(n * heads + hd) * D + i] = x1 * std::cos(a) - x2 * std::sin(a);
        y[(n * heads + hd) * D + i + h] = x2 * std::cos(a) + x1 * std::sin(a);
      }
  return y;
}

TEST_F(CpuKernels, RopeRotatesHalvesAtPerSequencePositionsAndInverts) {
  const int64_t B = 2, T = 4, heads = 5, rot = 3, D = 6, N = B * T;
  for (auto [pos0, theta] : std::vector<std::pair<int64_t, double>>{{0, 10000.0}, {7, 500000.0}, {3, 2.0}}) {
    SCOPED_TRACE(theta);
    Tensor x = random_tensor({N, heads, D}, 101), y = random_tensor({N, heads, D}, 101);
    ops->rope(y, rot, T, pos0, theta, false);
    Vec X = to_double(x), want = ref_rope(X, N, heads, rot, D, T, pos0, theta);
    EXPECT_CLOSE(y, want, 1e-6, 1e-5);
    // Heads past rot_heads (the values) are untouched.
    for (int64_t n = 0; n < N; ++n)
      EXPECT_EQ(0, std::memcmp(y.data<float>() + (n * heads + rot) * D, x.data<float>() + (n * heads + rot) * D,
                               (heads - rot) * D * sizeof(float)));
    // The inverse is the backward: the transpose of an orthogonal map (<R^-1 g, x> = <g, R x>).
    Tensor g = random_tensor({N, heads, D}, 102);
    Vec G = to_double(g);
    ops->rope(g, rot, T, pos0, theta, true);
    EXPECT_NEAR(dot(to_double(g), X), dot(G, want), 1e-4);
    ops->rope(y, rot, T, pos0, theta, true);
    EXPECT_CLOSE(y, X, 1e-5, 1e-5);
  }
}

// ---- SwiGLU ----------------------------------------------------------------------------------
Vec ref_swiglu(const Vec& gu, int64_t N, int64_t F) {
  Vec y(N * F);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t f = 0; f < F; ++f) {
      const double g = gu[n * 2 * F + f], u = gu[n * 2 * F + F + f];
      y[n * F + f] = g / (1 + std::exp(-g)) * u;
    }
  return y;
}

TEST_F(CpuKernels, SwiGluForwardBackward) {
  const int64_t N = 6, F = 9;
  Tensor gu = random_tensor({N, 2 * F}, 111, 3.f);
  gu.data<float>()[0] = 30.f;
  gu.data<float>()[1] = -30.f;
  Tensor y = host_tensor({N, F});
  ops->swiglu_forward(gu, y);
  Vec GU = to_double(gu);
  EXPECT_CLOSE(y, ref_swiglu(GU, N, F), 1e-6, 1e-5);
  Tensor dy = random_tensor({N, F}, 112), dgu = host_tensor({N, 2 * F});
  Vec G = to_double(dy);
  ops->swiglu_backward(gu, dy, dgu);
  EXPECT_CLOSE(dgu, numeric_grad([&](const Vec& v) { return dot(G, ref_swiglu(v, N, F)); }, GU), 1e-4, 1e-4);
}

// ---- cross-entropy, whole and vocabulary-parallel ---------------------------------------------
// Mean-free: returns per-token losses over the first `valid` columns.
Vec ref_xent(const Vec& logits, const std::vector<int32_t>& tg, int64_t N, int64_t V, int64_t valid) {
  Vec loss(N);
  for (int64_t n = 0; n < N; ++n) {
    double m = -1e300, z = 0;
    for (int64_t j = 0; j < valid; ++j) m = std::max(m, logits[n * V + j]);
    for (int64_t j = 0; j < valid; ++j) z += std::exp(logits[n * V + j] - m);
    loss[n] = m + std::log(z) - logits[n * V + tg[n]];
  }
  return loss;
}

TEST_F(CpuKernels, CrossEntropyWholeAndSharded) {
  const int64_t N = 4, V = 10, valid = 8;  // two padding columns
  Tensor logits = random_tensor({N, V}, 41, 2.f);
  Tensor targets = host_tensor({N}, DType::I32);
  int32_t tg[] = {0, 7, 3, 5};
  std::copy(tg, tg + N, targets.data<int32_t>());
  std::vector<int32_t> tgv(tg, tg + N);
  Vec L = to_double(logits);
  Vec ref = ref_xent(L, tgv, N, V, valid);

  Tensor stats = host_tensor({N, 3}), lse = host_tensor({N}), loss = host_tensor({N});
  ops->xent_stats(logits, targets, 0, valid, stats);
  ops->xent_combine(stats.view({1, N, 3}), lse, loss);
  EXPECT_CLOSE(loss, ref, 1e-5, 1e-5);

  // Two vocabulary shards of 5 columns: [0, 5) all valid, [5, 10) with 3 valid.
  Tensor parts = host_tensor({2, N, 3});
  for (int s = 0; s < 2; ++s) {
    Tensor shard = host_tensor({N, 5});
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < 5; ++j) shard.data<float>()[n * 5 + j] = logits.data<float>()[n * V + s * 5 + j];
    Tensor st = parts.slice(s, s + 1).view({N, 3});
    ops->xent_stats(shard, targets, s * 5, s == 0 ? 5 : 3, st);
  }
  Tensor lse2 = host_tensor({N}), loss2 = host_tensor({N});
  ops->xent_combine(parts, lse2, loss2);
  EXPECT_CLOSE(loss2, ref, 1e-5, 1e-5);

  // d(scale * sum loss)/d logits; padding columns get zero.
  const float scale = 0.25f;
  Tensor dl = host_tensor({N, V});
  ops->copy(logits, dl);
  ops->xent_backward(dl, targets, 0, valid, lse, scale);
  Vec g = numeric_grad(
      [&](const Vec& v) {
        Vec l = ref_xent(v, tgv, N, V, valid);
        double s = 0;
        for (double e : l) s += e;
        return scale * s;
      },
      L);
  EXPECT_CLOSE(dl, g, 1e-5, 1e-4);
}

TEST_F(CpuKernels, CrossEntropyPropagatesNaN) {
  Tensor logits = random_tensor({2, 4}, 42);
  logits.data<float>()[5] = NAN;
  Tensor targets = host_tensor({2}, DType::I32);
  targets.data<int32_t>()[0] = 1;
  targets.data<int32_t>()[1] = 2;
  Tensor stats = host_tensor({2, 3}), lse = host_tensor({2}), loss = host_tensor({2});
  ops->xent_stats(logits, targets, 0, 4, stats);
  ops->xent_combine(stats.view({1, 2, 3}), lse, loss);
  EXPECT_TRUE(std::isfinite(loss.data<float>()[0]));
  EXPECT_TRUE(std::isnan(loss.data<float>()[1]));
}

// ---- embedding -------------------------------------------------------------------------------
TEST_F(CpuKernels, EmbeddingVocabShardAndPositions) {
  const int64_t V = 6, C = 3, T = 4, N = 8;  // two sequences of 4; this shard holds rows [6, 12)
  Tensor wte = random_tensor({V, C}, 51), wpe = random_tensor({5, C}, 52);
  Tensor tokens = host_tensor({N}, DType::I32);
  int32_t tok[] = {6, 11, 0, 7, 5, 12, 9, 6};
  std::copy(tok, tok + N, tokens.data<int32_t>());
  Tensor out = host_tensor({N, C});
  ops->embedding_forward(tokens, wte, 6, wpe, T, out);
  Vec ref(N * C);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) {
      int64_t row = tok[n] - 6;
      double e = (row >= 0 && row < V) ? wte.data<float>()[row * C + c] : 0.0;
      ref[n * C + c] = e + wpe.data<float>()[(n % T) * C + c];
    }
  EXPECT_CLOSE(out, ref, 1e-6, 1e-6);

  Tensor dout = random_tensor({N, C}, 53);
  Tensor dwte = host_tensor({V, C}), dwpe = host_tensor({5, C});
  ops->fill(dwte, 1.f);
  ops->fill(dwpe, 0.f);
  ops->embedding_backward(tokens, dout, 6, dwte, dwpe, T);
  Vec gte(V * C, 1.0), gpe(5 * C, 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) {
      int64_t row = tok[n] - 6;
      if (row >= 0 && row < V) gte[row * C + c] += dout.data<float>()[n * C + c];
      gpe[(n % T) * C + c] += dout.data<float>()[n * C + c];
    }
  EXPECT_CLOSE(dwte, gte, 1e-6, 1e-6);
  EXPECT_CLOSE(dwpe, gpe, 1e-6, 1e-6);
}

// ---- AdamW -----------------------------------------------------------------------------------
TEST_F(CpuKernels, AdamWMatchesReferenceWithDecayMask) {
  const int64_t n = 10;
  Tensor p = random_tensor({n}, 61), g = random_tensor({n}, 62), m = host_tensor({n}), v = host_tensor({n});
  ops->fill(m, 0.f);
  ops->fill(v, 0.f);
  Vec P = to_double(p), G = to_double(g), M(n, 0), Vv(n, 0);
  std::vector<FlatRange> ranges = {{0, 4, true}, {4, 9, false}};  // element 9 is not updated
  AdamWHyper h{.lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .step = 1,
               .grad_scale = 0.5f};
  Tensor none;
  for (int step = 1; step <= 3; ++step) {
    h.step = step;
    ops->adamw(p, g, m, v, ranges, h, none);
    for (int64_t i = 0; i < 9; ++i) {
      double gi = G[i] * 0.5;
      M[i] = 0.9 * M[i] + 0.1 * gi;
      Vv[i] = 0.95 * Vv[i] + 0.05 * gi * gi;
      double mh = M[i] / (1 - std::pow(0.9, step)), vh = Vv[i] / (1 - std::pow(0.95, step));
      P[i] -= 0.01 * (mh / (std::sqrt(vh) + 1e-8) + (i < 4 ? 0.1 : 0.0) * P[i]);
    }
  }
  EXPECT_CLOSE(p, P, 1e-6, 1e-5);
}

// ---- elementwise and reductions ----------------------------------------------------------------
TEST_F(CpuKernels, ElementwiseAndReductions) {
  Tensor a = random_tensor({100}, 71), b = random_tensor({100}, 72), out = host_tensor({100});
  ops->add(a, b, out);
  Vec ref(100);
  for (int i = 0; i < 100; ++i) ref[i] = static_cast<double>(a.data<float>()[i]) + b.data<float>()[i];
  EXPECT_CLOSE(out, ref, 1e-6, 1e-6);
  ops->accumulate(out, a);
  for (int i = 0; i < 100; ++i) ref[i] += a.data<float>()[i];
  EXPECT_CLOSE(out, ref, 1e-6, 1e-6);
  ops->scale(out, 2.f);
  for (auto& r : ref) r *= 2;
  EXPECT_CLOSE(out, ref, 1e-6, 1e-6);
  double ss = 0, s = 0;
  for (int i = 0; i < 100; ++i) ss += ref[i] * ref[i], s += ref[i];
  std::vector<FlatRange> all = {{0, 100, false}};
  EXPECT_NEAR(ops->sum_squares(out, all), ss, 1e-4 * ss);
  EXPECT_NEAR(ops->sum(out), s, 1e-4);
  // bf16 round trip keeps 8 bits of mantissa.
  Tensor h = host_tensor({100}, DType::BF16), back = host_tensor({100});
  ops->copy(out, h);
  ops->copy(h, back);
  EXPECT_CLOSE(back, ref, 1e-30, 1.0 / 256);
}

}  // namespace
}  // namespace tripod
