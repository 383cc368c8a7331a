// ProfiledOps: wraps a backend and adds up the wall time of each op family (synchronising the
// device around every op, so shares are exact but the run is slower). For benchmarks and
// `--profile`; training never pays for it otherwise.
#pragma once

#include <chrono>
#include <map>
#include <string>

#include "kernels/op.h"

namespace tripod {

class ProfiledOps final : public Ops {
 public:
  explicit ProfiledOps(Ops& inner) : in_(inner) {}

  // Seconds per op family: "gemm", "attention" (with rope), "layernorm" (with rmsnorm), "gelu"
  // (with swiglu), "xent", "embedding",
  // "optimizer", "elementwise", "memory", "reduction".
  const std::map<std::string, double>& seconds() const { return seconds_; }
  void reset() { seconds_.clear(); }

  Device device() const override { return in_.device(); }
  DType compute_dtype() const override { return in_.compute_dtype(); }
  Allocator& allocator() override { return in_.allocator(); }
  Allocator& host_allocator() override { return in_.host_allocator(); }
  double peak_flops() override { return in_.peak_flops(); }
  void synchronize() override { in_.synchronize(); }
  bool keeps_attention_probs() const override { return in_.keeps_attention_probs(); }

  void fill(Tensor& t, float v) override { time("memory", [&] { in_.fill(t, v); }); }
  void copy(const Tensor& s, Tensor& d) override { time("memory", [&] { in_.copy(s, d); }); }
  void add(const Tensor& a, const Tensor& b, Tensor& o) override { time("elementwise", [&] { in_.add(a, b, o); }); }
  void accumulate(Tensor& d, const Tensor& s) override { time("elementwise", [&] { in_.accumulate(d, s); }); }
  void scale(Tensor& t, float s) override { time("elementwise", [&] { in_.scale(t, s); }); }
  double sum_squares(const Tensor& t, std::span<const FlatRange> r) override {
    double out = 0;
    time("reduction", [&] { out = in_.sum_squares(t, r); });
    return out;
  }
  double sum(const Tensor& t) override {
    double out = 0;
    time("reduction", [&] { out = in_.sum(t); });
    return out;
  }
  void embedding_forward(const Tensor& tok, const Tensor& wte, int64_t vs, const Tensor& wpe, int64_t T,
                         Tensor& out) override {
    time("embedding", [&] { in_.embedding_forward(tok, wte, vs, wpe, T, out); });
  }
  void embedding_backward(const Tensor& tok, const Tensor& d, int64_t vs, Tensor& dwte, Tensor& dwpe,
                          int64_t T) override {
    time("embedding", [&] { in_.embedding_backward(tok, d, vs, dwte, dwpe, T); });
  }
  void layernorm_forward(const Tensor& x, const Tensor& w, const Tensor& b, float eps, Tensor& y, Tensor& m,
                         Tensor& r) override {
    time("layernorm", [&] { in_.layernorm_forward(x, w, b, eps, y, m, r); });
  }
  void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& m, const Tensor& r,
                          Tensor& dx, Tensor& dw, Tensor& db) override {
    time("layernorm", [&] { in_.layernorm_backward(dy, x, w, m, r, dx, dw, db); });
  }
  void rmsnorm_forward(const Tensor& x, const Tensor& w, float eps, Tensor& y, Tensor& r) override {
    time("layernorm", [&] { in_.rmsnorm_forward(x, w, eps, y, r); });
  }
  void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& r, Tensor& dx,
                        Tensor& dw) override {
    time("layernorm", [&] { in_.rmsnorm_backward(dy, x, w, r, dx, dw); });
  }
  void rope(Tensor& x, int64_t rot_heads, int64_t T, int64_t pos0, double theta, bool inverse) override {
    time("attention", [&] { in_.rope(x, rot_heads, T, pos0, theta, inverse); });
  }
  void swiglu_forward(const Tensor& gu, Tensor& y) override { time("gelu", [&] { in_.swiglu_forward(gu, y); }); }
  void swiglu_backward(const Tensor& gu, const Tensor& dy, Tensor& dgu) override {
    time("gelu", [&] { in_.swiglu_backward(gu, dy, dgu); });
  }
  void linear_forward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y) override {
    time("gemm", [&] { in_.linear_forward(x, w, b, y); });
  }
  void linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor& dx, Tensor& dw,
                       Tensor& db) override {
    time("gemm", [&] { in_.linear_backward(dy, x, w, dx, dw, db); });
  }
  // linear_gelu_forward is not overridden: the base class runs it as linear_forward and
  // gelu_forward, each timed in its own family.
  void gelu_forward(const Tensor& x, Tensor& y) override { time("gelu", [&] { in_.gelu_forward(x, y); }); }
  void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) override {
    time("gelu", [&] { in_.gelu_backward(x, dy, dx); });
  }
  void attention_forward(const Tensor& qkv, Tensor& out, Tensor& lse, Tensor& probs) override {
    time("attention", [&] { in_.attention_forward(qkv, out, lse, probs); });
  }
  void attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                          const Tensor& probs, Tensor& dqkv) override {
    time("attention", [&] { in_.attention_backward(dout, qkv, out, lse, probs, dqkv); });
  }
  void attention_decode(const Tensor& qkv, Tensor& k, Tensor& v, int64_t pos, Tensor& out) override {
    time("attention", [&] { in_.attention_decode(qkv, k, v, pos, out); });
  }
  void xent_stats(const Tensor& l, const Tensor& t, int64_t vs, int64_t valid, Tensor& s) override {
    time("xent", [&] { in_.xent_stats(l, t, vs, valid, s); });
  }
  void xent_combine(const Tensor& p, Tensor& lse, Tensor& loss) override {
    time("xent", [&] { in_.xent_combine(p, lse, loss); });
  }
  void xent_backward(Tensor& l, const Tensor& t, int64_t vs, int64_t valid, const Tensor& lse, float s) override {
    time("xent", [&] { in_.xent_backward(l, t, vs, valid, lse, s); });
  }
  void adamw(Tensor& m, const Tensor& g, Tensor& a, Tensor& v, std::span<const FlatRange> r, const AdamWHyper& h,
             Tensor& c) override {
    time("optimizer", [&] { in_.adamw(m, g, a, v, r, h, c); });
  }

 private:
  template <class F> void time(const char* family, F&& f) {
    in_.synchronize();
    auto t0 = std::chrono::steady_clock::now();
    f();
    in_.synchronize();
    seconds_[family] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  Ops& in_;
  std::map<std::string, double> seconds_;
};

}  // namespace tripod
