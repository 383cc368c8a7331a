// The CPU backend's per-op-family timing (kernels/op_timing.h): off, it records nothing; on, every
// op counts once in its own family, with the wall time it took.
#include <chrono>
#include <functional>
#include <thread>

#include "kernels/op.h"
#include "test_util.h"

namespace tripod {
namespace {

using test::host_tensor;
using test::random_tensor;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TEST(OpTiming, OffRecordsNothing) {
  auto ops = make_ops(Device::CPU);
  const int64_t N = 64, C = 128;
  Tensor x = random_tensor({N, C}, 1), w = random_tensor({C, C}, 2), y = host_tensor({N, C});
  Tensor g = random_tensor({C}, 3), b = random_tensor({C}, 4), mean = host_tensor({N}), rstd = host_tensor({N});
  ops->linear_forward(x, w, Tensor{}, y);  // off by default
  ops->layernorm_forward(x, g, b, 1e-5f, y, mean, rstd);
  EXPECT_EQ(ops->take_times().total_calls(), 0);
  ops->set_timing(true);
  ops->linear_forward(x, w, Tensor{}, y);
  ops->set_timing(false);
  ops->layernorm_forward(x, g, b, 1e-5f, y, mean, rstd);
  const OpTimes t = ops->take_times();
  EXPECT_EQ(t.total_calls(), 1);
  EXPECT_EQ(t.calls_of(OpFamily::Gemm), 1);
  EXPECT_EQ(t.seconds_of(OpFamily::LayerNorm), 0.0);
}

TEST(OpTiming, GemmAndLayerNormTakeTheirWallTimeInTheirFamilies) {
  auto ops = make_ops(Device::CPU);
  const int64_t N = 256, C = 512;
  Tensor x = random_tensor({N, C}, 1), w = random_tensor({C, C}, 2), y = host_tensor({N, C});
  Tensor g = random_tensor({C}, 3), b = random_tensor({C}, 4), mean = host_tensor({N}), rstd = host_tensor({N});
  ops->set_timing(true);
  auto t0 = std::chrono::steady_clock::now();
  ops->linear_forward(x, w, Tensor{}, y);
  const double gemm_wall = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 3; ++i) ops->layernorm_forward(x, g, b, 1e-5f, y, mean, rstd);
  const double norm_wall = seconds_since(t0);
  const OpTimes t = ops->take_times();

  EXPECT_EQ(t.calls_of(OpFamily::Gemm), 1);
  EXPECT_EQ(t.calls_of(OpFamily::LayerNorm), 3);
  EXPECT_EQ(t.total_calls(), 4);
  // In seconds, within the wall time around the calls, and most of it (a 67 MFLOP GEMM takes
  // far longer than the two clock reads the timer adds).
  EXPECT_GT(t.seconds_of(OpFamily::Gemm), 0.0);
  EXPECT_LE(t.seconds_of(OpFamily::Gemm), gemm_wall);
  EXPECT_GE(t.seconds_of(OpFamily::Gemm), 0.5 * gemm_wall);
  EXPECT_GT(t.seconds_of(OpFamily::LayerNorm), 0.0);
  EXPECT_LE(t.seconds_of(OpFamily::LayerNorm), norm_wall);
  EXPECT_EQ(t.total_seconds(), t.seconds_of(OpFamily::Gemm) + t.seconds_of(OpFamily::LayerNorm));
  // Taking the times starts anew.
  EXPECT_EQ(ops->take_times().total_calls(), 0);
  EXPECT_EQ(ops->take_times().total_seconds(), 0.0);
}

// Every op of the interface, with small valid arguments, counts once in the family
// kernels/op_timing.h gives it, and in no other.
TEST(OpTiming, EveryOpCountsOnceInItsFamily) {
  auto ops = make_ops(Device::CPU);
  Ops& o = *ops;
  const int64_t B = 2, T = 4, N = B * T, C = 8, H = 2, D = C / H, V = 16, F = 6;
  Tensor tokens = host_tensor({N}, DType::I32);
  for (int64_t i = 0; i < N; ++i) tokens.data<int32_t>()[i] = static_cast<int32_t>((3 * i) % V);
  Tensor x = random_tensor({N, C}, 1), x2 = random_tensor({N, C}, 2), y = host_tensor({N, C});
  Tensor dx = host_tensor({N, C}), w = random_tensor({C}, 3), bias = random_tensor({C}, 4);
  Tensor dw = host_tensor({C}), db = host_tensor({C}), mean = host_tensor({N}), rstd = host_tensor({N});
  Tensor wl = random_tensor({C, C}, 5), dwl = host_tensor({C, C}), pre = host_tensor({N, C});
  Tensor wte = random_tensor({V, C}, 6), wpe = random_tensor({T, C}, 7), dwte = host_tensor({V, C});
  Tensor dwpe = host_tensor({T, C}), gu = random_tensor({N, 2 * F}, 8), yf = host_tensor({N, F});
  Tensor dyf = random_tensor({N, F}, 9), dgu = host_tensor({N, 2 * F});
  Tensor qkv = random_tensor({B, T, 3 * H, D}, 10), att = host_tensor({B, T, H, D}), lse = host_tensor({B, H, T});
  Tensor probs = host_tensor({B, H, T, T}), datt = random_tensor({B, T, H, D}, 11), rq = random_tensor({N, H, D}, 14);
  Tensor dqkv = host_tensor({B, T, 3 * H, D}), kc = host_tensor({B, H, T, D}), vc = host_tensor({B, H, T, D});
  Tensor logits = random_tensor({N, V}, 12), stats = host_tensor({1, N, 3}), loss = host_tensor({N});
  Tensor master = random_tensor({N, C}, 13), m = host_tensor({N, C}), v = host_tensor({N, C});
  o.fill(m, 0.f);
  o.fill(v, 0.f);
  o.fill(dw, 0.f);
  o.fill(db, 0.f);
  o.fill(dwl, 0.f);
  o.fill(dwte, 0.f);
  o.fill(dwpe, 0.f);
  const FlatRange all[] = {{.begin = 0, .end = N * C, .decay = true}};
  Tensor none;
  // Packed documents: rows [0, 3) [3, 4) of sequence 0, all of sequence 1; positions in them.
  const std::vector<int32_t> offsets = {0, 3, 4, 8}, starts = {0, 0, 0, 3, 0, 0, 0, 0};
  Tensor positions = host_tensor({N}, DType::I32), start = host_tensor({B, T}, DType::I32);
  for (int64_t i = 0; i < N; ++i) {
    start.data<int32_t>()[i] = starts[i];
    positions.data<int32_t>()[i] = static_cast<int32_t>(i % T - starts[i]);
  }
  const DocRows docs{.offsets = offsets, .start = start};

  struct Case {
    const char* op;
    OpFamily family;
    std::function<void()> run;
  };
  const std::vector<Case> cases = {
      {"fill", OpFamily::Memory, [&] { o.fill(y, 1.f); }},
      {"copy", OpFamily::Memory, [&] { o.copy(x, y); }},
      {"add", OpFamily::Elementwise, [&] { o.add(x, x2, y); }},
      {"accumulate", OpFamily::Elementwise, [&] { o.accumulate(y, x); }},
      {"scale", OpFamily::Elementwise, [&] { o.scale(y, 0.5f); }},
      {"sum_squares", OpFamily::Reduction, [&] { o.sum_squares(x, all); }},
      {"sum", OpFamily::Reduction, [&] { o.sum(x); }},
      {"embedding_forward", OpFamily::Embedding, [&] { o.embedding_forward(tokens, wte, 0, wpe, T, y); }},
      {"embedding_backward", OpFamily::Embedding, [&] { o.embedding_backward(tokens, x, 0, dwte, dwpe, T); }},
      {"layernorm_forward", OpFamily::LayerNorm, [&] { o.layernorm_forward(x, w, bias, 1e-5f, y, mean, rstd); }},
      {"layernorm_backward", OpFamily::LayerNorm, [&] { o.layernorm_backward(x2, x, w, mean, rstd, dx, dw, db); }},
      {"rmsnorm_forward", OpFamily::LayerNorm, [&] { o.rmsnorm_forward(x, w, 1e-5f, y, rstd); }},
      {"rmsnorm_backward", OpFamily::LayerNorm, [&] { o.rmsnorm_backward(x2, x, w, rstd, dx, dw); }},
      {"rope", OpFamily::Attention, [&] { o.rope(rq, H, T, 0, 10000.0, false); }},
      {"rope_positions", OpFamily::Attention, [&] { o.rope_positions(rq, H, positions, 10000.0, false); }},
      {"embedding_forward_positions", OpFamily::Embedding,
       [&] { o.embedding_forward_positions(tokens, wte, 0, wpe, positions, y); }},
      {"embedding_backward_positions", OpFamily::Embedding,
       [&] { o.embedding_backward_positions(tokens, x, 0, dwte, dwpe, positions); }},
      {"attention_forward_docs", OpFamily::Attention, [&] { o.attention_forward_docs(qkv, docs, att, lse); }},
      {"attention_backward_docs", OpFamily::Attention,
       [&] { o.attention_backward_docs(datt, qkv, att, lse, docs, dqkv); }},
      {"swiglu_forward", OpFamily::Gelu, [&] { o.swiglu_forward(gu, yf); }},
      {"swiglu_backward", OpFamily::Gelu, [&] { o.swiglu_backward(gu, dyf, dgu); }},
      {"linear_forward", OpFamily::Gemm, [&] { o.linear_forward(x, wl, bias, y); }},
      {"linear_backward", OpFamily::Gemm, [&] { o.linear_backward(x2, x, wl, dx, dwl, db); }},
      {"linear_backward_input", OpFamily::Gemm, [&] { o.linear_backward_input(x2, wl, dx); }},
      {"linear_backward_weight", OpFamily::Gemm, [&] { o.linear_backward_weight(x2, x, dwl, db); }},
      {"gelu_forward", OpFamily::Gelu, [&] { o.gelu_forward(x, y); }},
      {"gelu_backward", OpFamily::Gelu, [&] { o.gelu_backward(x, x2, dx); }},
      {"attention_forward", OpFamily::Attention, [&] { o.attention_forward(qkv, att, lse, probs); }},
      {"attention_backward", OpFamily::Attention, [&] { o.attention_backward(datt, qkv, att, lse, probs, dqkv); }},
      {"attention_decode", OpFamily::Attention, [&] { o.attention_decode(qkv, kc, vc, 0, att); }},
      {"xent_stats", OpFamily::Xent, [&] { o.xent_stats(logits, tokens, 0, V, stats); }},
      {"xent_combine", OpFamily::Xent, [&] { o.xent_combine(stats, lse, loss); }},
      {"xent_backward", OpFamily::Xent, [&] { o.xent_backward(logits, tokens, 0, V, lse, 1.f / N); }},
      {"adamw", OpFamily::Optimizer,
       [&] { o.adamw(master, x, m, v, all, AdamWHyper{.lr = 1e-3f, .weight_decay = 0.1f}, none); }},
  };
  o.set_timing(true);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.op);
    c.run();
    const OpTimes t = o.take_times();
    EXPECT_EQ(t.calls_of(c.family), 1) << "expected in " << op_family_name(c.family);
    EXPECT_EQ(t.total_calls(), 1);
    EXPECT_EQ(t.total_seconds(), t.seconds_of(c.family));
  }
  // The CPU backend runs linear_gelu_forward as the interface's two ops, each in its family.
  o.linear_gelu_forward(x, wl, bias, pre, y);
  const OpTimes t = o.take_times();
  EXPECT_EQ(t.calls_of(OpFamily::Gemm), 1);
  EXPECT_EQ(t.calls_of(OpFamily::Gelu), 1);
  EXPECT_EQ(t.total_calls(), 2);
}

// The compute clock (straggler detection) sums the CPU time of its regions only: a rank asleep or
// descheduled inside one is not computing, and work between regions does not count.
TEST(ComputeClock, CountsTheCpuTimeOfItsRegionsOnly) {
  auto ops = make_ops(Device::CPU);
  EXPECT_EQ(ops->take_compute_seconds(), 0.0);
  const auto t0 = std::chrono::steady_clock::now();
  ops->compute_begin();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ops->compute_end();
  EXPECT_GE(seconds_since(t0), 0.3);
  EXPECT_LT(ops->take_compute_seconds(), 0.05);

  const int64_t N = 256, C = 512;
  Tensor x = random_tensor({N, C}, 1), w = random_tensor({C, C}, 2), y = host_tensor({N, C});
  ops->compute_begin();
  for (int i = 0; i < 5; ++i) ops->linear_forward(x, w, Tensor{}, y);
  ops->compute_end();
  for (int i = 0; i < 5; ++i) ops->linear_forward(x, w, Tensor{}, y);  // outside: not counted
  ops->compute_begin();
  ops->linear_forward(x, w, Tensor{}, y);
  ops->compute_end();
  const double two_regions = ops->take_compute_seconds();
  EXPECT_GT(two_regions, 0.0);
  EXPECT_EQ(ops->take_compute_seconds(), 0.0);  // taking starts anew
}

}  // namespace
}  // namespace tripod
