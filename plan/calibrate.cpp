// Timing the backend's kernels and the communicator's transfers on the ranks of this machine.
#include "plan/calibrate.h"

#include <algorithm>
#include <chrono>
#include <set>
#include <tuple>

#include "core/error.h"

namespace tripod {

namespace {

// Median of `repeats` timings of f (after one warm-up run), each waiting for the device. Each
// timing loops f for at least `min_time` seconds and divides: on a machine shared with other
// processes the time slices a rank loses are then part of the rate, as they are in training.
// Collectives pass `comm` so that every rank loops the same number of times.
template <class F>
double median_time(Ops& ops, const CalibrateGrid& g, F&& f, Communicator* comm = nullptr) {
  using clock = std::chrono::steady_clock;
  auto t0 = clock::now();
  f();
  ops.synchronize();
  double once = std::chrono::duration<double>(clock::now() - t0).count();
  if (comm) {
    float v = static_cast<float>(once);
    Tensor t = Tensor::wrap(&v, {1}, DType::F32);
    comm->all_reduce(t, ReduceOp::Max);
    once = v;
  }
  const int iters = std::clamp(static_cast<int>(g.min_time_s / std::max(once, 1e-7)), 1, 100000);
  std::vector<double> t;
  for (int i = 0; i < g.repeats; ++i) {
    t0 = clock::now();
    for (int k = 0; k < iters; ++k) f();
    ops.synchronize();
    t.push_back(std::chrono::duration<double>(clock::now() - t0).count() / iters);
  }
  std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
  return t[t.size() / 2];
}

Tensor filled(Ops& ops, Shape shape, DType dtype, float value) {
  Tensor t = ops.empty(std::move(shape), dtype, MemCategory::Workspace);
  ops.fill(t, value);
  return t;
}

void measure_gemms(Ops& ops, const CalibrateGrid& g, Hardware& hw) {
  const DType a = ops.compute_dtype();
  std::vector<GemmPoint> shapes = g.gemm_shapes;
  for (int64_t m : g.gemm_m)
    for (int64_t n : g.gemm_nk)
      for (int64_t k : g.gemm_nk) shapes.push_back({m, n, k});
  for (const GemmPoint& shape : shapes) {
    const int64_t m = shape.m, n = shape.n, k = shape.k;
    Tensor x = filled(ops, {m, k}, a, 0.01f), w = filled(ops, {n, k}, a, 0.01f), b = filled(ops, {n}, a, 0.f);
    Tensor y = ops.empty({m, n}, a, MemCategory::Workspace);
    Tensor dx = ops.empty({m, k}, a, MemCategory::Workspace);
    Tensor dw = filled(ops, {n, k}, DType::F32, 0.f), db = filled(ops, {n}, DType::F32, 0.f);
    GemmPoint p{m, n, k};
    p.forward_s = median_time(ops, g, [&] { ops.linear_forward(x, w, b, y); });
    p.backward_s = median_time(ops, g, [&] { ops.linear_backward(y, x, w, dx, dw, db); });
    hw.gemm.push_back(p);
  }
}

void measure_attention(Ops& ops, const CalibrateGrid& g, Hardware& hw) {
  const DType a = ops.compute_dtype();
  for (int64_t d : g.attention_d)
    for (int64_t t : g.attention_t) {
      // Enough (sequence, head) pairs for a few MFLOPs or more per call.
      const int64_t pairs = std::clamp<int64_t>((int64_t{1} << 26) / (t * t * d), 1, 64);
      Tensor qkv = filled(ops, {1, t, 3, pairs, d}, a, 0.01f);
      Tensor out = ops.empty({1, t, pairs, d}, a, MemCategory::Workspace);
      Tensor lse = ops.empty({1, pairs, t}, DType::F32, MemCategory::Workspace);
      Tensor probs = ops.keeps_attention_probs() ? ops.empty({1, pairs, t, t}, a, MemCategory::Workspace) : Tensor{};
      Tensor dout = filled(ops, {1, t, pairs, d}, a, 0.01f);
      Tensor dqkv = ops.empty({1, t, 3, pairs, d}, a, MemCategory::Workspace);
      AttentionPoint p{t, d};
      p.forward_s = median_time(ops, g, [&] { ops.attention_forward(qkv, out, lse, probs); }) / pairs;
      p.backward_s =
          median_time(ops, g, [&] { ops.attention_backward(dout, qkv, out, lse, probs, dqkv); }) / pairs;
      hw.attention.push_back(p);
    }
}

// Per-element times of the memory-bound families, at sizes of a small layer's tensors.
void measure_elementwise(Ops& ops, const CalibrateGrid& g, Hardware& hw) {
  const DType a = ops.compute_dtype();
  const int64_t N = 2048, C = 512, V = 2048;
  auto set = [&](Elementwise e, int64_t elements, double fwd, double bwd) {
    hw.elementwise[static_cast<int>(e)] = {fwd / elements, bwd / elements};
  };
  Tensor x = filled(ops, {N, C}, a, 0.01f), y = ops.empty({N, C}, a, MemCategory::Workspace);
  Tensor dx = filled(ops, {N, C}, a, 0.f);
  Tensor w = filled(ops, {C}, a, 1.f), b = filled(ops, {C}, a, 0.f);
  Tensor mean = ops.empty({N}, DType::F32, MemCategory::Workspace), rstd = ops.empty({N}, DType::F32, MemCategory::Workspace);
  Tensor dw = filled(ops, {C}, DType::F32, 0.f), db = filled(ops, {C}, DType::F32, 0.f);
  ops.layernorm_forward(x, w, b, 1e-5f, y, mean, rstd);
  set(Elementwise::LayerNorm, N * C, median_time(ops, g, [&] { ops.layernorm_forward(x, w, b, 1e-5f, y, mean, rstd); }),
      median_time(ops, g, [&] { ops.layernorm_backward(y, x, w, mean, rstd, dx, dw, db); }));
  set(Elementwise::Gelu, N * C, median_time(ops, g, [&] { ops.gelu_forward(x, y); }),
      median_time(ops, g, [&] { ops.gelu_backward(x, y, dx); }));
  // A residual add forward; its backward accumulates the gradient into the other branch's.
  set(Elementwise::Add, N * C, median_time(ops, g, [&] { ops.add(x, y, dx); }),
      median_time(ops, g, [&] { ops.accumulate(dx, y); }));

  Tensor logits = filled(ops, {N, V}, a, 0.f), targets = filled(ops, {N}, DType::I32, 1.f);
  Tensor stats = ops.empty({N, 3}, DType::F32, MemCategory::Workspace);
  Tensor lse = filled(ops, {N}, DType::F32, 8.f);
  set(Elementwise::CrossEntropy, N * V, median_time(ops, g, [&] { ops.xent_stats(logits, targets, 0, V, stats); }),
      median_time(ops, g, [&] {
        ops.fill(logits, 0.f);  // the backward works in place
        ops.xent_backward(logits, targets, 0, V, lse, 1.f / N);
      }));

  Tensor tokens = filled(ops, {N}, DType::I32, 3.f), wte = filled(ops, {V, C}, a, 0.01f), wpe = filled(ops, {N, C}, a, 0.f);
  Tensor dwte = filled(ops, {V, C}, DType::F32, 0.f), dwpe = filled(ops, {N, C}, DType::F32, 0.f);
  set(Elementwise::Embedding, N * C, median_time(ops, g, [&] { ops.embedding_forward(tokens, wte, 0, wpe, N, y); }),
      median_time(ops, g, [&] { ops.embedding_backward(tokens, x, 0, dwte, dwpe, N); }));

  const int64_t P = N * C;
  Tensor master = filled(ops, {P}, DType::F32, 0.01f), grads = filled(ops, {P}, DType::F32, 0.001f);
  Tensor m1 = filled(ops, {P}, DType::F32, 0.f), m2 = filled(ops, {P}, DType::F32, 0.f);
  Tensor copy = a == DType::F32 ? Tensor{} : ops.empty({P}, a, MemCategory::Workspace);
  FlatRange range{0, P, true};
  AdamWHyper h;
  h.lr = 1e-4f;
  const double adam = median_time(ops, g, [&] { ops.adamw(master, grads, m1, m2, {&range, 1}, h, copy); });
  set(Elementwise::AdamW, P, adam, adam);

  // The datasheet figure the cost model falls back on: the add's bytes over its time.
  hw.memory_bandwidth = 3.0 * dtype_size(a) / hw.elementwise[static_cast<int>(Elementwise::Add)].forward_s;
}

void measure_collectives(Ops& ops, Communicator& comm, const CalibrateGrid& g, Hardware& hw) {
  const int n = comm.size(), r = comm.rank();
  for (int64_t bytes : g.message_bytes) {
    const int64_t elems = std::max<int64_t>(n, bytes / 4 / n * n);
    Tensor full = filled(ops, {elems}, DType::F32, 1.f), part = filled(ops, {elems / n}, DType::F32, 1.f);
    const int64_t b = elems * 4;
    hw.collectives.push_back({Collective::AllReduce, n, b, median_time(ops, g, [&] { comm.all_reduce(full); }, &comm)});
    hw.collectives.push_back({Collective::AllGather, n, b, median_time(ops, g, [&] { comm.all_gather(part, full); }, &comm)});
    hw.collectives.push_back(
        {Collective::ReduceScatter, n, b, median_time(ops, g, [&] { comm.reduce_scatter(full, part); }, &comm)});
    // Ping-pong between ranks 0 and 1: half the round trip is one message.
    const double round = median_time(ops, g, [&] {
      if (r == 0) {
        comm.isend(full, 1, 7)->wait();
        comm.irecv(full, 1, 8)->wait();
      } else if (r == 1) {
        comm.irecv(full, 0, 7)->wait();
        comm.isend(full, 0, 8)->wait();
      }
    }, &comm);
    hw.collectives.push_back({Collective::SendRecv, 2, b, round / 2});
    comm.barrier();
  }
  // The link figures for shapes beyond the table: the largest message's rate, the smallest's time.
  const CollectivePoint* small = nullptr;
  const CollectivePoint* large = nullptr;
  for (const CollectivePoint& p : hw.collectives)
    if (p.op == Collective::SendRecv) {
      if (!small || p.bytes < small->bytes) small = &p;
      if (!large || p.bytes > large->bytes) large = &p;
    }
  hw.intra = {large->bytes / large->seconds / hw.collective_efficiency, small->seconds};
  hw.inter = hw.intra;
}

}  // namespace

CalibrateGrid default_grid(Device device) {
  CalibrateGrid g;
  if (device == Device::CPU) {
    g.gemm_m = {256, 1024, 4096};
    g.gemm_nk = {64, 128, 256, 512, 1024};
    g.attention_t = {64, 128, 256, 512, 1024};
    g.attention_d = {32, 64};
    g.message_bytes = {4096, 65536, 1 << 20, 16 << 20};
  } else {
    g.gemm_m = {2048, 8192, 32768};
    g.gemm_nk = {512, 1024, 2048, 4096, 8192, 16384};
    g.attention_t = {512, 1024, 2048, 4096, 8192};
    g.attention_d = {64, 128};
    g.message_bytes = {65536, 1 << 20, 16 << 20, 256 << 20};
  }
  return g;
}

CalibrateGrid model_grid(Device device, const ModelConfig& model, int max_tp, const std::vector<int>& micro_batches) {
  CalibrateGrid g = default_grid(device);
  g.gemm_m.clear();
  g.gemm_nk.clear();
  g.attention_t = {model.seq_len};
  g.attention_d = {model.head_dim()};
  const int64_t C = model.d_model, F = model.ffn();
  std::set<std::tuple<int64_t, int64_t, int64_t>> seen;
  for (int tp = 1; tp <= max_tp; ++tp) {
    if (model.n_heads % tp || F % tp) continue;
    const int64_t V = model.padded_vocab(tp) / tp;
    for (int mbs : micro_batches) {
      const int64_t N = int64_t{mbs} * model.seq_len;
      for (auto [n, k] : {std::pair{3 * C / tp, C}, {C, C / tp}, {F / tp, C}, {C, F / tp}, {V, C}})
        if (seen.insert({N, n, k}).second) g.gemm_shapes.push_back({N, n, k});
      g.message_bytes.push_back(N * C * 4);
    }
  }
  std::sort(g.message_bytes.begin(), g.message_bytes.end());
  g.message_bytes.erase(std::unique(g.message_bytes.begin(), g.message_bytes.end()), g.message_bytes.end());
  return g;
}

void calibrate(Ops& ops, Communicator* world, const CalibrateGrid& grid, Hardware& hw) {
  hw.gemm.clear();
  hw.attention.clear();
  hw.collectives.clear();
  hw.device = ops.device();
  hw.peak_flops = ops.peak_flops();
  if (hw.device == Device::CPU) hw.peak_flops_f32 = hw.peak_flops;
  measure_gemms(ops, grid, hw);
  measure_attention(ops, grid, hw);
  measure_elementwise(ops, grid, hw);
  if (world && world->size() > 1) {
    measure_collectives(ops, *world, grid, hw);
  } else if (hw.intra.bandwidth == 0) {
    // One rank and no datasheet: nothing to transfer; links at the memory copy rate.
    hw.intra = hw.inter = {hw.memory_bandwidth, 0};
  }
}

}  // namespace tripod
