// Packed documents (data.reset_position_ids, reset_attention_mask, eod_mask_loss): the boundaries
// against Megatron's _get_ltor_masks_and_position_ids, and every op that takes them against a
// double-precision reference: attention within documents (whole sequences and context-parallel
// blocks, the skipped blocks and the rows that travel included), positions for the embedding and
// rope, and the cross-entropy of tokens that do not count.
#include <cmath>
#include <cstring>

#include "kernels/op.h"
#include "parallel/context_parallel/attention.h"
#include "parallel/documents.h"
#include "test_util.h"

namespace tripod {
namespace {

using test::host_tensor;
using test::random_tensor;

constexpr int32_t kEod = 7;

// Megatron's rule written out as gpt_dataset.py does it: the attention mask (T x T, true = may
// attend) and the positions of one sequence.
struct Megatron {
  std::vector<std::vector<bool>> mask;
  std::vector<int64_t> positions;
};
Megatron megatron(const std::vector<int32_t>& data, bool reset_positions, bool reset_mask) {
  const int64_t T = static_cast<int64_t>(data.size());
  Megatron m;
  m.mask.assign(T, std::vector<bool>(T, false));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j <= t; ++j) m.mask[t][j] = true;
  for (int64_t t = 0; t < T; ++t) m.positions.push_back(t);
  int64_t prev = 0;
  for (int64_t i = 0; i < T; ++i) {
    if (data[i] != kEod) continue;
    if (reset_mask)
      for (int64_t t = i + 1; t < T; ++t)
        for (int64_t j = 0; j <= i; ++j) m.mask[t][j] = false;
    if (reset_positions) {
      for (int64_t t = i + 1; t < T; ++t) m.positions[t] -= i + 1 - prev;
      prev = i + 1;
    }
  }
  return m;
}

// Random tokens with end-of-document tokens at random places (and at both ends sometimes).
std::vector<int32_t> packed_tokens(int64_t T, uint64_t seed, double eod_rate = 0.2) {
  CounterRng rng(seed, 3);
  std::vector<int32_t> v(T);
  for (int64_t t = 0; t < T; ++t) v[t] = rng.uniform(t) < eod_rate ? kEod : 10 + static_cast<int32_t>(t % 5);
  return v;
}

TEST(Documents, WorkedExample) {
  Documents d{.T = 8};
  d.add_sequence(std::vector<int32_t>{1, 1, kEod, 2, 2, kEod, 3, 3}, kEod);
  d.add_sequence(std::vector<int32_t>{4, 4, 4, 4, 4, 4, 4, kEod}, kEod);  // a final EOD starts nothing
  EXPECT_EQ(d.B, 2);
  EXPECT_EQ(d.starts, (std::vector<int32_t>{0, 3, 6, 0}));
  EXPECT_EQ(d.count(0), 3);
  EXPECT_EQ(d.count(1), 1);
  EXPECT_EQ(d.start_of(0, 4), 3);
  EXPECT_EQ(d.start_of(0, 2), 0);
  EXPECT_EQ(d.start_of(1, 7), 0);
  EXPECT_EQ(d.row_offsets(), (std::vector<int32_t>{0, 3, 6, 8, 16}));
  EXPECT_EQ(d.squared_lengths(), 9 + 9 + 4 + 64);
}

// The document starts give Megatron's mask and positions exactly: position p is p - start_of(p),
// and query t attends key j when start_of(t) <= j <= t.
TEST(Documents, MatchMegatronMaskAndPositions) {
  for (uint64_t seed = 0; seed < 20; ++seed) {
    const int64_t T = 1 + static_cast<int64_t>(seed * 7 % 40);
    const std::vector<int32_t> data = packed_tokens(T, seed, seed % 3 == 0 ? 0.5 : 0.15);
    Documents d{.T = T};
    d.add_sequence(data, kEod);
    const Megatron both = megatron(data, true, true), none = megatron(data, false, false);
    for (int64_t t = 0; t < T; ++t) {
      EXPECT_EQ(t - d.start_of(0, t), both.positions[t]) << "seed " << seed << " t " << t;
      EXPECT_EQ(t, none.positions[t]);
      for (int64_t j = 0; j < T; ++j)
        EXPECT_EQ(j <= t && j >= d.start_of(0, t), static_cast<bool>(both.mask[t][j]))
            << "seed " << seed << " query " << t << " key " << j;
    }
  }
}

// Attention of qkv (B, T, H + 2 Hkv, D) in double where visible(b, t, j): out (B, T, H, D), lse
// (B, H, T) and, for dout, dqkv.
struct Reference {
  std::vector<double> out, lse, dqkv;
};
template <class Visible>
Reference reference_attention(const Tensor& qkv, const Tensor& dout, int64_t H, int64_t Hkv, Visible visible) {
  const int64_t B = qkv.size(0), T = qkv.size(1), D = qkv.size(3), W = H + 2 * Hkv, g = H / Hkv;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  const float* x = qkv.data<float>();
  const float* dO = dout.data<float>();
  auto at = [&](int64_t b, int64_t t, int64_t head, int64_t d) { return static_cast<double>(x[((b * T + t) * W + head) * D + d]); };
  Reference r;
  r.out.assign(B * T * H * D, 0);
  r.lse.assign(B * H * T, 0);
  r.dqkv.assign(B * T * W * D, 0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t kh = H + h / g, vh = H + Hkv + h / g;
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> s(T, -INFINITY);
        double m = -INFINITY;
        for (int64_t j = 0; j < T; ++j) {
          if (!visible(b, t, j)) continue;
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += at(b, t, h, d) * at(b, j, kh, d);
          s[j] = dot * scale;
          m = std::max(m, s[j]);
        }
        double z = 0;
        for (int64_t j = 0; j < T; ++j) z += s[j] == -INFINITY ? 0 : std::exp(s[j] - m);
        r.lse[(b * H + h) * T + t] = m + std::log(z);
        std::vector<double> p(T, 0), dp(T, 0);
        for (int64_t j = 0; j < T; ++j) p[j] = s[j] == -INFINITY ? 0 : std::exp(s[j] - m) / z;
        for (int64_t d = 0; d < D; ++d) {
          double o = 0;
          for (int64_t j = 0; j < T; ++j) o += p[j] * at(b, j, vh, d);
          r.out[((b * T + t) * H + h) * D + d] = o;
        }
        // Backward of this row: dP = dO V^T, dS = P (dP - sum P dP).
        double dot = 0;
        for (int64_t j = 0; j < T; ++j) {
          for (int64_t d = 0; d < D; ++d) dp[j] += dO[((b * T + t) * H + h) * D + d] * at(b, j, vh, d);
          dot += p[j] * dp[j];
        }
        for (int64_t j = 0; j < T; ++j) {
          const double ds = p[j] * (dp[j] - dot) * scale;
          for (int64_t d = 0; d < D; ++d) {
            r.dqkv[((b * T + t) * W + h) * D + d] += ds * at(b, j, kh, d);
            r.dqkv[((b * T + j) * W + kh) * D + d] += ds * at(b, t, h, d);
            r.dqkv[((b * T + j) * W + vh) * D + d] += p[j] * dO[((b * T + t) * H + h) * D + d];
          }
        }
      }
    }
  return r;
}

// B sequences of T packed tokens and their documents (with the device tensors a cp = 1 rank holds).
Documents make_documents(int64_t B, int64_t T, uint64_t seed, double eod_rate) {
  Documents d{.T = T};
  d.mask = true;
  for (int64_t b = 0; b < B; ++b) d.add_sequence(packed_tokens(T, seed + 100 * b, eod_rate), kEod);
  d.doc_start = host_tensor({B * T}, DType::I32);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) d.doc_start.data<int32_t>()[b * T + t] = d.start_of(b, t);
  d.row_cu = d.row_offsets();
  return d;
}

// Attention within documents over whole sequences, forward and backward, with grouped-query
// attention, against the double-precision masked attention.
TEST(DocumentAttention, MatchesMaskedReference) {
  auto ops = make_ops(Device::CPU);
  for (double rate : {0.0, 0.1, 0.4}) {
    SCOPED_TRACE(rate);
    const int64_t B = 2, T = 19, H = 4, Hkv = 2, D = 8, W = H + 2 * Hkv;
    const Documents docs = make_documents(B, T, 5, rate);
    Tensor qkv = random_tensor({B, T, W, D}, 11), dout = random_tensor({B, T, H, D}, 12);
    Tensor out = host_tensor({B, T, H, D}), lse = host_tensor({B, H, T}), dqkv = host_tensor({B, T, W, D});
    const DocRows rows{.offsets = docs.row_cu, .start = docs.doc_start.view({B, T})};
    ops->attention_forward_docs(qkv, rows, out, lse);
    ops->attention_backward_docs(dout, qkv, out, lse, rows, dqkv);
    const Reference want = reference_attention(qkv, dout, H, Hkv, [&](int64_t b, int64_t t, int64_t j) {
      return j <= t && j >= docs.start_of(b, t);
    });
    EXPECT_CLOSE(out, want.out, 1e-6, 1e-5);
    EXPECT_CLOSE(lse, want.lse, 1e-6, 1e-5);
    EXPECT_CLOSE(dqkv, want.dqkv, 1e-5, 1e-4);
    if (rate == 0.0) {  // one document per sequence: plain causal attention, the same bits
      Tensor out2 = host_tensor({B, T, H, D}), lse2 = host_tensor({B, H, T}), dqkv2 = host_tensor({B, T, W, D});
      ops->attention_forward(qkv, out2, lse2, *std::make_unique<Tensor>());
      ops->attention_backward(dout, qkv, out2, lse2, Tensor{}, dqkv2);
      EXPECT_EQ(0, std::memcmp(out.raw(), out2.raw(), out.nbytes()));
      EXPECT_EQ(0, std::memcmp(dqkv.raw(), dqkv2.raw(), dqkv.nbytes()));
    }
  }
}

// Context parallelism under the document mask, cp ranks emulated in one process: the blocks the
// mask leaves anything in (cp_block_visible), with their BlockDocs, merged in ring order give the
// masked attention of the whole sequence, forward and backward; a skipped block is wholly masked;
// and cp_kv_suffix is exactly the rows of a key chunk that a later chunk's queries see.
TEST(DocumentAttention, ContextParallelBlocksMatchMaskedReference) {
  auto ops = make_ops(Device::CPU);
  for (int cp : {2, 4}) {
    for (double rate : {0.05, 0.3}) {
      SCOPED_TRACE(fmt::format("cp {} rate {}", cp, rate));
      const int64_t B = 2, c = 4, T = 2 * cp * c, H = 4, Hkv = 2, D = 8, W = H + 2 * Hkv, Nl = 2 * B * c;
      Documents docs = make_documents(B, T, 17 + cp, rate);
      auto visible = [&](int64_t b, int64_t t, int64_t j) { return j <= t && j >= docs.start_of(b, t); };
      Tensor qkv = random_tensor({B, T, W, D}, 41), dout = random_tensor({B, T, H, D}, 42);
      const Reference want = reference_attention(qkv, dout, H, Hkv, visible);
      // The rows a chunk's keys must send: every key some later chunk's query sees, and no other.
      for (int kc = 0; kc < 2 * cp; ++kc)
        for (int64_t b = 0; b < B; ++b) {
          int64_t first_seen = (kc + 1) * c;
          for (int64_t j = kc * c; j < (kc + 1) * c; ++j)
            for (int64_t t = (kc + 1) * c; t < T; ++t)
              if (visible(b, t, j)) first_seen = std::min(first_seen, j);
          EXPECT_EQ(cp_kv_suffix(docs, c, kc, b), (kc + 1) * c - first_seen) << "chunk " << kc << " sequence " << b;
        }
      auto local = [&](const float* t, int r, int64_t w) {
        Tensor l = host_tensor({Nl, w * D});
        for (int s = 0; s < 2; ++s)
          for (int64_t b = 0; b < B; ++b)
            std::memcpy(l.data<float>() + (s * B + b) * c * w * D, t + (b * T + cp_chunk(cp, r, s) * c) * w * D,
                        c * w * D * sizeof(float));
        return l;
      };
      std::vector<Tensor> q(cp), kv(cp), o(cp), l(cp), dq(cp), dkv(cp), dO(cp), start(cp);
      for (int r = 0; r < cp; ++r) {
        q[r] = local(qkv.data<float>(), r, W);
        dO[r] = local(dout.data<float>(), r, H);
        kv[r] = host_tensor({Nl, 2 * Hkv * D});
        ops->attention_kv_pack(q[r], H, kv[r]);
        o[r] = host_tensor({Nl, H * D});
        l[r] = host_tensor({2, B, H, c});
        ops->fill(l[r], -INFINITY);
        dq[r] = host_tensor({Nl, W * D});
        ops->fill(dq[r], 0.f);
        dkv[r] = host_tensor({Nl, 2 * Hkv * D});
        ops->fill(dkv[r], 0.f);
        start[r] = host_tensor({Nl}, DType::I32);
        for (int s = 0; s < 2; ++s)
          for (int64_t b = 0; b < B; ++b)
            for (int64_t t = 0; t < c; ++t)
              start[r].data<int32_t>()[(s * B + b) * c + t] = docs.start_of(b, cp_chunk(cp, r, s) * c + t);
      }
      auto rows = [&](const Tensor& t, int s, int64_t w) { return t.slice(s * B * c, (s + 1) * B * c).view({B, c, w, D}); };
      auto lse_of = [&](const Tensor& t, int s) { return t.flat(s * B * H * c, (s + 1) * B * H * c).view({B, H, c}); };
      auto block_docs = [&](int r, int k, const CpBlock& b) {
        return BlockDocs{.start = start[r].slice(b.q_slot * B * c, (b.q_slot + 1) * B * c).view({B, c}),
                         .key_pos = cp_chunk(cp, cp_step_source(cp, r, k), b.kv_slot) * c};
      };
      int skipped = 0;
      for (int r = 0; r < cp; ++r)
        for (int k = 0; k < cp; ++k)
          for (const CpBlock& b : cp_step_blocks(cp, r, k)) {
            const int qc = cp_chunk(cp, r, b.q_slot), kc = cp_chunk(cp, cp_step_source(cp, r, k), b.kv_slot);
            if (!cp_block_visible(docs, c, qc, kc)) {
              ++skipped;
              for (int64_t bb = 0; bb < B; ++bb)
                for (int64_t t = qc * c; t < (qc + 1) * c; ++t)
                  for (int64_t j = kc * c; j < (kc + 1) * c; ++j) EXPECT_FALSE(visible(bb, t, j));
              continue;
            }
            Tensor os = rows(o[r], b.q_slot, H), ls = lse_of(l[r], b.q_slot);
            ops->attention_block_forward(rows(q[r], b.q_slot, W), rows(kv[cp_step_source(cp, r, k)], b.kv_slot, 2 * Hkv),
                                         b.causal, block_docs(r, k, b), os, ls);
          }
      if (rate > 0.2) {
        EXPECT_GT(skipped, 0) << "short documents leave blocks empty";
      }
      for (int r = 0; r < cp; ++r)
        for (int k = 0; k < cp; ++k)
          for (const CpBlock& b : cp_step_blocks(cp, r, k)) {
            const int src = cp_step_source(cp, r, k);
            if (!cp_block_visible(docs, c, cp_chunk(cp, r, b.q_slot), cp_chunk(cp, src, b.kv_slot))) continue;
            Tensor dqs = rows(dq[r], b.q_slot, W), dkvs = rows(dkv[src], b.kv_slot, 2 * Hkv);
            ops->attention_block_backward(rows(dO[r], b.q_slot, H), rows(q[r], b.q_slot, W),
                                          rows(kv[src], b.kv_slot, 2 * Hkv), rows(o[r], b.q_slot, H),
                                          lse_of(l[r], b.q_slot), b.causal, block_docs(r, k, b), dqs, dkvs);
          }
      std::vector<double> out_rows, lse_rows, grad_rows;
      for (int r = 0; r < cp; ++r) {
        ops->attention_kv_unpack(dkv[r], H, dq[r]);
        std::vector<float> want_out_f(want.out.begin(), want.out.end()), want_grad_f(want.dqkv.begin(), want.dqkv.end());
        Tensor want_out = local(want_out_f.data(), r, H), want_grad = local(want_grad_f.data(), r, W);
        std::vector<double> wo = test::to_double(want_out), wg = test::to_double(want_grad);
        EXPECT_CLOSE(o[r], wo, 1e-5, 1e-4);
        EXPECT_CLOSE(dq[r], wg, 1e-5, 1e-4);
        for (int s = 0; s < 2; ++s)
          for (int64_t b = 0; b < B; ++b)
            for (int64_t h = 0; h < H; ++h)
              for (int64_t t = 0; t < c; ++t)
                EXPECT_NEAR(l[r].data<float>()[((s * B + b) * H + h) * c + t],
                            want.lse[(b * H + h) * T + cp_chunk(cp, r, s) * c + t], 1e-5);
      }
    }
  }
}

// Positions given per row give the bits of the ops that compute them from (T, pos0).
TEST(DocumentPositions, RopeAndEmbeddingTakeEachRowsPosition) {
  auto ops = make_ops(Device::CPU);
  const int64_t N = 12, Hs = 3, D = 8, C = 16, V = 20;
  const std::vector<int32_t> pos = {0, 1, 2, 0, 1, 0, 1, 2, 3, 4, 0, 5};
  Tensor positions = host_tensor({N}, DType::I32);
  std::memcpy(positions.data<int32_t>(), pos.data(), N * sizeof(int32_t));
  for (bool inverse : {false, true}) {
    Tensor x = random_tensor({N, Hs, D}, 3), y = random_tensor({N, Hs, D}, 3);
    ops->rope_positions(x, 2, positions, 500000.0, inverse);
    for (int64_t n = 0; n < N; ++n) {
      Tensor row = y.slice(n, n + 1);
      ops->rope(row, 2, 1, pos[n], 500000.0, inverse);
    }
    EXPECT_EQ(0, std::memcmp(x.raw(), y.raw(), x.nbytes()));
  }
  Tensor tokens = host_tensor({N}, DType::I32);
  for (int64_t n = 0; n < N; ++n) tokens.data<int32_t>()[n] = static_cast<int32_t>((n * 7) % 24) - 2;
  Tensor wte = random_tensor({V, C}, 4), wpe = random_tensor({8, C}, 5);
  Tensor out = host_tensor({N, C}), want = host_tensor({N, C});
  ops->embedding_forward_positions(tokens, wte, 2, wpe, positions, out);
  for (int64_t n = 0; n < N; ++n) {
    Tensor row = want.slice(n, n + 1);
    ops->embedding_forward(tokens.slice(n, n + 1), wte, 2, wpe.slice(pos[n], pos[n] + 1), 1, row);
  }
  EXPECT_EQ(0, std::memcmp(out.raw(), want.raw(), out.nbytes()));
  Tensor dout = random_tensor({N, C}, 6), dwte = host_tensor({V, C}), dwpe = host_tensor({8, C});
  ops->fill(dwte, 0.f);
  ops->fill(dwpe, 0.f);
  ops->embedding_backward_positions(tokens, dout, 2, dwte, dwpe, positions);
  std::vector<double> want_dwpe(8 * C, 0.0), want_dwte(V * C, 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) {
      want_dwpe[pos[n] * C + c] += dout.data<float>()[n * C + c];
      const int64_t row = tokens.data<int32_t>()[n] - 2;
      if (row >= 0 && row < V) want_dwte[row * C + c] += dout.data<float>()[n * C + c];
    }
  EXPECT_CLOSE(dwpe, want_dwpe, 1e-6, 1e-6);
  EXPECT_CLOSE(dwte, want_dwte, 1e-6, 1e-6);
}

// A negative target does not count: over two vocabulary shards its loss and lse are exactly 0 and
// its logits get no gradient; the other rows are untouched.
TEST(DocumentLoss, NegativeTargetsDoNotCount) {
  auto ops = make_ops(Device::CPU);
  const int64_t N = 4, V = 10, half = 5;
  Tensor logits = random_tensor({N, V}, 9);
  Tensor targets = host_tensor({N}, DType::I32);
  const std::vector<int32_t> tg = {3, -1, 7, -1};
  std::memcpy(targets.data<int32_t>(), tg.data(), N * sizeof(int32_t));
  Tensor shard[2] = {host_tensor({N, half}), host_tensor({N, half})};
  for (int p = 0; p < 2; ++p)
    for (int64_t n = 0; n < N; ++n)
      std::memcpy(shard[p].data<float>() + n * half, logits.data<float>() + n * V + p * half, half * sizeof(float));
  Tensor parts = host_tensor({2, N, 3});
  for (int p = 0; p < 2; ++p) {
    Tensor st = parts.slice(p, p + 1).view({N, 3});
    ops->xent_stats(shard[p], targets, p * half, half, st);
  }
  Tensor lse = host_tensor({N}), loss = host_tensor({N});
  ops->xent_combine(parts, lse, loss);
  for (int64_t n = 0; n < N; ++n) {
    if (tg[n] >= 0) {
      double m = -INFINITY, z = 0;
      for (int64_t v = 0; v < V; ++v) m = std::max(m, double(logits.data<float>()[n * V + v]));
      for (int64_t v = 0; v < V; ++v) z += std::exp(logits.data<float>()[n * V + v] - m);
      EXPECT_NEAR(loss.data<float>()[n], m + std::log(z) - logits.data<float>()[n * V + tg[n]], 1e-5);
    } else {
      EXPECT_EQ(loss.data<float>()[n], 0.f);
      EXPECT_EQ(lse.data<float>()[n], 0.f);
    }
  }
  for (int p = 0; p < 2; ++p) {
    ops->xent_backward(shard[p], targets, p * half, half, lse, 0.25f);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t v = 0; v < half; ++v) {
        if (tg[n] < 0)
          EXPECT_EQ(shard[p].data<float>()[n * half + v], 0.f);
        else
          EXPECT_NE(shard[p].data<float>()[n * half + v], 0.f);
      }
  }
}

}  // namespace
}  // namespace tripod
