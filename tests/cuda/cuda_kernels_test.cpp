// Every op of the CUDA backend against the CPU backend on random inputs of several shapes
// (including sizes that are not multiples of the vector width and unaligned views). Inputs are
// rounded to bf16 first, so both backends see the same numbers; outputs are NaN-poisoned before
// each run. Tolerances (relative, ||got - want|| / ||want||): 1e-2 where the output is bf16, 1e-5
// for f32 outputs of f32 math. Skipped, with the reason, on machines without a GPU.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include "kernels/cuda/cublas.h"
#include "kernels/cuda/cublaslt.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/fp8.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/cuda/fp8_conversion_check.h"

namespace tripod {
namespace {

using namespace test;

class CudaOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TRIPOD_REQUIRE_GPU();
    cpu_ = make_ops(Device::CPU);
    gpu_ = make_ops(Device::CUDA, 0);
  }
  Tensor randn(const Shape& s, uint64_t stream, float scale = 1.f, float shift = 0.f, bool exact = false) {
    return test::randn(*cpu_, s, stream, scale, shift, exact);
  }
  Tensor up(const Tensor& h, DType dt = DType::BF16) { return upload(*gpu_, h, dt); }
  Tensor down(const Tensor& d) { return download(*gpu_, *cpu_, d); }
  Tensor poison(const Shape& s, DType dt = DType::BF16) { return poisoned(*gpu_, s, dt); }
  Tensor host(const Shape& s, DType dt = DType::F32) { return cpu_->empty(s, dt, MemCategory::Workspace); }

  std::unique_ptr<Ops> cpu_, gpu_;
};

// ---- backend properties, memory --------------------------------------------------------------

// cuBLASLt is loaded at the first GEMM runner, not with the process (kernels/cuda/cublaslt.h):
// it loads, with every function, without a GPU too; and the library was not there before.
TEST(CublasLt, LoadsAtFirstUseWithEveryFunction) {
  auto mapped = [] {
    std::ifstream maps("/proc/self/maps");
    std::stringstream all;
    all << maps.rdbuf();
    return all.str().find("libcublasLt.so") != std::string::npos;
  };
  EXPECT_FALSE(mapped()) << "libcublasLt was loaded with the process";
  const cuda::CublasLt& lt = cuda::cublaslt();
#define TRIPOD_EXPECT_LOADED(name) EXPECT_NE(lt.name, nullptr) << #name;
  TRIPOD_CUBLASLT_FUNCTIONS(TRIPOD_EXPECT_LOADED)
#undef TRIPOD_EXPECT_LOADED
  EXPECT_STREQ(lt.GetStatusString(CUBLAS_STATUS_SUCCESS), "success");  // the library answers
  EXPECT_TRUE(mapped());
}

TEST_F(CudaOpsTest, ReportsBf16ComputeAndThisGpusPeak) {
  EXPECT_EQ(gpu_->device(), Device::CUDA);
  EXPECT_EQ(gpu_->compute_dtype(), DType::BF16);
  const std::string& name = dynamic_cast<cuda::CudaOps&>(*gpu_).device_name();
  const double known = gpu_peak_flops(name);
  EXPECT_EQ(gpu_->peak_flops(), known > 0 ? known : 989e12) << name;
  EXPECT_EQ(cuda::CudaOps(0, DebugOptions{.peak_tflops = 123.5}).peak_flops(), 123.5e12) << "TRIPOD_PEAK_TFLOPS";
  EXPECT_FALSE(gpu_->keeps_attention_probs());
  EXPECT_EQ(gpu_->host_allocator().device(), Device::CPU);
}

TEST_F(CudaOpsTest, AllocatorChargesCategories) {
  MemoryStats& st = gpu_->allocator().stats();
  const int64_t params = st.current(MemCategory::Params), acts = st.current(MemCategory::Activations);
  {
    Tensor p = gpu_->empty({1000}, DType::F32, MemCategory::Params);
    Tensor a = gpu_->empty({10, 10}, DType::BF16, MemCategory::Activations);
    EXPECT_EQ(p.device(), Device::CUDA);
    EXPECT_EQ(st.current(MemCategory::Params), params + 4000);
    EXPECT_EQ(st.current(MemCategory::Activations), acts + 200);
  }
  EXPECT_EQ(st.current(MemCategory::Params), params);
  EXPECT_EQ(st.current(MemCategory::Activations), acts);
  // A freed block is reused, not requested again.
  const size_t reserved = gpu_->allocator().reserved_bytes();
  { Tensor again = gpu_->empty({1000}, DType::F32, MemCategory::Grads); }
  EXPECT_EQ(gpu_->allocator().reserved_bytes(), reserved);
}

TEST_F(CudaOpsTest, FillAndCopyConvertBetweenHostAndDevice) {
  for (int64_t n : {1, 7, 1000, 70001}) {
    Tensor h = randn({n}, 1, 3.f, 0.f, /*exact=*/true);
    // host f32 -> device bf16 -> host f32 rounds exactly as the host's bf16 does
    Tensor back = down(up(h, DType::BF16));
    const float* b = back.data<float>();
    const float* x = h.data<float>();
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(b[i], static_cast<float>(bf16(x[i]))) << "n=" << n << " i=" << i;
    // device f32 -> device bf16 (the conversion kernel), through an unaligned view
    Tensor d32 = up(h, DType::F32);
    Tensor d16 = poison({n + 1}, DType::BF16);
    Tensor view = d16.flat(1, n + 1);
    gpu_->copy(d32, view);
    Tensor back2 = down(view);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(back2.data<float>()[i], static_cast<float>(bf16(x[i]))) << i;
    // f32 round trip is exact
    EXPECT_EQ(rel_err(down(d32), h), 0.0);
  }
  Tensor ti = ints(*cpu_, {1, -2, 3, 1 << 20});
  Tensor di = up(ti, DType::I32);
  Tensor bi = down(di);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(bi.data<int32_t>()[i], ti.data<int32_t>()[i]);
  gpu_->fill(di, 7.f);
  bi = down(di);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(bi.data<int32_t>()[i], 7);
  Tensor b16 = poison({33});
  gpu_->fill(b16, 1.5f);
  Tensor hb = down(b16);
  for (int i = 0; i < 33; ++i) EXPECT_EQ(hb.data<float>()[i], 1.5f);
  // pinned staging memory (what MpiComm uses) round-trips too
  Tensor pinned = Tensor::empty(gpu_->host_allocator(), {5}, DType::F32, MemCategory::Comm);
  for (int i = 0; i < 5; ++i) pinned.data<float>()[i] = static_cast<float>(i) * 0.5f;
  Tensor d = up(pinned, DType::F32);
  Tensor pinned2 = Tensor::empty(gpu_->host_allocator(), {5}, DType::F32, MemCategory::Comm);
  gpu_->copy(d, pinned2);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(pinned2.data<float>()[i], static_cast<float>(i) * 0.5f);
}

TEST_F(CudaOpsTest, AddAccumulateScale) {
  for (int64_t n : {1, 9, 4096, 100003}) {
    Tensor a = randn({n}, 2), b = randn({n}, 3);
    Tensor want = host({n});
    cpu_->add(a, b, want);
    for (DType dt : {DType::BF16, DType::F32}) {
      Tensor out = poison({n}, dt);
      gpu_->add(up(a, dt), up(b, dt), out);
      EXPECT_LT(rel_err(down(out), want), dt == DType::BF16 ? kBf16Tol : kF32Tol) << "add n=" << n;
    }
    // out aliasing an input
    Tensor da = up(a), db = up(b);
    gpu_->add(da, db, da);
    EXPECT_LT(rel_err(down(da), want), kBf16Tol);

    // f32 += bf16 and f32 += f32 (gradient accumulation), bf16 += bf16
    Tensor acc_want = clone(*cpu_, a);
    cpu_->accumulate(acc_want, b);
    for (DType src : {DType::BF16, DType::F32}) {
      Tensor dst = up(a, DType::F32);
      gpu_->accumulate(dst, up(b, src));
      EXPECT_LT(rel_err(down(dst), acc_want), kF32Tol) << "accumulate n=" << n;
    }
    Tensor dst16 = up(a);
    gpu_->accumulate(dst16, up(b));
    EXPECT_LT(rel_err(down(dst16), acc_want), kBf16Tol);

    Tensor s_want = clone(*cpu_, a);
    cpu_->scale(s_want, -0.37f);
    Tensor s32 = up(a, DType::F32);
    gpu_->scale(s32, -0.37f);
    EXPECT_LT(rel_err(down(s32), s_want), kF32Tol);
    Tensor s16 = up(a);
    gpu_->scale(s16, -0.37f);
    EXPECT_LT(rel_err(down(s16), s_want), kBf16Tol);
  }
}

TEST_F(CudaOpsTest, SumsOverRanges) {
  const int64_t n = 300001;
  Tensor h = randn({n}, 4, 1.f, 0.1f, /*exact=*/true);
  Tensor d = up(h, DType::F32);
  std::vector<FlatRange> ranges{{0, 5, false}, {100, 70000, false}, {70000, 70000, false}, {123456, n, false}};
  EXPECT_NEAR(gpu_->sum_squares(d, ranges), cpu_->sum_squares(h, ranges),
              1e-10 * cpu_->sum_squares(h, ranges));
  EXPECT_NEAR(gpu_->sum(d), cpu_->sum(h), 1e-9 * std::abs(cpu_->sum(h)) + 1e-6);
  EXPECT_EQ(gpu_->sum_squares(d, {}), 0.0);
  // Deterministic: the same sum twice.
  EXPECT_EQ(gpu_->sum_squares(d, ranges), gpu_->sum_squares(d, ranges));
}

// ---- embedding --------------------------------------------------------------------------------

TEST_F(CudaOpsTest, EmbeddingForwardBackward) {
  struct Case {
    int64_t B, T, V, C, vocab_start;
    bool wpe;
  };
  for (Case c : {Case{2, 8, 50, 24, 20, true}, Case{1, 5, 7, 10, 0, true}, Case{3, 4, 30, 16, 10, false}}) {
    const int64_t N = c.B * c.T;
    std::vector<int32_t> tok;
    for (int64_t n = 0; n < N; ++n) tok.push_back(static_cast<int32_t>((n * 37 + 11) % (c.V + 2 * c.vocab_start + 3)));
    Tensor tokens = ints(*cpu_, tok);
    Tensor wte = randn({c.V, c.C}, 10), wpe = randn({c.T + 3, c.C}, 11);
    Tensor want = host({N, c.C});
    cpu_->embedding_forward(tokens, wte, c.vocab_start, c.wpe ? wpe : Tensor{}, c.T, want);
    Tensor got = poison({N, c.C});
    gpu_->embedding_forward(up(tokens, DType::I32), up(wte), c.vocab_start, c.wpe ? up(wpe) : Tensor{}, c.T, got);
    EXPECT_LT(rel_err(down(got), want), kBf16Tol) << "V=" << c.V << " C=" << c.C;

    Tensor dout = randn({N, c.C}, 12);
    Tensor dwte = randn({c.V, c.C}, 13, 1.f, 0.f, true), dwpe = randn({c.T + 3, c.C}, 14, 1.f, 0.f, true);
    Tensor g_dwte = up(dwte, DType::F32), g_dwpe = up(dwpe, DType::F32);
    Tensor no_wpe;
    cpu_->embedding_backward(tokens, dout, c.vocab_start, dwte, c.wpe ? dwpe : no_wpe, c.T);
    Tensor g_no_wpe;
    gpu_->embedding_backward(up(tokens, DType::I32), up(dout), c.vocab_start, g_dwte, c.wpe ? g_dwpe : g_no_wpe, c.T);
    EXPECT_LT(rel_err(down(g_dwte), dwte), kF32Tol);
    EXPECT_LT(rel_err(down(g_dwpe), dwpe), kF32Tol);
  }
}

// ---- LayerNorm ----------------------------------------------------------------------------------

TEST_F(CudaOpsTest, LayerNormForwardBackward) {
  for (auto [N, C] : {std::pair<int64_t, int64_t>{1, 8}, {7, 32}, {64, 768}, {33, 100}, {300, 1024},
                        {2500, 776}}) {  // (many rows per column chunk; a partial last column block)
    Tensor x = randn({N, C}, 20, 1.f, 0.5f), w = randn({C}, 21, 0.1f, 1.f), b = randn({C}, 22, 0.1f);
    Tensor y = host({N, C}), mean = host({N}), rstd = host({N});
    cpu_->layernorm_forward(x, w, b, 1e-5f, y, mean, rstd);
    Tensor gy = poison({N, C}), gmean = poison({N}, DType::F32), grstd = poison({N}, DType::F32);
    Tensor gx = up(x), gw = up(w), gb = up(b);
    gpu_->layernorm_forward(gx, gw, gb, 1e-5f, gy, gmean, grstd);
    EXPECT_LT(rel_err(down(gy), y), kBf16Tol) << N << "x" << C;
    EXPECT_LT(rel_err(down(gmean), mean), kF32Tol) << N << "x" << C;
    EXPECT_LT(rel_err(down(grstd), rstd), 1e-4) << N << "x" << C;  // 1/sqrt of a sum in another order

    Tensor dy = randn({N, C}, 23), dx = randn({N, C}, 24);  // dx accumulates
    Tensor dw = randn({C}, 25, 1.f, 0.f, true), db = randn({C}, 26, 1.f, 0.f, true);
    Tensor gdx = up(dx), gdw = up(dw, DType::F32), gdb = up(db, DType::F32);
    cpu_->layernorm_backward(dy, x, w, mean, rstd, dx, dw, db);
    gpu_->layernorm_backward(up(dy), gx, gw, gmean, grstd, gdx, gdw, gdb);
    EXPECT_LT(rel_err(down(gdx), dx), kBf16Tol) << N << "x" << C;
    EXPECT_LT(rel_err(down(gdw), dw), kF32Tol) << N << "x" << C;
    EXPECT_LT(rel_err(down(gdb), db), kF32Tol) << N << "x" << C;
  }
}

// ---- RMSNorm, rotary embeddings, SwiGLU ----------------------------------------------------------

TEST_F(CudaOpsTest, RmsNormForwardBackward) {
  for (auto [N, C] : {std::pair<int64_t, int64_t>{1, 8}, {7, 32}, {64, 2048}, {33, 100}}) {
    Tensor x = randn({N, C}, 120, 1.f, 0.5f), w = randn({C}, 121, 0.1f, 1.f);
    Tensor y = host({N, C}), rstd = host({N});
    cpu_->rmsnorm_forward(x, w, 1e-6f, y, rstd);
    Tensor gy = poison({N, C}), grstd = poison({N}, DType::F32), gx = up(x), gw = up(w);
    gpu_->rmsnorm_forward(gx, gw, 1e-6f, gy, grstd);
    EXPECT_LT(rel_err(down(gy), y), kBf16Tol) << N << "x" << C;
    EXPECT_LT(rel_err(down(grstd), rstd), 1e-4) << N << "x" << C;
    Tensor dy = randn({N, C}, 122), dx = randn({N, C}, 123), dw = randn({C}, 124, 1.f, 0.f, true);
    Tensor gdx = up(dx), gdw = up(dw, DType::F32);
    cpu_->rmsnorm_backward(dy, x, w, rstd, dx, dw);
    gpu_->rmsnorm_backward(up(dy), gx, gw, grstd, gdx, gdw);
    EXPECT_LT(rel_err(down(gdx), dx), kBf16Tol) << N << "x" << C;
    EXPECT_LT(rel_err(down(gdw), dw), kF32Tol) << N << "x" << C;
  }
}

TEST_F(CudaOpsTest, RopeForwardAndInverse) {
  for (auto [N, heads, rot, D, T, pos0] : {std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>{
                                               8, 5, 3, 8, 4, 0},
                                           {256, 12, 8, 64, 128, 0}, {3, 6, 4, 128, 3, 1000}}) {
    for (bool inverse : {false, true}) {
      Tensor x = randn({N, heads, D}, 130, 1.f, 0.f, /*exact=*/true);
      Tensor gx = up(x);
      cpu_->rope(x, rot, T, pos0, 500000.0, inverse);
      gpu_->rope(gx, rot, T, pos0, 500000.0, inverse);
      EXPECT_LT(rel_err(down(gx), x), kBf16Tol) << N << " " << D << " inverse " << inverse;
    }
  }
}

TEST_F(CudaOpsTest, SwiGluForwardBackward) {
  for (auto [N, F] : {std::pair<int64_t, int64_t>{1, 8}, {17, 100}, {64, 1408}}) {
    Tensor gu = randn({N, 2 * F}, 140, 2.f, 0.f, /*exact=*/true), dy = randn({N, F}, 141, 1.f, 0.f, true);
    Tensor y = host({N, F}), dgu = host({N, 2 * F});
    cpu_->swiglu_forward(gu, y);
    cpu_->swiglu_backward(gu, dy, dgu);
    Tensor gy = poison({N, F}), gdgu = poison({N, 2 * F});
    gpu_->swiglu_forward(up(gu), gy);
    gpu_->swiglu_backward(up(gu), up(dy), gdgu);
    EXPECT_LT(rel_err(down(gy), y), kBf16Tol) << N << "x" << F;
    EXPECT_LT(rel_err(down(gdgu), dgu), kBf16Tol) << N << "x" << F;
  }
}

// ---- linear, GELU --------------------------------------------------------------------------------

struct LinearCase {
  int64_t N, I, O;
};
constexpr LinearCase kLinearCases[] = {{1, 8, 8},   {17, 24, 40}, {128, 768, 2304},
                                       {64, 96, 50}, {5, 13, 7},   {2000, 64, 776}};

TEST_F(CudaOpsTest, LinearForward) {
  for (auto [N, I, O] : kLinearCases) {
    Tensor x = randn({N, I}, 30), w = randn({O, I}, 31, 0.05f), b = randn({O}, 32, 0.1f);
    for (bool bias : {true, false}) {
      Tensor want = host({N, O});
      cpu_->linear_forward(x, w, bias ? b : Tensor{}, want);
      Tensor got = poison({N, O});
      gpu_->linear_forward(up(x), up(w), bias ? up(b) : Tensor{}, got);
      EXPECT_LT(rel_err(down(got), want), kBf16Tol) << N << " " << I << " " << O << " bias " << bias;
    }
  }
}

TEST_F(CudaOpsTest, LinearGeluForwardMatchesLinearThenGelu) {
  for (auto [N, I, O] : kLinearCases) {
    Tensor x = randn({N, I}, 33), w = randn({O, I}, 34, 0.1f), b = randn({O}, 35, 0.3f);
    Tensor pre = host({N, O}), y = host({N, O});
    cpu_->linear_gelu_forward(x, w, b, pre, y);
    Tensor gpre = poison({N, O}), gy = poison({N, O});
    gpu_->linear_gelu_forward(up(x), up(w), up(b), gpre, gy);
    EXPECT_LT(rel_err(down(gpre), pre), kBf16Tol) << N << " " << I << " " << O;
    EXPECT_LT(rel_err(down(gy), y), kBf16Tol) << N << " " << I << " " << O;
  }
}

TEST_F(CudaOpsTest, LinearBackwardInputGeluMatchesTheTwoOps) {
  // The DGELU epilogue (inputs I a multiple of 8) and the GEMM-then-pass fallback (the rest) against
  // the CPU's two ops: dpre = (dy w) * gelu'(pre).
  for (auto [N, I, O] : kLinearCases) {
    Tensor dy = randn({N, O}, 36), w = randn({O, I}, 37, 0.1f), pre = randn({N, I}, 38, 1.5f);
    Tensor dpre = host({N, I});
    cpu_->linear_backward_input_gelu(dy, w, pre, dpre);
    Tensor gdpre = poison({N, I});
    gpu_->linear_backward_input_gelu(up(dy), up(w), up(pre), gdpre);
    EXPECT_LT(rel_err(down(gdpre), dpre), kBf16Tol) << N << " " << I << " " << O;
  }
}

TEST_F(CudaOpsTest, LinearBackward) {
  for (auto [N, I, O] : kLinearCases) {
    Tensor x = randn({N, I}, 40), w = randn({O, I}, 41, 0.05f), dy = randn({N, O}, 42);
    for (bool with_dx : {true, false}) {
      Tensor dx = host({N, I});
      Tensor dw = randn({O, I}, 43, 1.f, 0.f, true), db = randn({O}, 44, 1.f, 0.f, true);
      Tensor gdx = with_dx ? poison({N, I}) : Tensor{};
      Tensor gdw = up(dw, DType::F32), gdb = up(db, DType::F32);
      Tensor cdx = with_dx ? dx : Tensor{};
      cpu_->linear_backward(dy, x, w, cdx, dw, db);
      gpu_->linear_backward(up(dy), up(x), up(w), gdx, gdw, gdb);
      if (with_dx) {
        EXPECT_LT(rel_err(down(gdx), dx), kBf16Tol) << N << " " << I << " " << O;
      }
      // f32 accumulation of exact bf16 products on tensor cores, in another order than OpenBLAS
      EXPECT_LT(rel_err(down(gdw), dw), 1e-4) << N << " " << I << " " << O;
      EXPECT_LT(rel_err(down(gdb), db), kF32Tol) << N << " " << I << " " << O;
    }
    // No bias gradient asked for.
    Tensor dw = randn({O, I}, 45, 1.f, 0.f, true), gdw = up(dw, DType::F32), none, gnone, gdx;
    cpu_->linear_backward(dy, x, w, none, dw, none);
    gpu_->linear_backward(up(dy), up(x), up(w), gdx, gdw, gnone);
    EXPECT_LT(rel_err(down(gdw), dw), 1e-4);
  }
}

// The backward split into input and weight halves (zero-bubble pipelines) gives the whole
// backward's bits on the GPU too.
TEST_F(CudaOpsTest, BackwardHalvesGiveTheWholeBackwardsBits) {
  auto same_bits = [&](const Tensor& a, const Tensor& b) {
    Tensor ha = down(a), hb = down(b);
    return ha.nbytes() == hb.nbytes() && std::memcmp(ha.raw(), hb.raw(), ha.nbytes()) == 0;
  };
  Tensor none;
  for (auto [N, I, O] : kLinearCases) {
    Tensor x = up(randn({N, I}, 240)), w = up(randn({O, I}, 241, 0.05f)), dy = up(randn({N, O}, 242));
    Tensor dw0 = randn({O, I}, 243, 1.f, 0.f, true), db0 = randn({O}, 244, 1.f, 0.f, true);
    Tensor dx = poison({N, I}), dw = up(dw0, DType::F32), db = up(db0, DType::F32);
    Tensor dx2 = poison({N, I}), dw2 = up(dw0, DType::F32), db2 = up(db0, DType::F32);
    gpu_->linear_backward(dy, x, w, dx, dw, db);
    gpu_->linear_backward_input(dy, w, dx2);
    gpu_->linear_backward_weight(dy, x, dw2, db2);
    EXPECT_TRUE(same_bits(dx, dx2)) << N << " " << I << " " << O;
    EXPECT_TRUE(same_bits(dw, dw2)) << N << " " << I << " " << O;
    EXPECT_TRUE(same_bits(db, db2)) << N << " " << I << " " << O;
  }
  for (auto [N, C] : {std::pair<int64_t, int64_t>{7, 32}, {33, 100}, {300, 1024}}) {
    Tensor x = randn({N, C}, 250, 1.f, 0.5f), w = randn({C}, 251, 0.1f, 1.f), b = randn({C}, 252, 0.1f);
    Tensor gx = up(x), gw = up(w), gb = up(b), dy = up(randn({N, C}, 253)), dx0 = randn({N, C}, 254);
    Tensor dw0 = randn({C}, 255, 1.f, 0.f, true), db0 = randn({C}, 256, 1.f, 0.f, true);
    Tensor y = poison({N, C}), mean = poison({N}, DType::F32), rstd = poison({N}, DType::F32);
    gpu_->layernorm_forward(gx, gw, gb, 1e-5f, y, mean, rstd);
    Tensor dx = up(dx0), dw = up(dw0, DType::F32), db = up(db0, DType::F32);
    Tensor dx2 = up(dx0), dw2 = up(dw0, DType::F32), db2 = up(db0, DType::F32);
    gpu_->layernorm_backward(dy, gx, gw, mean, rstd, dx, dw, db);
    gpu_->layernorm_backward(dy, gx, gw, mean, rstd, dx2, none, none);
    gpu_->layernorm_backward(dy, gx, gw, mean, rstd, none, dw2, db2);
    EXPECT_TRUE(same_bits(dx, dx2)) << "layernorm " << N << "x" << C;
    EXPECT_TRUE(same_bits(dw, dw2)) << "layernorm " << N << "x" << C;
    EXPECT_TRUE(same_bits(db, db2)) << "layernorm " << N << "x" << C;
    gpu_->rmsnorm_forward(gx, gw, 1e-6f, y, rstd);
    Tensor rdx = up(dx0), rdw = up(dw0, DType::F32), rdx2 = up(dx0), rdw2 = up(dw0, DType::F32);
    gpu_->rmsnorm_backward(dy, gx, gw, rstd, rdx, rdw);
    gpu_->rmsnorm_backward(dy, gx, gw, rstd, rdx2, none);
    gpu_->rmsnorm_backward(dy, gx, gw, rstd, none, rdw2);
    EXPECT_TRUE(same_bits(rdx, rdx2)) << "rmsnorm " << N << "x" << C;
    EXPECT_TRUE(same_bits(rdw, rdw2)) << "rmsnorm " << N << "x" << C;
  }
}

TEST_F(CudaOpsTest, GeluForwardBackward) {
  for (int64_t n : {1, 15, 8192, 30011}) {
    Tensor x = randn({n}, 50, 2.f), dy = randn({n}, 51);
    Tensor y = host({n}), dx = host({n});
    cpu_->gelu_forward(x, y);
    cpu_->gelu_backward(x, dy, dx);
    Tensor gx = up(x), gy = poison({n});
    gpu_->gelu_forward(gx, gy);
    EXPECT_LT(rel_err(down(gy), y), kBf16Tol) << n;
    Tensor gdx = poison({n});
    gpu_->gelu_backward(gx, up(dy), gdx);
    EXPECT_LT(rel_err(down(gdx), dx), kBf16Tol) << n;
    Tensor inplace = up(dy);  // dx aliasing dy, as the MLP's backward does
    gpu_->gelu_backward(gx, inplace, inplace);
    EXPECT_LT(rel_err(down(inplace), dx), kBf16Tol) << n;
  }
}

// ---- attention ------------------------------------------------------------------------------------

struct AttnCase {
  int64_t B, T, H, D;
  int64_t Hkv = 0;  // key/value heads (grouped-query attention); 0: H
  int64_t kv() const { return Hkv > 0 ? Hkv : H; }
};

// Runs forward and backward on `gpu` and compares with the CPU backend; returns the impl used.
std::string check_attention(Ops& cpu, Ops& gpu, AttnCase c) {
  auto [B, T, H, D, unused] = c;
  const int64_t W = H + 2 * c.kv();  // heads per token in qkv
  Tensor qkv = randn(cpu, {B, T, W, D}, 60 + T);
  Tensor out = cpu.empty({B, T, H, D}, DType::F32, MemCategory::Workspace);
  Tensor lse = cpu.empty({B, H, T}, DType::F32, MemCategory::Workspace);
  Tensor no_probs;
  cpu.attention_forward(qkv, out, lse, no_probs);
  Tensor gqkv = upload(gpu, qkv, DType::BF16);
  Tensor gout = poisoned(gpu, {B, T, H, D}, DType::BF16), glse = poisoned(gpu, {B, H, T}, DType::F32);
  gpu.attention_forward(gqkv, gout, glse, no_probs);
  EXPECT_LT(rel_err(download(gpu, cpu, gout), out), kBf16Tol) << B << " " << T << " " << H << " " << D;
  EXPECT_LT(rel_err(download(gpu, cpu, glse), lse), 1e-4) << B << " " << T << " " << H << " " << D;

  // The backward takes the bf16 output the GPU produced, as training does.
  Tensor dout = randn(cpu, {B, T, H, D}, 70 + T);
  Tensor dqkv = cpu.empty({B, T, W, D}, DType::F32, MemCategory::Workspace);
  cpu.attention_backward(dout, qkv, out, lse, no_probs, dqkv);
  Tensor gdqkv = poisoned(gpu, {B, T, W, D}, DType::BF16);
  gpu.attention_backward(upload(gpu, dout, DType::BF16), gqkv, gout, glse, no_probs, gdqkv);
  EXPECT_LT(rel_err(download(gpu, cpu, gdqkv), dqkv), kBf16Tol) << B << " " << T << " " << H << " " << D;
  return dynamic_cast<cuda::CudaOps&>(gpu).attention_impl();
}

constexpr AttnCase kAttnCases[] = {{2, 16, 2, 32}, {1, 128, 4, 64}, {2, 64, 3, 128}, {1, 200, 2, 64}};

std::unique_ptr<Ops> gpu_with_attention(AttentionKernels kernels) {
  return make_ops(Device::CUDA, 0, DebugOptions{.attention = kernels});
}

TEST_F(CudaOpsTest, AttentionCudnnFused) {
  auto gpu = gpu_with_attention(AttentionKernels::Cudnn);  // fails, naming cuDNN's reason, when cuDNN declines a shape
  for (AttnCase c : kAttnCases) EXPECT_EQ(check_attention(*cpu_, *gpu, c), "cudnn");
}

// Grouped-query attention (fewer key/value heads than query heads, 1 = multi-query): cuDNN's
// graph with K and V of Hkv heads where an engine takes it (else the reference kernels, with a
// warning), and the reference kernels.
constexpr AttnCase kGqaCases[] = {{2, 16, 4, 32, 2}, {1, 128, 8, 64, 2}, {2, 64, 4, 128, 1}, {1, 33, 6, 64, 3}};

TEST_F(CudaOpsTest, GroupedQueryAttentionMatchesCpu) {
  auto gpu = gpu_with_attention(AttentionKernels::Auto);
  for (AttnCase c : kGqaCases) check_attention(*cpu_, *gpu, c);
  auto ref = gpu_with_attention(AttentionKernels::Reference);
  for (AttnCase c : kGqaCases) EXPECT_EQ(check_attention(*cpu_, *ref, c), "reference");
}

TEST_F(CudaOpsTest, AttentionReferenceKernels) {
  auto gpu = gpu_with_attention(AttentionKernels::Reference);
  for (AttnCase c : kAttnCases) EXPECT_EQ(check_attention(*cpu_, *gpu, c), "reference");
  EXPECT_EQ(check_attention(*cpu_, *gpu, {1, 9, 2, 24}), "reference");  // D not a multiple of 32
  EXPECT_EQ(check_attention(*cpu_, *gpu, {1, 1, 1, 64}), "reference");  // one token
}

// Blocks of context-parallel attention: a diagonal (causal) block and a full block of other keys
// merged into one f32 result, then both blocks' backward from the merged output, on the GPU's
// reference block kernels and the CPU from the same bf16-rounded inputs (grouped-query attention,
// queries read from qkv rows); and the key/value packing both ways.
TEST_F(CudaOpsTest, AttentionBlocksMatchCpu) {
  for (auto [B, T, T2, H, Hkv, D] : std::vector<std::array<int64_t, 6>>{{2, 16, 24, 4, 2, 32}, {1, 33, 7, 2, 2, 64}}) {
    SCOPED_TRACE(testing::Message() << B << " " << T << " " << T2 << " " << H << " " << Hkv << " " << D);
    const int64_t W = H + 2 * Hkv;
    Tensor qkv = randn({B, T, W, D}, 80), kv2 = randn({B, T2, 2 * Hkv, D}, 81), dout = randn({B, T, H, D}, 82);
    Tensor kv1 = host({B, T, 2 * Hkv, D});
    Tensor kv1_rows = kv1.view({B * T, 2 * Hkv * D});
    cpu_->attention_kv_pack(qkv.view({B * T, W * D}), H, kv1_rows);
    Tensor gqkv = up(qkv), gkv2 = up(kv2), gkv1 = poison({B, T, 2 * Hkv, D});
    Tensor gkv1_rows = gkv1.view({B * T, 2 * Hkv * D});
    gpu_->attention_kv_pack(gqkv.view({B * T, W * D}), H, gkv1_rows);
    EXPECT_EQ(rel_err(down(gkv1), kv1), 0.0);
    Tensor out = host({B, T, H, D}), lse = host({B, H, T});
    Tensor gout = up(host({B, T, H, D}), DType::F32), glse = poison({B, H, T}, DType::F32);
    cpu_->fill(lse, -INFINITY);
    gpu_->fill(glse, -INFINITY);
    for (Ops* o : {cpu_.get(), gpu_.get()}) {
      const bool g = o == gpu_.get();
      o->attention_block_forward(g ? gqkv : qkv, g ? gkv1 : kv1, true, {}, g ? gout : out, g ? glse : lse);
      o->attention_block_forward(g ? gqkv : qkv, g ? gkv2 : kv2, false, {}, g ? gout : out, g ? glse : lse);
    }
    EXPECT_LT(rel_err(down(gout), out), 1e-5);
    EXPECT_LT(rel_err(down(glse), lse), 1e-5);
    // The backward reads the output in the compute dtype (bf16 on the GPU), as training does.
    Tensor gout16 = poison({B, T, H, D});
    gpu_->copy(gout, gout16);
    Tensor out16 = down(gout16), gdout = up(dout);
    Tensor dq = host({B, T, W, D}), dkv1 = host({B, T, 2 * Hkv, D}), dkv2 = host({B, T2, 2 * Hkv, D});
    Tensor gdq = up(dq, DType::F32), gdkv1 = up(dkv1, DType::F32), gdkv2 = up(dkv2, DType::F32);
    for (Tensor* t : {&dq, &dkv1, &dkv2}) cpu_->fill(*t, 0.f);
    for (Tensor* t : {&gdq, &gdkv1, &gdkv2}) gpu_->fill(*t, 0.f);
    cpu_->attention_block_backward(dout, qkv, kv1, out16, lse, true, {}, dq, dkv1);
    cpu_->attention_block_backward(dout, qkv, kv2, out16, lse, false, {}, dq, dkv2);
    gpu_->attention_block_backward(gdout, gqkv, gkv1, gout16, glse, true, {}, gdq, gdkv1);
    gpu_->attention_block_backward(gdout, gqkv, gkv2, gout16, glse, false, {}, gdq, gdkv2);
    EXPECT_LT(rel_err(down(gdq), dq), 1e-3);
    EXPECT_LT(rel_err(down(gdkv1), dkv1), 1e-3);
    EXPECT_LT(rel_err(down(gdkv2), dkv2), 1e-3);
    // The key/value gradients back into qkv rows (f32 sums into the bf16 compute dtype).
    Tensor g16 = poison({B * T, W * D});
    gpu_->fill(g16, 0.f);
    gpu_->attention_kv_unpack(gdkv1.view({B * T, 2 * Hkv * D}), H, g16);
    Tensor want = host({B * T, W * D});
    cpu_->fill(want, 0.f);
    cpu_->attention_kv_unpack(dkv1.view({B * T, 2 * Hkv * D}), H, want);
    EXPECT_LT(rel_err(down(g16), want), kBf16Tol);
  }
}

// ---- packed documents (data.reset_attention_mask, reset_position_ids, eod_mask_loss) -------------

// Document starts of B sequences of T tokens with documents ending where `ends` says (positions
// of end-of-document inputs in sequence 0; sequence b shifts them by 3 b), and the same as row
// offsets.
struct PackedDocs {
  std::vector<int32_t> start, offsets;
};
PackedDocs packed_docs(int64_t B, int64_t T, const std::vector<int64_t>& ends) {
  PackedDocs d;
  for (int64_t b = 0; b < B; ++b) {
    int32_t s = 0;
    d.offsets.push_back(static_cast<int32_t>(b * T));
    for (int64_t t = 0; t < T; ++t) {
      d.start.push_back(s);
      for (int64_t e : ends)
        if (t == (e + 3 * b) % (T - 1) && t + 1 < T) {
          s = static_cast<int32_t>(t + 1);
          d.offsets.push_back(static_cast<int32_t>(b * T + t + 1));
        }
    }
  }
  d.offsets.push_back(static_cast<int32_t>(B * T));
  return d;
}

// Attention within documents (the varlen form) on the GPU against the CPU backend, forward and
// backward, grouped-query attention included: cuDNN on the documents batched by length (the
// default), and the reference kernels visiting each query's document only.
TEST_F(CudaOpsTest, AttentionWithinDocumentsMatchesCpu) {
  for (AttentionKernels kernels : {AttentionKernels::Auto, AttentionKernels::Reference}) {
    auto gpu = gpu_with_attention(kernels);
    for (AttnCase c : {AttnCase{2, 40, 4, 32, 2}, AttnCase{1, 130, 2, 64}, AttnCase{2, 200, 4, 64}}) {
      auto [B, T, H, D, unused] = c;
      const int64_t W = H + 2 * c.kv();
      SCOPED_TRACE(testing::Message() << B << " " << T << " " << H << " " << D << " kv " << c.kv()
                                      << (kernels == AttentionKernels::Reference ? " reference" : " auto"));
      const PackedDocs docs = packed_docs(B, T, {0, 5, 6, 19, 37, 100, 101, 170});
      Tensor start = ints(*cpu_, docs.start);
      Tensor qkv = randn({B, T, W, D}, 160 + T), dout = randn({B, T, H, D}, 170 + T);
      Tensor out = host({B, T, H, D}), lse = host({B, H, T}), dqkv = host({B, T, W, D});
      const DocRows rows{.offsets = docs.offsets, .start = start.view({B, T})};
      cpu_->attention_forward_docs(qkv, rows, out, lse);
      Tensor gstart = upload(*gpu, start, DType::I32);
      const DocRows grows{.offsets = docs.offsets, .start = gstart.view({B, T})};
      Tensor gqkv = upload(*gpu, qkv, DType::BF16), gout = poisoned(*gpu, {B, T, H, D}, DType::BF16);
      Tensor glse = poisoned(*gpu, {B, H, T}, DType::F32);
      gpu->attention_forward_docs(gqkv, grows, gout, glse);
      EXPECT_LT(rel_err(download(*gpu, *cpu_, gout), out), kBf16Tol);
      EXPECT_LT(rel_err(download(*gpu, *cpu_, glse), lse), 1e-4);
      cpu_->attention_backward_docs(dout, qkv, out, lse, rows, dqkv);
      Tensor gdqkv = poisoned(*gpu, {B, T, W, D}, DType::BF16);
      gpu->attention_backward_docs(upload(*gpu, dout, DType::BF16), gqkv, gout, glse, grows, gdqkv);
      EXPECT_LT(rel_err(download(*gpu, *cpu_, gdqkv), dqkv), kBf16Tol);
      if (kernels == AttentionKernels::Reference) {
        EXPECT_EQ(std::string(dynamic_cast<cuda::CudaOps&>(*gpu).attention_impl()), "reference");
      }
    }
  }
}

// Blocks under the document mask (context parallelism): a diagonal block and a full block of
// earlier keys with BlockDocs, merged, then their backward, on the GPU's block kernels and the CPU;
// some queries see nothing of the full block and keep what the diagonal gave them.
TEST_F(CudaOpsTest, AttentionBlocksWithinDocumentsMatchCpu) {
  const int64_t B = 2, c = 24, H = 4, Hkv = 2, D = 32, W = H + 2 * Hkv;
  // Queries at positions [c, 2c) of their sequences, keys of the full block at [0, c).
  std::vector<int32_t> st;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < c; ++t) st.push_back(static_cast<int32_t>(t < 5 + 4 * b ? 10 + 3 * b : c + 5 + 4 * b));
  Tensor start = ints(*cpu_, st), gstart = up(start, DType::I32);
  const BlockDocs diag{.start = start.view({B, c}), .key_pos = c}, full{.start = start.view({B, c}), .key_pos = 0};
  const BlockDocs gdiag{.start = gstart.view({B, c}), .key_pos = c}, gfull{.start = gstart.view({B, c}), .key_pos = 0};
  Tensor qkv = randn({B, c, W, D}, 180), kv2 = randn({B, c, 2 * Hkv, D}, 181), dout = randn({B, c, H, D}, 182);
  Tensor kv1 = host({B, c, 2 * Hkv, D});
  Tensor kv1_rows = kv1.view({B * c, 2 * Hkv * D});
  cpu_->attention_kv_pack(qkv.view({B * c, W * D}), H, kv1_rows);
  Tensor gqkv = up(qkv), gkv1 = up(kv1), gkv2 = up(kv2);
  Tensor out = host({B, c, H, D}), lse = host({B, H, c});
  Tensor gout = up(host({B, c, H, D}), DType::F32), glse = poison({B, H, c}, DType::F32);
  cpu_->fill(lse, -INFINITY);
  gpu_->fill(glse, -INFINITY);
  cpu_->attention_block_forward(qkv, kv1, true, diag, out, lse);
  cpu_->attention_block_forward(qkv, kv2, false, full, out, lse);
  gpu_->attention_block_forward(gqkv, gkv1, true, gdiag, gout, glse);
  gpu_->attention_block_forward(gqkv, gkv2, false, gfull, gout, glse);
  EXPECT_LT(rel_err(down(gout), out), 1e-5);
  EXPECT_LT(rel_err(down(glse), lse), 1e-5);
  Tensor gout16 = poison({B, c, H, D});
  gpu_->copy(gout, gout16);
  Tensor out16 = down(gout16), gdout = up(dout);
  Tensor dq = host({B, c, W, D}), dkv1 = host({B, c, 2 * Hkv, D}), dkv2 = host({B, c, 2 * Hkv, D});
  Tensor gdq = up(dq, DType::F32), gdkv1 = up(dkv1, DType::F32), gdkv2 = up(dkv2, DType::F32);
  for (Tensor* t : {&dq, &dkv1, &dkv2}) cpu_->fill(*t, 0.f);
  for (Tensor* t : {&gdq, &gdkv1, &gdkv2}) gpu_->fill(*t, 0.f);
  cpu_->attention_block_backward(dout, qkv, kv1, out16, lse, true, diag, dq, dkv1);
  cpu_->attention_block_backward(dout, qkv, kv2, out16, lse, false, full, dq, dkv2);
  gpu_->attention_block_backward(gdout, gqkv, gkv1, gout16, glse, true, gdiag, gdq, gdkv1);
  gpu_->attention_block_backward(gdout, gqkv, gkv2, gout16, glse, false, gfull, gdq, gdkv2);
  EXPECT_LT(rel_err(down(gdq), dq), 1e-3);
  EXPECT_LT(rel_err(down(gdkv1), dkv1), 1e-3);
  EXPECT_LT(rel_err(down(gdkv2), dkv2), 1e-3);
}

// Positions given per row (reset_position_ids): rope, and the learned-position embedding and its
// gradient, against the CPU.
TEST_F(CudaOpsTest, PositionsPerRowMatchCpu) {
  const int64_t N = 37, Hs = 6, D = 64, rot = 4, V = 50, C = 24, P = 16;
  std::vector<int32_t> pos, tok;
  for (int64_t n = 0; n < N; ++n) {
    pos.push_back(static_cast<int32_t>((n * 5) % 11));
    tok.push_back(static_cast<int32_t>((n * 37 + 11) % (V + 9)) - 4);
  }
  Tensor positions = ints(*cpu_, pos), gpositions = up(positions, DType::I32);
  for (bool inverse : {false, true}) {
    Tensor x = randn({N, Hs, D}, 190), gx = up(x);
    cpu_->rope_positions(x, rot, positions, 500000.0, inverse);
    gpu_->rope_positions(gx, rot, gpositions, 500000.0, inverse);
    EXPECT_LT(rel_err(down(gx), x), kBf16Tol) << "inverse " << inverse;
  }
  Tensor tokens = ints(*cpu_, tok), gtokens = up(tokens, DType::I32);
  Tensor wte = randn({V, C}, 191), wpe = randn({P, C}, 192);
  Tensor want = host({N, C}), got = poison({N, C});
  cpu_->embedding_forward_positions(tokens, wte, 4, wpe, positions, want);
  gpu_->embedding_forward_positions(gtokens, up(wte), 4, up(wpe), gpositions, got);
  EXPECT_LT(rel_err(down(got), want), kBf16Tol);
  Tensor dout = randn({N, C}, 193);
  Tensor dwte = randn({V, C}, 194, 1.f, 0.f, true), dwpe = randn({P, C}, 195, 1.f, 0.f, true);
  Tensor gdwte = up(dwte, DType::F32), gdwpe = up(dwpe, DType::F32);
  cpu_->embedding_backward_positions(tokens, dout, 4, dwte, dwpe, positions);
  gpu_->embedding_backward_positions(gtokens, up(dout), 4, gdwte, gdwpe, gpositions);
  EXPECT_LT(rel_err(down(gdwte), dwte), kF32Tol);
  EXPECT_LT(rel_err(down(gdwpe), dwpe), kF32Tol);
}

// Tokens that do not count (eod_mask_loss: negative targets) over two vocabulary shards: loss and
// lse 0, no gradient, the other rows as the CPU's.
TEST_F(CudaOpsTest, CrossEntropySkipsNegativeTargets) {
  const int64_t N = 9, rows = 64, vocab = 100, P = 2;
  std::vector<int32_t> tg;
  for (int64_t n = 0; n < N; ++n) tg.push_back(n % 3 == 1 ? -1 : static_cast<int32_t>((n * 41 + 3) % vocab));
  Tensor targets = ints(*cpu_, tg), gtargets = up(targets, DType::I32);
  Tensor parts = host({P, N, 3}), gparts = poison({P, N, 3}, DType::F32);
  std::vector<Tensor> logits, glogits;
  for (int64_t p = 0; p < P; ++p) {
    const int64_t start = p * rows, valid = std::clamp<int64_t>(vocab - start, 0, rows);
    logits.push_back(randn({N, rows}, 200 + p, 3.f));
    glogits.push_back(up(logits.back()));
    Tensor st = parts.slice(p, p + 1).view({N, 3}), gst = gparts.slice(p, p + 1).view({N, 3});
    cpu_->xent_stats(logits.back(), targets, start, valid, st);
    gpu_->xent_stats(glogits.back(), gtargets, start, valid, gst);
  }
  Tensor lse = host({N}), loss = host({N}), glse = poison({N}, DType::F32), gloss = poison({N}, DType::F32);
  cpu_->xent_combine(parts, lse, loss);
  gpu_->xent_combine(gparts, glse, gloss);
  Tensor got_loss = down(gloss), got_lse = down(glse);
  EXPECT_LT(rel_err(got_loss, loss), kF32Tol);
  for (int64_t n = 0; n < N; ++n) {
    if (tg[n] < 0) {
      EXPECT_EQ(got_loss.data<float>()[n], 0.f);
      EXPECT_EQ(got_lse.data<float>()[n], 0.f);
    }
  }
  for (int64_t p = 0; p < P; ++p) {
    const int64_t start = p * rows, valid = std::clamp<int64_t>(vocab - start, 0, rows);
    cpu_->xent_backward(logits[p], targets, start, valid, lse, 1.0f / N);
    gpu_->xent_backward(glogits[p], gtargets, start, valid, glse, 1.0f / N);
    Tensor got = down(glogits[p]);
    EXPECT_LT(rel_err(got, logits[p]), kBf16Tol);
    for (int64_t n = 0; n < N; ++n) {
      if (tg[n] < 0) {
        for (int64_t j = 0; j < rows; ++j) ASSERT_EQ(got.data<float>()[n * rows + j], 0.f) << "row " << n;
      }
    }
  }
}

// Attention against a KV cache: a prefill then single tokens, on the GPU (bf16 caches) and the
// CPU from the same bf16-rounded qkv; the outputs and the caches agree.
TEST_F(CudaOpsTest, AttentionDecodeMatchesCpu) {
  for (AttnCase c : {AttnCase{2, 9, 3, 24}, AttnCase{1, 40, 4, 64}, AttnCase{1, 17, 2, 128}, AttnCase{2, 12, 4, 64, 2},
                     AttnCase{1, 20, 4, 32, 1}}) {
    auto [B, T, H, D, unused] = c;
    const int64_t Hkv = c.kv(), W = H + 2 * Hkv, Tmax = T + 3, prefill = T / 2;
    SCOPED_TRACE(testing::Message() << B << " " << T << " " << H << " " << D << " kv " << Hkv);
    Tensor qkv = randn({B, T, W, D}, 80 + T);  // bf16 values: the GPU's caches hold them exactly
    Tensor kc = host({B, Hkv, Tmax, D}), vc = host({B, Hkv, Tmax, D});
    cpu_->fill(kc, 0.f);
    cpu_->fill(vc, 0.f);
    Tensor gk = up(kc), gv = up(vc);
    for (int64_t t0 = 0; t0 < T; t0 += (t0 == 0 ? prefill : 1)) {
      const int64_t n = t0 == 0 ? prefill : 1;
      Tensor part = host({B, n, W, D});
      for (int64_t b = 0; b < B; ++b)
        std::copy(qkv.data<float>() + (b * T + t0) * W * D, qkv.data<float>() + (b * T + t0 + n) * W * D,
                  part.data<float>() + b * n * W * D);
      Tensor out = host({B, n, H, D}), gout = poison({B, n, H, D});
      cpu_->attention_decode(part, kc, vc, t0, out);
      gpu_->attention_decode(up(part), gk, gv, t0, gout);
      EXPECT_LT(rel_err(down(gout), out), kBf16Tol) << "tokens from " << t0;
    }
    EXPECT_EQ(rel_err(down(gk), kc), 0.0) << "the caches hold the (exact bf16) keys";
    EXPECT_EQ(rel_err(down(gv), vc), 0.0);
  }
}

// ---- mixture of experts, q/k norms ------------------------------------------------------------------

// cuBLAS (the grouped GEMM) is loaded at its first use like cuBLASLt, with every function.
TEST(Cublas, LoadsWithEveryFunction) {
  const cuda::Cublas& b = cuda::cublas();
#define TRIPOD_EXPECT_LOADED(name) EXPECT_NE(b.name, nullptr) << #name;
  TRIPOD_CUBLAS_FUNCTIONS(TRIPOD_EXPECT_LOADED)
#undef TRIPOD_EXPECT_LOADED
  // The library answers (its wording of a status differs between versions: "success" in 13.x).
  const std::string ok = b.GetStatusString(CUBLAS_STATUS_SUCCESS);
  EXPECT_NE(ok.find("SUCCESS") == std::string::npos ? ok.find("success") : 0, std::string::npos) << ok;
}

// Experts' rows: sizes with an empty group, one row, and sizes that are not multiples of 8.
TEST_F(CudaOpsTest, GroupedLinearMatchesCpu) {
  for (auto [I, O] : {std::pair<int64_t, int64_t>{24, 40}, {64, 176}, {13, 7}}) {
    const std::vector<int64_t> offsets = {0, 5, 5, 6, 40, 103};
    const int64_t G = 5, R = offsets.back();
    std::vector<Tensor> w, gw, dw, gdw;
    for (int64_t g = 0; g < G; ++g) {
      w.push_back(randn({O, I}, 400 + g, 0.1f));
      gw.push_back(up(w.back()));
      dw.push_back(randn({O, I}, 420 + g, 1.f, 0.f, true));
      gdw.push_back(up(dw.back(), DType::F32));
    }
    Tensor x = randn({R, I}, 440), dy = randn({R, O}, 441);
    Tensor y = host({R, O}), dx = host({R, I});
    cpu_->grouped_linear_forward(x, w, offsets, y);
    cpu_->grouped_linear_backward_input(dy, w, offsets, dx);
    cpu_->grouped_linear_backward_weight(dy, x, offsets, dw);
    Tensor gy = poison({R, O}), gdx = poison({R, I});
    gpu_->grouped_linear_forward(up(x), gw, offsets, gy);
    gpu_->grouped_linear_backward_input(up(dy), gw, offsets, gdx);
    gpu_->grouped_linear_backward_weight(up(dy), up(x), offsets, gdw);
    EXPECT_LT(rel_err(down(gy), y), kBf16Tol) << I << " " << O;
    EXPECT_LT(rel_err(down(gdx), dx), kBf16Tol) << I << " " << O;
    for (int64_t g = 0; g < G; ++g) EXPECT_LT(rel_err(down(gdw[g]), dw[g]), 1e-4) << I << " " << O << " group " << g;
  }
}

TEST_F(CudaOpsTest, MoeRouteAndItsBackwardMatchCpu) {
  for (bool sigmoid : {false, true})
    for (bool normalize : {false, true})
      for (auto [N, E, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 4, 1}, {37, 8, 2}, {300, 64, 6}}) {
        SCOPED_TRACE(fmt::format("sigmoid {} normalize {} N {} E {} k {}", sigmoid, normalize, N, E, k));
        Tensor logits = randn({N, E}, 450, 2.f, 0.f, true), bias = randn({E}, 451, 0.05f, 0.f, true);
        Tensor idx = host({N, k}, DType::I32), weights = host({N, k}), stats = host({E + 1});
        cpu_->moe_route(logits, sigmoid ? bias : Tensor{}, sigmoid, normalize, idx, weights, stats);
        Tensor gl = up(logits, DType::F32);
        Tensor gidx = up(host({N, k}, DType::I32), DType::I32), gw = poison({N, k}, DType::F32);
        Tensor gstats = poison({E + 1}, DType::F32);
        gpu_->moe_route(gl, sigmoid ? up(bias, DType::F32) : Tensor{}, sigmoid, normalize, gidx, gw, gstats);
        Tensor hidx = down(gidx);
        for (int64_t i = 0; i < N * k; ++i) ASSERT_EQ(hidx.data<int32_t>()[i], idx.data<int32_t>()[i]) << i;
        EXPECT_LT(rel_err(down(gw), weights), kF32Tol);
        EXPECT_LT(rel_err(down(gstats), stats), kF32Tol);
        Tensor dweights = randn({N, k}, 452, 1.f, 0.f, true), aux = randn({E}, 453, 0.1f, 0.f, true);
        Tensor dlogits = host({N, E});
        cpu_->moe_route_backward(logits, idx, dweights, aux, 0.01f, sigmoid, normalize, dlogits);
        Tensor gd = poison({N, E});
        gpu_->moe_route_backward(gl, gidx, up(dweights, DType::F32), up(aux, DType::F32), 0.01f, sigmoid, normalize,
                                 gd);
        EXPECT_LT(rel_err(down(gd), dlogits), kBf16Tol);
      }
}

// The dispatch order (with and without a capacity), the permutations and the combine's backward.
TEST_F(CudaOpsTest, MoeDispatchPermutationsAndCombineMatchCpu) {
  const int64_t N = 300, E = 8, k = 2, C = 40, F = 24;
  Tensor logits = randn({N, E}, 460, 3.f, 0.f, true);
  Tensor idx = host({N, k}, DType::I32), weights = host({N, k}), stats = host({E + 1});
  cpu_->moe_route(logits, Tensor{}, false, true, idx, weights, stats);
  for (int64_t capacity : {int64_t{-1}, int64_t{60}, int64_t{1}}) {
    SCOPED_TRACE("capacity " + std::to_string(capacity));
    const int64_t rows_max = capacity < 0 ? N * k : std::min(N * k, capacity * E);
    Tensor routed = host({E}, DType::I32), row_of = host({N * k}, DType::I32), slot_of = host({rows_max}, DType::I32);
    cpu_->moe_dispatch(idx, E, capacity, routed, row_of, slot_of);
    Tensor gidx = up(idx, DType::I32), grouted = up(host({E}, DType::I32), DType::I32);
    Tensor grow = up(host({N * k}, DType::I32), DType::I32), gslot = up(host({rows_max}, DType::I32), DType::I32);
    gpu_->moe_dispatch(gidx, E, capacity, grouted, grow, gslot);
    Tensor hr = down(grouted), hrow = down(grow), hslot = down(gslot);
    int64_t R = 0;
    for (int64_t e = 0; e < E; ++e) {
      ASSERT_EQ(hr.data<int32_t>()[e], routed.data<int32_t>()[e]) << e;
      R += capacity < 0 ? routed.data<int32_t>()[e] : std::min<int64_t>(routed.data<int32_t>()[e], capacity);
    }
    for (int64_t p = 0; p < N * k; ++p) ASSERT_EQ(hrow.data<int32_t>()[p], row_of.data<int32_t>()[p]) << p;
    for (int64_t r = 0; r < R; ++r) ASSERT_EQ(hslot.data<int32_t>()[r], slot_of.data<int32_t>()[r]) << r;

    Tensor x = randn({N, C}, 461), gx = up(x), gwt = up(weights, DType::F32);
    for (bool weighted : {false, true}) {
      Tensor xp = host({R, C}), gxp = poison({R, C});
      cpu_->moe_permute(x, slot_of, k, weighted ? weights : Tensor{}, xp);
      gpu_->moe_permute(gx, gslot, k, weighted ? gwt : Tensor{}, gxp);
      EXPECT_LT(rel_err(down(gxp), xp), kBf16Tol) << "weighted " << weighted;
      Tensor yp = randn({R, C}, 462), y = host({N, C}), gy = poison({N, C});
      cpu_->moe_unpermute(yp, row_of, weighted ? weights : Tensor{}, y);
      gpu_->moe_unpermute(up(yp), grow, weighted ? gwt : Tensor{}, gy);
      EXPECT_LT(rel_err(down(gy), y), kBf16Tol) << "weighted " << weighted;
    }
    Tensor g = randn({R, F}, 463), act = randn({R, F}, 464), dweights = host({N, k});
    cpu_->fill(dweights, 0.f);
    Tensor gg = up(g), gdw = up(dweights, DType::F32);
    cpu_->moe_combine_backward(g, act, slot_of, weights, dweights);
    gpu_->moe_combine_backward(gg, up(act), gslot, gwt, gdw);
    EXPECT_LT(rel_err(down(gg), g), kBf16Tol);
    EXPECT_LT(rel_err(down(gdw), dweights), 1e-4);
  }
}

// gather_rows (expert parallelism's reorders and per-row weights): every dtype, rows of one element
// and of many, -1 rows zeroed; bit-exact (a copy).
TEST_F(CudaOpsTest, GatherRowsCopiesRowsBitExactly) {
  const int64_t rows = 57, R = 83;
  Tensor index = host({R}, DType::I32);
  for (int64_t r = 0; r < R; ++r) index.data<int32_t>()[r] = r % 7 == 3 ? -1 : static_cast<int32_t>((r * 31) % rows);
  Tensor gindex = up(index, DType::I32);
  for (DType dt : {DType::F32, DType::BF16, DType::I32})
    for (int64_t W : {int64_t{1}, int64_t{40}, int64_t{129}}) {
      SCOPED_TRACE(fmt::format("{} width {}", dtype_name(dt), W));
      Tensor x = host({rows, W}, dt);
      for (int64_t i = 0; i < rows * W; ++i) {
        if (dt == DType::F32) x.data<float>()[i] = static_cast<float>(i) * 0.25f - 3.f;
        else if (dt == DType::BF16) x.data<bf16>()[i] = bf16(static_cast<float>(i % 200) - 100.f);
        else x.data<int32_t>()[i] = static_cast<int32_t>(i * 7 - 50);
      }
      Tensor out = host({R, W}, dt), gout = gpu_->empty({R, W}, dt, MemCategory::Workspace), back = host({R, W}, dt);
      gpu_->fill(gout, dt == DType::I32 ? -7.f : std::numeric_limits<float>::quiet_NaN());
      cpu_->gather_rows(x, index, out);
      gpu_->gather_rows(up(x, dt), gindex, gout);
      gpu_->copy(gout, back);  // same dtype: the bytes
      ASSERT_EQ(0, std::memcmp(back.raw(), out.raw(), out.nbytes()));
      for (int64_t r = 0; r < R; r += 7) {  // the -1 rows are zeros
        if (index.data<int32_t>()[r] >= 0) continue;
        for (int64_t c = 0; c < W * static_cast<int64_t>(dtype_size(dt)); ++c)
          ASSERT_EQ(static_cast<const char*>(out.raw())[r * W * dtype_size(dt) + c], 0);
      }
    }
}

TEST_F(CudaOpsTest, QkNormForwardBackwardMatchCpu) {
  for (auto [N, hq, hk, D] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{1, 1, 1, 8}, {37, 4, 2, 64},
                              {300, 8, 8, 128}}) {
    const int64_t H = hq + 2 * hk, n = hq + hk;
    Tensor qkv = randn({N, H, D}, 470, 2.f), w = randn({2, D}, 471, 0.1f, 1.f);
    Tensor gqkv = up(qkv), gw = up(w);
    Tensor saved = host({N, n, D}), rstd = host({N, n});
    cpu_->qk_norm_forward(qkv, hq, hk, w, 1e-6f, saved, rstd);
    Tensor gsaved = poison({N, n, D}), grstd = poison({N, n}, DType::F32);
    gpu_->qk_norm_forward(gqkv, hq, hk, gw, 1e-6f, gsaved, grstd);
    EXPECT_LT(rel_err(down(gqkv), qkv), kBf16Tol) << N << " " << D;
    EXPECT_LT(rel_err(down(gsaved), saved), kF32Tol) << N << " " << D;  // the bf16 input, copied
    EXPECT_LT(rel_err(down(grstd), rstd), 1e-4) << N << " " << D;
    Tensor dqkv = randn({N, H, D}, 472), dw = randn({2, D}, 473, 1.f, 0.f, true);
    Tensor gd = up(dqkv), gdw = up(dw, DType::F32);
    cpu_->qk_norm_backward(dqkv, hq, saved, w, rstd, dw);
    gpu_->qk_norm_backward(gd, hq, gsaved, gw, grstd, gdw);
    EXPECT_LT(rel_err(down(gd), dqkv), kBf16Tol) << N << " " << D;
    EXPECT_LT(rel_err(down(gdw), dw), 1e-4) << N << " " << D;
  }
}

// ---- softmax cross-entropy --------------------------------------------------------------------------

TEST_F(CudaOpsTest, CrossEntropyOverVocabularyShards) {
  for (auto [N, rows, vocab] : {std::tuple<int64_t, int64_t, int64_t>{12, 256, 456}, {5, 100, 190}, {64, 1024, 2000}}) {
    const int64_t P = 2;
    std::vector<int32_t> tg;
    for (int64_t n = 0; n < N; ++n) tg.push_back(static_cast<int32_t>((n * 97 + 5) % vocab));
    Tensor targets = ints(*cpu_, tg), gtargets = up(targets, DType::I32);
    Tensor parts = host({P, N, 3});
    Tensor gparts = poison({P, N, 3}, DType::F32);
    std::vector<Tensor> logits, glogits;
    for (int64_t p = 0; p < P; ++p) {
      const int64_t start = p * rows, valid = std::clamp<int64_t>(vocab - start, 0, rows);
      logits.push_back(randn({N, rows}, 80 + p, 3.f));
      glogits.push_back(up(logits.back()));
      Tensor st = parts.slice(p, p + 1).view({N, 3}), gst = gparts.slice(p, p + 1).view({N, 3});
      cpu_->xent_stats(logits.back(), targets, start, valid, st);
      gpu_->xent_stats(glogits.back(), gtargets, start, valid, gst);
      EXPECT_LT(rel_err(down(gst), st), kF32Tol) << "shard " << p;
    }
    Tensor lse = host({N}), loss = host({N});
    cpu_->xent_combine(parts, lse, loss);
    Tensor glse = poison({N}, DType::F32), gloss = poison({N}, DType::F32);
    gpu_->xent_combine(gparts, glse, gloss);
    EXPECT_LT(rel_err(down(glse), lse), kF32Tol);
    EXPECT_LT(rel_err(down(gloss), loss), kF32Tol);
    for (int64_t p = 0; p < P; ++p) {
      const int64_t start = p * rows, valid = std::clamp<int64_t>(vocab - start, 0, rows);
      cpu_->xent_backward(logits[p], targets, start, valid, lse, 1.0f / N);
      gpu_->xent_backward(glogits[p], gtargets, start, valid, glse, 1.0f / N);
      Tensor got = down(glogits[p]);
      EXPECT_LT(rel_err(got, logits[p]), kBf16Tol) << "shard " << p;
      for (int64_t n = 0; n < N; ++n)
        for (int64_t j = valid; j < rows; ++j) ASSERT_EQ(got.data<float>()[n * rows + j], 0.f) << "padding column";
    }
  }
}

TEST_F(CudaOpsTest, CrossEntropyPropagatesNaN) {
  const int64_t N = 3, V = 128;
  Tensor logits = randn({N, V}, 90);
  logits.data<float>()[V + 17] = std::numeric_limits<float>::quiet_NaN();  // row 1
  Tensor targets = ints(*cpu_, {1, 2, 3});
  Tensor gst = poison({1, N, 3}, DType::F32), glse = poison({N}, DType::F32), gloss = poison({N}, DType::F32);
  Tensor st2 = gst.view({N, 3});
  gpu_->xent_stats(up(logits), up(targets, DType::I32), 0, V, st2);
  gpu_->xent_combine(gst, glse, gloss);
  Tensor loss = down(gloss);
  EXPECT_TRUE(std::isfinite(loss.data<float>()[0]));
  EXPECT_TRUE(std::isnan(loss.data<float>()[1]));
  EXPECT_TRUE(std::isfinite(loss.data<float>()[2]));
}

// ---- AdamW ---------------------------------------------------------------------------------------

TEST_F(CudaOpsTest, AdamWOverRangesWritesTheBf16Copy) {
  const int64_t n = 150000;
  Tensor master = randn({n}, 100, 0.02f, 0.f, true), grads = randn({n}, 101, 0.01f, 0.f, true);
  Tensor m = randn({n}, 102, 0.001f, 0.f, true), v = randn({n}, 103, 1e-4f, 0.f, true);
  for (int64_t i = 0; i < n; ++i) v.data<float>()[i] = std::abs(v.data<float>()[i]);
  const std::vector<FlatRange> ranges{{0, 1000, true}, {1000, 1003, false}, {1100, 140000, true}, {140000, n, false}};
  const AdamWHyper h{.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .step = 3,
                     .grad_scale = 0.5f};
  Tensor gmaster = up(master, DType::F32), ggrads = up(grads, DType::F32), gm = up(m, DType::F32),
         gv = up(v, DType::F32);
  Tensor copy = poison({n});
  Tensor before = clone(*cpu_, master);
  Tensor no_copy;
  cpu_->adamw(master, grads, m, v, ranges, h, no_copy);
  gpu_->adamw(gmaster, ggrads, gm, gv, ranges, h, copy);
  Tensor got = down(gmaster);
  EXPECT_LT(rel_err(got, master), kF32Tol);
  EXPECT_LT(rel_err(down(gm), m), kF32Tol);
  EXPECT_LT(rel_err(down(gv), v), kF32Tol);
  Tensor c = down(copy);
  for (int64_t i = 0; i < n; ++i) {
    const bool updated = !(i >= 1003 && i < 1100);
    if (updated)
      ASSERT_EQ(c.data<float>()[i], static_cast<float>(bf16(got.data<float>()[i]))) << i;
    else
      ASSERT_EQ(got.data<float>()[i], before.data<float>()[i]) << "element outside the ranges changed: " << i;
  }
}

// ---- timing ---------------------------------------------------------------------------------------

TEST_F(CudaOpsTest, TimesOpFamilies) {
  Tensor x = up(randn({256, 256}, 110)), w = up(randn({256, 256}, 111, 0.05f)), y = poison({256, 256});
  gpu_->set_timing(true);
  gpu_->linear_forward(x, w, Tensor{}, y);
  gpu_->gelu_forward(y, x);
  OpTimes t = gpu_->take_times();
  EXPECT_GT(t.seconds_of(OpFamily::Gemm), 0.0);
  EXPECT_GT(t.seconds_of(OpFamily::Gelu), 0.0);
  EXPECT_EQ(t.seconds_of(OpFamily::Attention), 0.0);
  EXPECT_EQ(t.calls_of(OpFamily::Gemm), 1);
  EXPECT_EQ(t.calls_of(OpFamily::Gelu), 1);
  EXPECT_EQ(t.total_calls(), 2);
  EXPECT_EQ(gpu_->take_times().total_calls(), 0);
}

// The compute clock (straggler detection) times the GPU's work, not the launches: 20 GEMMs of
// 137 GFLOP each take at least their FLOPs over this GPU's datasheet peak, though the host only
// queues them inside the region.
TEST_F(CudaOpsTest, ComputeClockTimesTheGpuWork) {
  const int64_t n = 4096;
  Tensor x = gpu_->empty({n, n}, gpu_->compute_dtype(), MemCategory::Workspace);
  Tensor w = gpu_->empty({n, n}, gpu_->compute_dtype(), MemCategory::Workspace);
  Tensor y = gpu_->empty({n, n}, gpu_->compute_dtype(), MemCategory::Workspace);
  gpu_->fill(x, 0.01f);
  gpu_->fill(w, 0.02f);
  gpu_->synchronize();
  EXPECT_EQ(gpu_->take_compute_seconds(), 0.0);
  gpu_->compute_begin();
  for (int i = 0; i < 10; ++i) gpu_->linear_forward(x, w, Tensor{}, y);
  gpu_->compute_end();
  gpu_->linear_forward(x, w, Tensor{}, y);  // between regions: not counted
  gpu_->compute_begin();
  for (int i = 0; i < 10; ++i) gpu_->linear_forward(x, w, Tensor{}, y);
  gpu_->compute_end();
  const double s = gpu_->take_compute_seconds();
  const double floor_s = 20 * 2.0 * n * n * n / gpu_->peak_flops();
  EXPECT_GE(s, floor_s);
  EXPECT_LT(s, 100 * floor_s);
  EXPECT_EQ(gpu_->take_compute_seconds(), 0.0);
}

// A wrong dtype is a bug in the caller: an error naming the op and the argument, not a crash.
TEST_F(CudaOpsTest, WrongDtypeNamesTheOp) {
  Tensor x = up(randn({4, 8}, 120), DType::F32), y = poison({4, 8});
  try {
    gpu_->gelu_forward(x, y);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gelu_forward"), std::string::npos) << e.what();
  }
}

// ---- FP8 (train.precision = "fp8"): the CUDA casts and GEMMs against the CPU's emulation --------

// The hardware's saturating conversion, which the casts use, is kernels/fp8.h's (the CPU's) on
// every f32: rounding, saturation, NaN and signed zeros.
TEST(Fp8Conversion, EveryFloatConvertsAsOnTheCpu) {
  TRIPOD_REQUIRE_GPU();
  for (bool e5m2 : {false, true}) {
    const test::Fp8ConversionCheck c = test::fp8_check_every_float(e5m2);
    ASSERT_TRUE(c.error.empty()) << c.error;
    EXPECT_EQ(c.mismatches, 0u) << (e5m2 ? "e5m2" : "e4m3") << ": first at f32 bits 0x" << std::hex
                                << c.first_mismatch;
  }
}

// Bytes of an FP8 tensor (either device) on the host.
std::vector<uint8_t> fp8_bytes(Ops& ops, const Tensor& t) {
  std::vector<uint8_t> out(t.numel());
  Tensor h = Tensor::wrap(out.data(), t.shape(), t.dtype());
  ops.copy(t, h);
  return out;
}

// Casts: the same bytes (and transposes) as the CPU's from the same bf16 inputs and scales, the
// same amaxes, scales and clipped counts; shapes off the 32 x 32 tiles included.
TEST_F(CudaOpsTest, Fp8QuantizeMatchesTheCpuBitForBit) {
  for (auto [R, C] : {std::pair<int64_t, int64_t>{1, 16}, {37, 48}, {64, 100}, {1000, 96}, {8192, 256}}) {
    for (DType dt : {DType::F8E4M3, DType::F8E5M2}) {
      SCOPED_TRACE(fmt::format("({}, {}) {}", R, C, dtype_name(dt)));
      const float fmax = dt == DType::F8E4M3 ? kFp8E4M3Max : kFp8E5M2Max;
      Tensor x = randn({R, C}, 300, 2.f);
      Tensor none, gnone;
      // The scale from the amax, on both sides, with a margin.
      Tensor amax = host({1}), scale = host({2}), record = host({1});
      record.data<float>()[0] = 0.5f;
      Tensor gamax = poison({1}, DType::F32), gscale = poison({2}, DType::F32), grecord = up(record, DType::F32);
      cpu_->fp8_amax(x, amax);
      cpu_->fp8_scale(amax, fmax, 1, scale, record);
      gpu_->fp8_amax(up(x), gamax);
      gpu_->fp8_scale(gamax, fmax, 1, gscale, grecord);
      EXPECT_EQ(down(gamax).data<float>()[0], amax.data<float>()[0]);
      EXPECT_EQ(down(gscale).data<float>()[0], scale.data<float>()[0]);
      EXPECT_EQ(down(gscale).data<float>()[1], scale.data<float>()[1]);
      EXPECT_EQ(down(grecord).data<float>()[0], record.data<float>()[0]);
      // A scale 4x larger clips the largest elements: counted alike.
      for (float boost : {1.f, 4.f}) {
        Tensor s = host({2});
        s.data<float>()[0] = scale.data<float>()[0] * boost;
        s.data<float>()[1] = 1.f / s.data<float>()[0];
        Tensor q = host({R, C}, dt), qt = host({C, R}, dt), a = host({1}), sat = host({1});
        a.data<float>()[0] = 0.f;
        sat.data<float>()[0] = 3.f;
        cpu_->fp8_quantize(x, s, q, qt, a, sat);
        Tensor gq = gpu_->empty({R, C}, dt, MemCategory::Workspace), gqt = gpu_->empty({C, R}, dt, MemCategory::Workspace);
        Tensor gqt_only = gpu_->empty({C, R}, dt, MemCategory::Workspace);
        Tensor ga = gpu_->empty({1}, DType::F32, MemCategory::Workspace);
        Tensor gsat = gpu_->empty({1}, DType::F32, MemCategory::Workspace);
        gpu_->fill(ga, 0.f);
        gpu_->fill(gsat, 3.f);
        Tensor gs = up(s, DType::F32), gx = up(x);
        gpu_->fp8_quantize(gx, gs, gq, gqt, ga, gsat);
        gpu_->fp8_quantize(gx, gs, gnone, gqt_only, gnone, gnone);
        EXPECT_TRUE(fp8_bytes(*gpu_, gq) == fp8_bytes(*cpu_, q)) << "boost " << boost;
        EXPECT_TRUE(fp8_bytes(*gpu_, gqt) == fp8_bytes(*cpu_, qt)) << "boost " << boost;
        EXPECT_TRUE(fp8_bytes(*gpu_, gqt_only) == fp8_bytes(*cpu_, qt)) << "boost " << boost;
        EXPECT_EQ(down(ga).data<float>()[0], a.data<float>()[0]);
        EXPECT_EQ(down(gsat).data<float>()[0], sat.data<float>()[0]);
        if (boost > 1) {
          EXPECT_GT(sat.data<float>()[0], 3.f) << "the 4x scale should clip";
        }
      }
    }
  }
}

// The three FP8 GEMMs of a linear layer from the same FP8 bytes and scales: the forward (e4m3 x
// e4m3, bf16 out with bias and the amax of D), the input gradient (e5m2 x e4m3, bf16 out) and the
// weight gradient (e5m2 x e4m3 accumulated into f32): within bf16's rounding of the output, and
// the FP8 tensor cores' accumulation for the f32 output.
TEST_F(CudaOpsTest, Fp8GemmMatchesTheCpuEmulation) {
  struct Shape {
    int64_t R, K, C;
  };
  for (auto [R, K, C] : {Shape{16, 16, 16}, {33, 64, 48}, {128, 768, 2304}, {2000, 64, 784}, {4096, 1024, 512}}) {
    SCOPED_TRACE(fmt::format("R {} K {} C {}", R, K, C));
    auto cast = [&](const Tensor& x, DType dt, Tensor& q, Tensor& s) {
      Tensor amax = host({1}), none;
      cpu_->fp8_amax(x, amax);
      s = host({2});
      cpu_->fp8_scale(amax, dt == DType::F8E4M3 ? kFp8E4M3Max : kFp8E5M2Max, 0, s, none);
      q = host(x.shape(), dt);
      cpu_->fp8_quantize(x, s, q, none, none, none);
    };
    for (DType da : {DType::F8E4M3, DType::F8E5M2}) {
      Tensor xa = randn({R, K}, 310, da == DType::F8E5M2 ? 1e-4f : 1.f), xb = randn({C, K}, 311, 0.05f);
      Tensor a, sa, b, sb, none, gnone;
      cast(xa, da, a, sa);
      cast(xb, DType::F8E4M3, b, sb);
      Tensor ga = gpu_->empty(a.shape(), a.dtype(), MemCategory::Workspace);
      Tensor gb = gpu_->empty(b.shape(), b.dtype(), MemCategory::Workspace);
      gpu_->copy(a, ga);
      gpu_->copy(b, gb);
      Tensor gsa = up(sa, DType::F32), gsb = up(sb, DType::F32);
      // bf16 output (with a bias and the amax of D for the forward's e4m3 x e4m3).
      Tensor bias = randn({C}, 312, 0.1f);
      const bool fwd = da == DType::F8E4M3;
      Tensor want = host({R, C}), amax = host({1}), gamax = up(amax, DType::F32);
      amax.data<float>()[0] = 0.f;
      gpu_->fill(gamax, 0.f);
      cpu_->fp8_gemm(a, sa, b, sb, fwd ? bias : none, false, want, fwd ? amax : none);
      Tensor got = poison({R, C});
      gpu_->fp8_gemm(ga, gsa, gb, gsb, fwd ? up(bias) : gnone, false, got, fwd ? gamax : gnone);
      EXPECT_LT(rel_err(down(got), want), kBf16Tol) << dtype_name(da);
      if (fwd) {
        EXPECT_NEAR(down(gamax).data<float>()[0], amax.data<float>()[0], 1e-2 * amax.data<float>()[0]);
      }
      // f32 output, accumulated (the weight gradient's form) onto the product itself, so that a
      // lost accumulation or a wrong product is off by half. Hopper's FP8 tensor cores keep about
      // 14 bits of the running sum between cuBLASLt's promotions to f32: at K = 1024 an H200 was
      // 1.3e-4 (e4m3) and 1.6e-5 (e5m2) from the CPU's f32 sum.
      Tensor acc = host({R, C}), gacc;
      cpu_->copy(want, acc);
      gacc = up(acc, DType::F32);
      cpu_->fp8_gemm(a, sa, b, sb, none, true, acc, none);
      gpu_->fp8_gemm(ga, gsa, gb, gsb, gnone, true, gacc, gnone);
      EXPECT_LT(rel_err(down(gacc), acc), 1e-3) << dtype_name(da) << ": f32 accumulation";
    }
  }
}

TEST_F(CudaOpsTest, BiasBackwardMatchesCpu) {
  for (auto [N, O] : {std::pair<int64_t, int64_t>{7, 16}, {2048, 768}}) {
    Tensor dy = randn({N, O}, 320), db = randn({O}, 321, 1.f, 0.f, true), gdb = up(db, DType::F32);
    cpu_->bias_backward(dy, db);
    gpu_->bias_backward(up(dy), gdb);
    EXPECT_LT(rel_err(down(gdb), db), kF32Tol);
  }
}

}  // namespace
}  // namespace tripod
