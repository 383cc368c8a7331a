// The CPU backend: f32 everywhere, OpenBLAS sgemm for matrices, OpenMP for the rest.
// Every kernel's result is independent of the thread count (reductions are split by output
// element or by fixed-size blocks, never by thread), so runs are bit-reproducible.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <utility>

#include "kernels/op.h"

namespace tripod::cpu {

class CpuOps final : public Ops {
 public:
  Device device() const override { return Device::CPU; }
  DType compute_dtype() const override { return DType::F32; }
  Allocator& allocator() override { return alloc_; }
  double peak_flops() override;
  DeviceInfo device_info() const override;
  void set_timing(bool on) override { timing_ = on; }
  OpTimes take_times() override { return std::exchange(times_, OpTimes{}); }
  void compute_begin() override { compute_start_ = process_cpu_seconds(); }
  void compute_end() override { compute_s_ += process_cpu_seconds() - compute_start_; }
  double take_compute_seconds() override { return std::exchange(compute_s_, 0.0); }

  void fill(Tensor& t, float value) override;
  void copy(const Tensor& src, Tensor& dst) override;
  void add(const Tensor& a, const Tensor& b, Tensor& out) override;
  void accumulate(Tensor& dst, const Tensor& src) override;
  void scale(Tensor& t, float s) override;
  double sum_squares(const Tensor& t, std::span<const FlatRange> ranges) override;
  double sum(const Tensor& t) override;
  void gather_rows(const Tensor& x, const Tensor& index, Tensor& out) override;

  void embedding_forward(const Tensor& tokens, const Tensor& wte, int64_t vocab_start, const Tensor& wpe, int64_t T,
                         Tensor& out) override;
  void embedding_backward(const Tensor& tokens, const Tensor& dout, int64_t vocab_start, Tensor& dwte, Tensor& dwpe,
                          int64_t T) override;
  void embedding_forward_positions(const Tensor& tokens, const Tensor& wte, int64_t vocab_start, const Tensor& wpe,
                                   const Tensor& positions, Tensor& out) override;
  void embedding_backward_positions(const Tensor& tokens, const Tensor& dout, int64_t vocab_start, Tensor& dwte,
                                    Tensor& dwpe, const Tensor& positions) override;

  void layernorm_forward(const Tensor& x, const Tensor& w, const Tensor& b, float eps, Tensor& y, Tensor& mean,
                         Tensor& rstd) override;
  void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                          Tensor& dx, Tensor& dw, Tensor& db) override;
  void rmsnorm_forward(const Tensor& x, const Tensor& w, float eps, Tensor& y, Tensor& rstd) override;
  void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd, Tensor& dx,
                        Tensor& dw) override;
  void rope(Tensor& x, int64_t rot_heads, int64_t T, int64_t pos0, double theta, bool inverse) override;
  void rope_positions(Tensor& x, int64_t rot_heads, const Tensor& positions, double theta, bool inverse) override;
  void swiglu_forward(const Tensor& gu, Tensor& y) override;
  void swiglu_backward(const Tensor& gu, const Tensor& dy, Tensor& dgu) override;

  void linear_forward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y) override;
  void linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor& dx, Tensor& dw,
                       Tensor& db) override;
  void linear_backward_input(const Tensor& dy, const Tensor& w, Tensor& dx) override;
  void linear_backward_weight(const Tensor& dy, const Tensor& x, Tensor& dw, Tensor& db) override;
  void bias_backward(const Tensor& dy, Tensor& db) override;

  void fp8_amax(const Tensor& x, Tensor& amax) override;
  void fp8_scale(const Tensor& amaxes, float fmt_max, int margin, Tensor& scale, Tensor& record) override;
  void fp8_quantize(const Tensor& x, const Tensor& scale, Tensor& q, Tensor& qt, Tensor& amax,
                    Tensor& saturated) override;
  void fp8_gemm(const Tensor& a, const Tensor& a_scale, const Tensor& b, const Tensor& b_scale, const Tensor& bias,
                bool accumulate, Tensor& out, Tensor& out_amax) override;

  void grouped_linear_forward(const Tensor& x, std::span<const Tensor> w, std::span<const int64_t> offsets,
                              Tensor& y) override;
  void grouped_linear_backward_input(const Tensor& dy, std::span<const Tensor> w, std::span<const int64_t> offsets,
                                     Tensor& dx) override;
  void grouped_linear_backward_weight(const Tensor& dy, const Tensor& x, std::span<const int64_t> offsets,
                                      std::span<Tensor> dw) override;
  void moe_route(const Tensor& logits, const Tensor& bias, bool sigmoid, bool normalize, Tensor& idx, Tensor& weights,
                 Tensor& stats) override;
  void moe_route_backward(const Tensor& logits, const Tensor& idx, const Tensor& dweights, const Tensor& aux,
                          float z_scale, bool sigmoid, bool normalize, Tensor& dlogits) override;
  void moe_dispatch(const Tensor& idx, int64_t experts, int64_t capacity, Tensor& routed, Tensor& row_of,
                    Tensor& slot_of) override;
  void moe_permute(const Tensor& x, const Tensor& slot_of, int64_t k, const Tensor& weights, Tensor& xp) override;
  void moe_unpermute(const Tensor& yp, const Tensor& row_of, const Tensor& weights, Tensor& y) override;
  void moe_combine_backward(Tensor& g, const Tensor& act, const Tensor& slot_of, const Tensor& weights,
                            Tensor& dweights) override;
  void qk_norm_forward(Tensor& qkv, int64_t hq, int64_t hk, const Tensor& w, float eps, Tensor& saved,
                       Tensor& rstd) override;
  void qk_norm_backward(Tensor& dqkv, int64_t hq, const Tensor& saved, const Tensor& w, const Tensor& rstd,
                        Tensor& dw) override;

  void gelu_forward(const Tensor& x, Tensor& y) override;
  void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) override;

  void attention_forward(const Tensor& qkv, Tensor& out, Tensor& lse, Tensor& probs) override;
  void attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                          const Tensor& probs, Tensor& dqkv) override;
  void attention_forward_docs(const Tensor& qkv, const DocRows& docs, Tensor& out, Tensor& lse) override;
  void attention_backward_docs(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                               const DocRows& docs, Tensor& dqkv) override;
  void attention_block_forward(const Tensor& q, const Tensor& kv, bool causal, const BlockDocs& docs, Tensor& out,
                               Tensor& lse) override;
  void attention_block_backward(const Tensor& dout, const Tensor& q, const Tensor& kv, const Tensor& out,
                                const Tensor& lse, bool causal, const BlockDocs& docs, Tensor& dq, Tensor& dkv) override;
  void attention_kv_pack(const Tensor& qkv, int64_t H, Tensor& kv) override;
  void attention_kv_unpack(const Tensor& kv, int64_t H, Tensor& qkv) override;
  void attention_decode(const Tensor& qkv, Tensor& k_cache, Tensor& v_cache, int64_t pos, Tensor& out) override;

  void xent_stats(const Tensor& logits, const Tensor& targets, int64_t vocab_start, int64_t valid,
                  Tensor& stats) override;
  void xent_combine(const Tensor& parts, Tensor& lse, Tensor& loss) override;
  void xent_backward(Tensor& logits, const Tensor& targets, int64_t vocab_start, int64_t valid, const Tensor& lse,
                     float scale) override;

  void adamw(Tensor& master, const Tensor& grads, Tensor& m, Tensor& v, std::span<const FlatRange> ranges,
             const AdamWHyper& h, Tensor& compute_copy) override;

  // Adds the wall time of one op, from here to the end of the scope, to its family while timing
  // is on (used by the op implementations in this folder).
  class ScopedTimer {
   public:
    ScopedTimer(CpuOps& ops, OpFamily f) : ops_(ops.timing_ ? &ops : nullptr), family_(f) {
      if (ops_) start_ = std::chrono::steady_clock::now();
    }
    ~ScopedTimer() {
      if (ops_)
        ops_->times_.add(family_, std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
    }
    ScopedTimer(const ScopedTimer&) = delete;
    ScopedTimer& operator=(const ScopedTimer&) = delete;

   private:
    CpuOps* ops_;
    OpFamily family_;
    std::chrono::steady_clock::time_point start_;
  };

 private:
  static double process_cpu_seconds() {
    timespec t{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
  }

  CpuAllocator alloc_;
  double peak_flops_ = 0;
  bool timing_ = false;
  OpTimes times_;
  double compute_start_ = 0, compute_s_ = 0;  // the compute clock
};

// exp(x) for f32 in plain arithmetic, so loops over it vectorise (Cephes' polynomial, within
// 2 ulp of expf over the whole range; exp(-inf) = 0, NaN stays NaN).
inline float fast_exp(float x) {
  const float hi = 88.3762626647949f, lo = -87.3365447504f;
  float xc = x < lo ? lo : (x > hi ? hi : x);
  // n = round(x / ln 2) by the 1.5 * 2^23 trick: std::floor would not vectorise (its rounding
  // instruction may raise FE_INEXACT, which floor must not) unless -fno-trapping-math.
  float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = xc - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500E-4f;
  p = p * r + 1.3981999507E-3f;
  p = p * r + 8.3334519073E-3f;
  p = p * r + 4.1665795894E-2f;
  p = p * r + 1.6666665459E-1f;
  p = p * r + 5.0000001201E-1f;
  p = p * r * r + r + 1.0f;
  int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  float result = p * scale;
  result = x < lo ? 0.0f : result;
  result = x > hi ? INFINITY : result;
  return x != x ? x : result;
}

// db (O) += the column sums of dy (N, O), in blocks of columns (linear_backward's bias gradient).
void column_sums(const float* dy, int64_t N, int64_t O, float* db);

// Splits [0, n) into the fixed block size used for order-independent reductions.
inline constexpr int64_t kReduceBlock = 1 << 14;

}  // namespace tripod::cpu
