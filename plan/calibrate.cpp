// Timing the backend's kernels and the communicator's transfers on the ranks of this machine.
#include "plan/calibrate.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <numeric>
#include <set>
#include <tuple>

#include "core/allocator.h"
#include "core/error.h"
#include "core/rng.h"

namespace tripod {

namespace {

// Bytes of a shape's tensors while it is timed (inputs, outputs, gradients; f32 where training
// keeps them in f32), to leave out what the device cannot hold.
int64_t gemm_bytes(const GemmPoint& p, int64_t a) { return a * (2 * p.m * p.k + 2 * p.m * p.n + p.n * p.k) + 4 * p.n * p.k; }
int64_t attention_bytes(const AttentionShape& s, int64_t a, bool probs) {
  const int64_t qkv = s.batch * s.t * (s.heads + 2 * s.kv()) * s.d;  // qkv, dqkv; out, dout
  return a * (2 * qkv + 2 * s.pairs() * s.t * s.d) + 4 * s.pairs() * s.t + (probs ? a * s.pairs() * s.t * s.t : 0);
}
int64_t elementwise_bytes(const ElementwiseShape& s, int64_t a) {
  switch (s.op) {
    case Elementwise::AdamW: return s.elements() * (16 + a);
    case Elementwise::Embedding: return 3 * a * s.elements() + (a + 4) * s.vocab * s.width;
    case Elementwise::SwiGlu: return 5 * a * s.elements();
    default: return 3 * a * s.elements();
  }
}

// The median of `repeats` timings, each `mean(iters)`: the mean seconds of `iters` calls, as many
// as fill `min_time` at `once`, one call's time (the same count on every rank).
template <class Mean>
double median_timing(const CalibrateGrid& g, double once, Mean&& mean) {
  const int iters = std::clamp(static_cast<int>(g.min_time_s / std::max(once, 1e-7)), 1, 100000);
  std::vector<double> t;
  for (int i = 0; i < g.repeats; ++i) t.push_back(mean(iters));
  std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
  return t[t.size() / 2];
}

// f's median time (after one warm-up call), waiting for the device. Each timing loops f for at
// least `min_time` seconds and divides: on a machine shared with other processes the time slices
// a rank loses are then part of the rate, as they are in training.
template <class F>
double median_time(Ops& ops, const CalibrateGrid& g, F&& f) {
  using clock = std::chrono::steady_clock;
  auto loop = [&](int iters) {
    const auto t0 = clock::now();
    for (int k = 0; k < iters; ++k) f();
    ops.synchronize();
    return std::chrono::duration<double>(clock::now() - t0).count() / iters;
  };
  return median_timing(g, loop(1), loop);
}

// The same for communication, calls made one at a time as training makes them between
// computations: `prepare` (untimed) writes the call's operand as the computation before it would,
// the ranks meet at a barrier, then f is timed alone (calls back to back would overlap one's tail
// with the next one's start).
template <class P, class F>
double median_collective_time(Ops& ops, const CalibrateGrid& g, Communicator& comm, P&& prepare, F&& f) {
  using clock = std::chrono::steady_clock;
  auto loop = [&](int iters) {
    double sum = 0;
    for (int k = 0; k < iters; ++k) {
      prepare();
      comm.barrier();
      const auto t0 = clock::now();
      f();
      ops.synchronize();
      sum += std::chrono::duration<double>(clock::now() - t0).count();
    }
    return sum / iters;
  };
  float once = static_cast<float>(loop(1));
  Tensor t = Tensor::wrap(&once, {1}, DType::F32);
  comm.all_reduce(t, ReduceOp::Max);  // every rank loops as often
  return median_timing(g, once, loop);
}

// Training's calls each read tensors other calls wrote long before (the activations a backward
// reads, the tensors a collective sends), so that a call timed over and over on the same tensors
// would find them in cache. A call whose tensors (`bytes`) `make` returns is timed on the next of
// as many copies as span twice the last-level cache, at most 64.
template <class T>
class Rotation {
 public:
  template <class Make>
  Rotation(const CalibrateGrid& g, int64_t bytes, Make&& make) {
    const int64_t n = std::clamp<int64_t>(2 * g.cache_bytes / std::max<int64_t>(bytes, 1), 1, 64);
    for (int64_t i = 0; i < n; ++i) copies_.push_back(make());
  }
  T& first() { return copies_.front(); }
  T& next() { return copies_[next_++ % copies_.size()]; }
  std::vector<T>& all() { return copies_; }

 private:
  std::vector<T> copies_;
  size_t next_ = 0;
};

Tensor filled(Ops& ops, Shape shape, DType dtype, float value) {
  Tensor t = ops.empty(std::move(shape), dtype, MemCategory::Workspace);
  ops.fill(t, value);
  return t;
}

// Normal values of `stddev`, as the operands of training's GEMMs and attention are. A GPU's
// tensor cores draw less power on a constant and keep higher clocks: on an H200 GEMMs of
// constants ran at 820-850 TFLOP/s, training's own at 650. A host pattern of a prime count of
// values (rows of any width start at different places in it), drawn once, tiled on the device by
// doubling.
Tensor random_filled(Ops& ops, Shape shape, DType dtype, float stddev) {
  constexpr int64_t kPattern = 65521;
  static const std::vector<float> unit = [] {
    const CounterRng rng(12345, hash_name("calibrate"));
    std::vector<float> v(kPattern);
    for (int64_t i = 0; i < kPattern; ++i) v[i] = static_cast<float>(rng.normal(static_cast<uint64_t>(i)));
    return v;
  }();
  Tensor t = ops.empty(std::move(shape), dtype, MemCategory::Workspace);
  const int64_t n = t.numel(), p = std::min(n, kPattern);
  if (n == 0) return t;
  std::vector<float> pattern(unit.begin(), unit.begin() + p);
  for (float& v : pattern) v *= stddev;
  Tensor all = t.view({n}), head = all.flat(0, p);
  ops.copy(Tensor::wrap(pattern.data(), {p}, DType::F32), head);
  for (int64_t done = p; done < n;) {
    const int64_t c = std::min(done, n - done);
    Tensor dst = all.flat(done, done + c);
    ops.copy(all.flat(0, c), dst);
    done += c;
  }
  return t;
}

void measure_gemms(Ops& ops, const CalibrateGrid& g, Hardware& hw) {
  const DType a = ops.compute_dtype();
  for (const GemmPoint& shape : g.gemm) {
    const int64_t m = shape.m, n = shape.n, k = shape.k;
    {
      // The backward reads the input its forward saved into a new gradient.
      struct Saved {
        Tensor x, dx;
      };
      Rotation<Saved> saved(g, 2 * dtype_size(a) * m * k, [&] {
        return Saved{random_filled(ops, {m, k}, a, 1.f), ops.empty({m, k}, a, MemCategory::Workspace)};
      });
      Tensor w = random_filled(ops, {n, k}, a, 0.02f), b = filled(ops, {n}, a, 0.f);
      Tensor y = ops.empty({m, n}, a, MemCategory::Workspace);
      Tensor dw = filled(ops, {n, k}, DType::F32, 0.f), db = filled(ops, {n}, DType::F32, 0.f);
      GemmPoint p{m, n, k};
      p.forward_s = median_time(ops, g, [&] { ops.linear_forward(saved.first().x, w, b, y); });
      p.backward_s = median_time(ops, g, [&] {
        Saved& s = saved.next();
        ops.linear_backward(y, s.x, w, s.dx, dw, db);
      });
      hw.gemm.push_back(p);
    }
    ops.allocator().release_cache();
  }
}

// Each call as training makes it: `pairs` (sequence, head) pairs of one micro-batch at once, over
// the call's key/value heads (grouped-query attention reduces its dK, dV over each group).
void measure_attention(Ops& ops, const CalibrateGrid& g, Hardware& hw) {
  const DType a = ops.compute_dtype();
  for (const AttentionShape& shape : g.attention) {
    const int64_t t = shape.t, d = shape.d, B = shape.batch, H = shape.heads, KV = shape.kv();
    {
      // The forward reads q, k, v just written; the backward reads what the forward saved (and
      // writes a new gradient).
      struct Saved {
        Tensor qkv, out, lse, probs, dqkv;
      };
      Rotation<Saved> saved(g, attention_bytes(shape, dtype_size(a), ops.keeps_attention_probs()), [&] {
        return Saved{random_filled(ops, {B, t, H + 2 * KV, d}, a, 1.f), ops.empty({B, t, H, d}, a, MemCategory::Workspace),
                     ops.empty({B, H, t}, DType::F32, MemCategory::Workspace),
                     ops.keeps_attention_probs() ? ops.empty({B, H, t, t}, a, MemCategory::Workspace) : Tensor{},
                     ops.empty({B, t, H + 2 * KV, d}, a, MemCategory::Workspace)};
      });
      Tensor dout = random_filled(ops, {B, t, H, d}, a, 1.f);
      AttentionPoint p{.t = t, .d = d, .pairs = shape.pairs()};
      Saved& s0 = saved.first();
      p.forward_s = median_time(ops, g, [&] { ops.attention_forward(s0.qkv, s0.out, s0.lse, s0.probs); });
      for (Saved& s : saved.all()) ops.attention_forward(s.qkv, s.out, s.lse, s.probs);
      p.backward_s = median_time(ops, g, [&] {
        Saved& s = saved.next();
        ops.attention_backward(dout, s.qkv, s.out, s.lse, s.probs, s.dqkv);
      });
      hw.attention.push_back(p);
    }
    ops.allocator().release_cache();
  }
}

// One memory-bound call of `s`'s size: its forward and backward times.
std::pair<double, double> time_elementwise(Ops& ops, const CalibrateGrid& g, const ElementwiseShape& s) {
  const DType a = ops.compute_dtype();
  const int64_t N = s.rows, C = s.width, E = s.elements();
  switch (s.op) {
    case Elementwise::LayerNorm: {
      // The backward reads the input and statistics its forward saved into a new gradient.
      struct Saved {
        Tensor x, mean, rstd, dx;
      };
      Tensor y = ops.empty({N, C}, a, MemCategory::Workspace);
      Tensor w = filled(ops, {C}, a, 1.f), b = filled(ops, {C}, a, 0.f);
      Tensor dw = filled(ops, {C}, DType::F32, 0.f), db = filled(ops, {C}, DType::F32, 0.f);
      Rotation<Saved> saved(g, 2 * dtype_size(a) * E + 8 * N, [&] {
        Saved s{filled(ops, {N, C}, a, 0.01f), ops.empty({N}, DType::F32, MemCategory::Workspace),
                ops.empty({N}, DType::F32, MemCategory::Workspace), filled(ops, {N, C}, a, 0.f)};  // dx accumulates
        ops.layernorm_forward(s.x, w, b, 1e-5f, y, s.mean, s.rstd);
        return s;
      });
      Saved& s0 = saved.first();
      return {median_time(ops, g, [&] { ops.layernorm_forward(s0.x, w, b, 1e-5f, y, s0.mean, s0.rstd); }),
              median_time(ops, g, [&] {
                Saved& s = saved.next();
                ops.layernorm_backward(y, s.x, w, s.mean, s.rstd, s.dx, dw, db);
              })};
    }
    case Elementwise::RmsNorm: {
      struct Saved {
        Tensor x, rstd, dx;
      };
      Tensor y = ops.empty({N, C}, a, MemCategory::Workspace), w = filled(ops, {C}, a, 1.f);
      Tensor dw = filled(ops, {C}, DType::F32, 0.f);
      Rotation<Saved> saved(g, 2 * dtype_size(a) * E + 4 * N, [&] {
        Saved s{filled(ops, {N, C}, a, 0.01f), ops.empty({N}, DType::F32, MemCategory::Workspace),
                filled(ops, {N, C}, a, 0.f)};
        ops.rmsnorm_forward(s.x, w, 1e-5f, y, s.rstd);
        return s;
      });
      Saved& s0 = saved.first();
      return {median_time(ops, g, [&] { ops.rmsnorm_forward(s0.x, w, 1e-5f, y, s0.rstd); }),
              median_time(ops, g, [&] {
                Saved& s = saved.next();
                ops.rmsnorm_backward(y, s.x, w, s.rstd, s.dx, dw);
              })};
    }
    case Elementwise::SwiGlu: {
      // gate and up (N, 2F) -> (N, F); the backward reads the saved input into a new gradient.
      struct Saved {
        Tensor gu, dgu;
      };
      Tensor y = ops.empty({N, C}, a, MemCategory::Workspace);
      Rotation<Saved> saved(g, 4 * dtype_size(a) * E, [&] {
        return Saved{filled(ops, {N, 2 * C}, a, 0.01f), ops.empty({N, 2 * C}, a, MemCategory::Workspace)};
      });
      return {median_time(ops, g, [&] { ops.swiglu_forward(saved.first().gu, y); }), median_time(ops, g, [&] {
                Saved& s = saved.next();
                ops.swiglu_backward(s.gu, y, s.dgu);
              })};
    }
    case Elementwise::Rope: {
      // In place over the query and key heads of sequences of `seq` positions; the backward is
      // the inverse rotation of a gradient (the same work).
      const int64_t D = s.head_dim, T = s.seq;
      Tensor x = filled(ops, {N, C / D, D}, a, 0.01f);
      return {median_time(ops, g, [&] { ops.rope(x, C / D, T, 0, 500000.0, false); }),
              median_time(ops, g, [&] { ops.rope(x, C / D, T, 0, 500000.0, true); })};
    }
    case Elementwise::Gelu: {
      // The backward reads the input its forward saved into a new gradient.
      struct Saved {
        Tensor x, dx;
      };
      Tensor y = ops.empty({E}, a, MemCategory::Workspace);
      Rotation<Saved> saved(g, 2 * dtype_size(a) * E,
                            [&] { return Saved{filled(ops, {E}, a, 0.01f), filled(ops, {E}, a, 0.f)}; });
      return {median_time(ops, g, [&] { ops.gelu_forward(saved.first().x, y); }), median_time(ops, g, [&] {
                Saved& s = saved.next();
                ops.gelu_backward(s.x, y, s.dx);
              })};
    }
    case Elementwise::Add: {
      // A residual add forward; its backward accumulates the gradient into the other branch's.
      Tensor x = filled(ops, {E}, a, 0.01f), y = filled(ops, {E}, a, 0.01f), out = filled(ops, {E}, a, 0.f);
      return {median_time(ops, g, [&] { ops.add(x, y, out); }), median_time(ops, g, [&] { ops.accumulate(out, y); })};
    }
    case Elementwise::CrossEntropy: {
      // Per logit: the statistics forward, the in-place gradient backward (its values stay finite
      // when it is applied again to its own output).
      Tensor logits = filled(ops, {N, C}, a, 0.f), targets = filled(ops, {N}, DType::I32, 1.f);
      Tensor stats = ops.empty({N, 3}, DType::F32, MemCategory::Workspace);
      Tensor lse = filled(ops, {N}, DType::F32, 8.f);
      return {median_time(ops, g, [&] { ops.xent_stats(logits, targets, 0, C, stats); }),
              median_time(ops, g, [&] { ops.xent_backward(logits, targets, 0, C, lse, 1.f / N); })};
    }
    case Elementwise::Embedding: {
      const int64_t T = std::min<int64_t>(N, 1024);
      Tensor tokens = filled(ops, {N}, DType::I32, 3.f), wte = filled(ops, {s.vocab, C}, a, 0.01f);
      Tensor wpe = filled(ops, {T, C}, a, 0.f), y = ops.empty({N, C}, a, MemCategory::Workspace);
      Tensor dy = filled(ops, {N, C}, a, 0.01f);
      Tensor dwte = filled(ops, {s.vocab, C}, DType::F32, 0.f), dwpe = filled(ops, {T, C}, DType::F32, 0.f);
      return {median_time(ops, g, [&] { ops.embedding_forward(tokens, wte, 0, wpe, T, y); }),
              median_time(ops, g, [&] { ops.embedding_backward(tokens, dy, 0, dwte, dwpe, T); })};
    }
    case Elementwise::AdamW: {
      Tensor master = filled(ops, {E}, DType::F32, 0.01f), grads = filled(ops, {E}, DType::F32, 0.001f);
      Tensor m1 = filled(ops, {E}, DType::F32, 0.f), m2 = filled(ops, {E}, DType::F32, 0.f);
      Tensor copy = a == DType::F32 ? Tensor{} : ops.empty({E}, a, MemCategory::Workspace);
      FlatRange range{0, E, true};
      AdamWHyper h;
      h.lr = 1e-4f;
      const double t = median_time(ops, g, [&] { ops.adamw(master, grads, m1, m2, {&range, 1}, h, copy); });
      return {t, t};
    }
    case Elementwise::Count: break;
  }
  return {0, 0};
}

void measure_elementwise(Ops& ops, const CalibrateGrid& g, Hardware& hw) {
  for (const ElementwiseShape& s : g.elementwise) {
    const auto [fwd, bwd] = time_elementwise(ops, g, s);
    hw.elementwise_points.push_back({s.op, s.elements(), fwd, bwd});
    ops.allocator().release_cache();
  }
}

// The figures the cost model falls back on beyond the tables: the memory rate of the largest
// residual add (its bytes over its time), the links of the ping-pong (the largest message's rate,
// the smallest's time) or, on one rank without a datasheet, the memory copy rate.
void fallback_rates(Hardware& hw, DType a) {
  const ElementwisePoint* add = nullptr;
  for (const ElementwisePoint& p : hw.elementwise_points)
    if (p.op == Elementwise::Add && (!add || p.elements > add->elements)) add = &p;
  if (add) hw.memory_bandwidth = 3.0 * dtype_size(a) * add->elements / add->forward_s;
  const CollectivePoint* small = nullptr;
  const CollectivePoint* large = nullptr;
  for (const CollectivePoint& p : hw.collectives)
    if (p.op == Collective::SendRecv) {
      if (!small || p.bytes < small->bytes) small = &p;
      if (!large || p.bytes > large->bytes) large = &p;
    }
  if (large) {
    hw.intra = {large->bytes / large->seconds / hw.collective_efficiency, small->seconds};
    hw.inter = hw.intra;
  } else if (hw.intra.bandwidth == 0) {
    hw.intra = hw.inter = {hw.memory_bandwidth, 0};
  }
}

void measure_collectives(Ops& ops, Communicator& comm, const CalibrateGrid& g, Hardware& hw) {
  const int n = comm.size(), r = comm.rank();
  for (int64_t bytes : g.message_bytes) {
    const int64_t elems = std::max<int64_t>(n, bytes / 4 / n * n);
    const int64_t b = elems * 4;
    {
      // Training reduces and sends a different tensor each call (one of many micro-batches'
      // activations, a gradient bucket), just written by the computation before it: a 512 KiB
      // all-reduce on two CPU ranks took 45 us on one buffer, 64 us rotating through 32 MiB.
      Rotation<std::pair<Tensor, Tensor>> buffers(g, b + b / n, [&] {
        return std::pair{ops.empty({elems}, DType::F32, MemCategory::Workspace),
                         ops.empty({elems / n}, DType::F32, MemCategory::Workspace)};
      });
      Tensor full, part;
      auto prepare = [&] {
        std::tie(full, part) = buffers.next();
        ops.fill(full, 1.f);
        ops.fill(part, 1.f);
        ops.synchronize();  // written before the clock starts (a GPU's fill is queued)
      };
      auto time = [&](auto&& f) { return median_collective_time(ops, g, comm, prepare, f); };
      hw.collectives.push_back({Collective::AllReduce, n, b, time([&] { comm.all_reduce(full); })});
      hw.collectives.push_back({Collective::AllGather, n, b, time([&] { comm.all_gather(part, full); })});
      hw.collectives.push_back({Collective::ReduceScatter, n, b, time([&] { comm.reduce_scatter(full, part); })});
      // Ping-pong between ranks 0 and 1: half the round trip is one message.
      const double round = time([&] {
        if (r == 0) {
          comm.isend(full, 1, 7)->wait();
          comm.irecv(full, 1, 8)->wait();
        } else if (r == 1) {
          comm.irecv(full, 0, 7)->wait();
          comm.isend(full, 0, 8)->wait();
        }
      });
      hw.collectives.push_back({Collective::SendRecv, 2, b, round / 2});
    }
    ops.allocator().release_cache();
    comm.barrier();
  }
}

}  // namespace

int64_t attention_tokens(Device device) { return device == Device::CPU ? int64_t{1} << 14 : int64_t{1} << 21; }

CalibrateGrid default_grid(Device device, const Ops::DeviceInfo& info) {
  CalibrateGrid g;
  const bool cpu = device == Device::CPU;
  const int64_t a = cpu ? 4 : 2;  // bytes per activation: f32 on CPUs, bf16 on GPUs
  const int64_t budget = info.memory_bytes > 0 ? info.memory_bytes / 4 : std::numeric_limits<int64_t>::max();
  g.min_time_s = cpu ? 0.05 : 0.01;

  const std::vector<int64_t> ms = cpu ? std::vector<int64_t>{256, 1024, 4096} : std::vector<int64_t>{2048, 8192, 32768, 131072};
  const std::vector<int64_t> nks = cpu ? std::vector<int64_t>{64, 128, 256, 512, 1024}
                                       : std::vector<int64_t>{512, 1024, 2048, 4096, 8192, 16384};
  for (int64_t m : ms)
    for (int64_t n : nks)
      for (int64_t k : nks)
        if (GemmPoint p{m, n, k}; gemm_bytes(p, a) <= budget) g.gemm.push_back(p);

  const std::vector<int64_t> ts = cpu ? std::vector<int64_t>{64, 128, 256, 512, 1024}
                                      : std::vector<int64_t>{512, 1024, 2048, 4096, 8192};
  for (int64_t d : cpu ? std::vector<int64_t>{32, 64} : std::vector<int64_t>{64, 128})
    for (int64_t t : ts) {
      const int64_t most = std::max<int64_t>(1, attention_tokens(device) / t);
      for (int64_t pairs = 1;; pairs = std::min(pairs * 4, most)) {
        // Up to 16 heads, then sequences (every count here is a power of two).
        const int64_t heads = std::min<int64_t>(pairs, 16);
        if (AttentionShape c{t, d, pairs / heads, heads}; attention_bytes(c, a, cpu) <= budget) g.attention.push_back(c);
        if (pairs == most) break;
      }
    }

  // From a launch's latency up to 8x the last-level cache (at least 2^24 elements on CPUs, 2^28
  // on GPUs: an H100's 50 MB L2 8 times over in bf16), by factors of 4.
  const int64_t cache = info.cache_bytes > 0 ? info.cache_bytes : (cpu ? int64_t{32} << 20 : int64_t{64} << 20);
  g.cache_bytes = cache;
  int64_t largest = cpu ? int64_t{1} << 24 : int64_t{1} << 28;
  while (largest * a < 8 * cache) largest *= 4;
  const int64_t C = cpu ? 512 : 1024, V = cpu ? 8192 : 32768;
  for (int64_t e = cpu ? int64_t{1} << 12 : int64_t{1} << 16; e <= largest; e *= 4)
    for (int i = 0; i < static_cast<int>(Elementwise::Count); ++i) {
      const Elementwise op = static_cast<Elementwise>(i);
      const int64_t rows = std::max<int64_t>(1, e / C);
      ElementwiseShape s{op, e, 1, 0};
      if (op == Elementwise::LayerNorm || op == Elementwise::RmsNorm || op == Elementwise::SwiGlu) s = {op, rows, C, 0};
      if (op == Elementwise::Embedding) s = {op, rows, C, V};
      if (op == Elementwise::Rope) s = {op, rows, C, 0, 64, std::gcd(rows, int64_t{1024})};  // heads of 64
      if (op == Elementwise::CrossEntropy) s = {op, std::max<int64_t>(1, e / V), V, 0};
      if (elementwise_bytes(s, a) <= budget) g.elementwise.push_back(s);
    }

  g.message_bytes = cpu ? std::vector<int64_t>{4096, 65536, 1 << 20, 16 << 20}
                        : std::vector<int64_t>{65536, 1 << 20, 16 << 20, 256 << 20};
  return g;
}

CalibrateGrid model_grid(Device device, const ModelConfig& model, int max_tp, const std::vector<int>& micro_batches,
                         int64_t bucket_bytes, const Ops::DeviceInfo& info) {
  CalibrateGrid g = default_grid(device, info);
  g.gemm.clear();
  g.attention.clear();
  g.elementwise.clear();
  const int64_t C = model.d_model, F = model.ffn(), T = model.seq_len;
  std::set<std::tuple<int64_t, int64_t, int64_t>> gemms, attention;
  std::set<std::tuple<int, int64_t, int64_t, int64_t>> elementwise;
  auto add_elementwise = [&](Elementwise op, int64_t rows, int64_t width, int64_t vocab) {
    const bool rope = op == Elementwise::Rope;
    if (rows >= 1 && width >= 1 && elementwise.insert({static_cast<int>(op), rows, width, vocab}).second)
      g.elementwise.push_back({op, rows, width, vocab, rope ? model.head_dim() : 0, rope ? T : 0});
  };
  const Elementwise norm = model.rms() ? Elementwise::RmsNorm : Elementwise::LayerNorm;
  for (int tp = 1; tp <= max_tp; ++tp) {
    if (model.n_heads % tp || model.kv_heads() % tp || F % tp) continue;
    const int64_t V = model.padded_vocab(tp) / tp, qkv = (model.n_heads + 2 * int64_t{model.kv_heads()}) * model.head_dim();
    const int64_t mlp_in = (model.swiglu() ? 2 : 1) * F / tp;
    for (int mbs : micro_batches) {
      const int64_t N = int64_t{mbs} * T;
      for (auto [n, k] : {std::pair{qkv / tp, C}, {C, C / tp}, {mlp_in, C}, {C, F / tp}, {V, C}})
        if (gemms.insert({N, n, k}).second) g.gemm.push_back({N, n, k});
      if (attention.insert({T, model.head_dim(), int64_t{mbs} * model.n_heads / tp}).second)
        g.attention.push_back({T, model.head_dim(), mbs, model.n_heads / tp, model.kv_heads() / tp});
      for (int64_t rows : {N, N / tp}) {  // the sequence-parallel slice too
        add_elementwise(norm, rows, C, 0);
        add_elementwise(Elementwise::Add, rows * C, 1, 0);
      }
      if (model.swiglu())
        add_elementwise(Elementwise::SwiGlu, N, F / tp, 0);
      else
        add_elementwise(Elementwise::Gelu, N * F / tp, 1, 0);
      if (model.rope())  // the query and key heads
        add_elementwise(Elementwise::Rope, N, (model.n_heads + model.kv_heads()) / tp * model.head_dim(), 0);
      add_elementwise(Elementwise::CrossEntropy, N, V, 0);
      add_elementwise(Elementwise::Embedding, N, C, V);
      g.message_bytes.push_back(N * C * 4);
    }
    for (int64_t shards : {1, 2, 4, 8}) {
      add_elementwise(Elementwise::AdamW, model.num_params(tp) / tp / shards, 1, 0);
      add_elementwise(Elementwise::Add, model.num_params(tp) / tp / shards, 1, 0);  // the gradients' zeroing and norm
    }
    // The gradient reduction's buckets (a rank's gradients when they fit in one).
    if (bucket_bytes > 0) g.message_bytes.push_back(std::min(bucket_bytes, model.num_params(tp) / tp * 4));
  }
  std::sort(g.message_bytes.begin(), g.message_bytes.end());
  g.message_bytes.erase(std::unique(g.message_bytes.begin(), g.message_bytes.end()), g.message_bytes.end());
  return g;
}

// Ranks that share a grid move in lockstep, at the pace of the slowest: two CPU ranks doing the
// same GEMMs in a tp = 2 run took 374 and 365 ms a step, and the faster waited in every all-reduce.
void keep_slowest(Communicator& world, Hardware& hw) {
  std::vector<double*> times;
  for (GemmPoint& p : hw.gemm) times.insert(times.end(), {&p.forward_s, &p.backward_s});
  for (AttentionPoint& p : hw.attention) times.insert(times.end(), {&p.forward_s, &p.backward_s});
  for (ElementwisePoint& p : hw.elementwise_points) times.insert(times.end(), {&p.forward_s, &p.backward_s});
  for (CollectivePoint& p : hw.collectives) times.push_back(&p.seconds);
  if (times.empty()) return;
  CpuAllocator host;
  Tensor t = Tensor::empty(host, {static_cast<int64_t>(times.size())}, DType::F64, MemCategory::Workspace);
  for (size_t i = 0; i < times.size(); ++i) t.data<double>()[i] = *times[i];
  world.all_reduce(t, ReduceOp::Max);
  for (size_t i = 0; i < times.size(); ++i) *times[i] = t.data<double>()[i];
}

void calibrate(Ops& ops, Communicator* world, const CalibrateGrid& grid, Hardware& hw) {
  hw.gemm.clear();
  hw.attention.clear();
  hw.elementwise_points.clear();
  for (ElementwiseRate& r : hw.elementwise) r = {};
  hw.collectives.clear();
  hw.warnings.clear();
  hw.device = ops.device();
  hw.peak_flops = ops.peak_flops();
  if (hw.device == Device::CPU) hw.peak_flops_f32 = hw.peak_flops;
  measure_gemms(ops, grid, hw);
  measure_attention(ops, grid, hw);
  measure_elementwise(ops, grid, hw);
  if (world && world->size() > 1) {
    measure_collectives(ops, *world, grid, hw);
    keep_slowest(*world, hw);
  }
  fallback_rates(hw, ops.compute_dtype());
}

}  // namespace tripod
