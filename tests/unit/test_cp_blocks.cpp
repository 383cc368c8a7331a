// Context parallelism in one process: the load-balanced block plan (every rank the same causal
// attention work, every (query, key) pair of the sequence computed exactly once), and the
// block ops merged in ring order against the whole sequence's attention, forward and backward,
// with grouped-query attention.
#include <cstring>
#include <set>

#include "kernels/op.h"
#include "parallel/context_parallel/attention.h"
#include "test_util.h"

namespace tripod {
namespace {

using test::host_tensor;
using test::random_tensor;

// Per-rank attention work is equal (to the pair), and the blocks of all ranks cover the causal
// mask exactly once. The naive split (rank r holding chunk r of cp) would give rank cp-1 about
// 2cp-1 times rank 0's work; the sharding here gives every rank 2 diagonal and 2cp-1 full blocks.
TEST(ContextParallel, EveryRankComputesTheSamePairsAndTheMaskOnce) {
  for (int cp : {2, 3, 4, 8}) {
    const int64_t c = 5, T = 2 * cp * c;
    int64_t total = 0;
    std::set<std::pair<int, int>> seen;  // (query chunk, key chunk)
    for (int r = 0; r < cp; ++r) {
      EXPECT_EQ(cp_attention_pairs(cp, r, c), cp_attention_pairs(cp, 0, c)) << "cp " << cp << " rank " << r;
      total += cp_attention_pairs(cp, r, c);
      for (int k = 0; k < cp; ++k)
        for (const CpBlock& b : cp_step_blocks(cp, r, k)) {
          const int qc = cp_chunk(cp, r, b.q_slot), kc = cp_chunk(cp, cp_step_source(cp, r, k), b.kv_slot);
          EXPECT_LE(kc, qc);
          EXPECT_EQ(b.causal, kc == qc);
          EXPECT_TRUE(seen.insert({qc, kc}).second) << "block (" << qc << ", " << kc << ") twice";
        }
    }
    EXPECT_EQ(total, T * (T + 1) / 2) << "cp " << cp;
    EXPECT_EQ(static_cast<int64_t>(seen.size()), 2 * cp * (2 * cp + 1) / 2);
    // 2 diagonal blocks and 2cp-1 full ones per rank.
    EXPECT_EQ(cp_attention_pairs(cp, 0, c), 2 * c * (c + 1) / 2 + (2 * cp - 1) * c * c);
  }
}

// cp ranks emulated in one process: each rank's slot-major tokens, the blocks of every ring step
// against the source's keys and values, merged by log-sum-exp, give the rows of the whole
// sequence's causal attention; the block backwards sum to its gradient.
TEST(ContextParallel, BlocksMergedInRingOrderEqualWholeAttention) {
  auto ops = make_ops(Device::CPU);
  for (int cp : {2, 4}) {
    SCOPED_TRACE(cp);
    const int64_t B = 2, c = 3, T = 2 * cp * c, H = 4, Hkv = 2, D = 8, W = H + 2 * Hkv, Nl = 2 * B * c;
    Tensor qkv = random_tensor({B, T, W, D}, 41), dout = random_tensor({B, T, H, D}, 42);
    Tensor out = host_tensor({B, T, H, D}), lse = host_tensor({B, H, T}), dqkv = host_tensor({B, T, W, D});
    ops->attention_forward(qkv, out, lse, *std::make_unique<Tensor>());
    ops->attention_backward(dout, qkv, out, lse, Tensor{}, dqkv);
    // Slot-major local copies of a (B, T, w, D) tensor for rank r: (2, B, c, w, D).
    auto local = [&](const Tensor& t, int r, int64_t w) {
      Tensor l = host_tensor({Nl, w * D});
      for (int s = 0; s < 2; ++s)
        for (int64_t b = 0; b < B; ++b)
          std::memcpy(l.data<float>() + (s * B + b) * c * w * D,
                      t.data<float>() + (b * T + cp_chunk(cp, r, s) * c) * w * D, c * w * D * sizeof(float));
      return l;
    };
    std::vector<Tensor> q(cp), kv(cp), o(cp), l(cp), dq(cp), dkv(cp), dO(cp);
    for (int r = 0; r < cp; ++r) {
      q[r] = local(qkv, r, W);
      dO[r] = local(dout, r, H);
      kv[r] = host_tensor({Nl, 2 * Hkv * D});
      ops->attention_kv_pack(q[r], H, kv[r]);
      o[r] = host_tensor({Nl, H * D});
      l[r] = host_tensor({2, B, H, c});
      ops->fill(l[r], -INFINITY);
      dq[r] = host_tensor({Nl, W * D});
      ops->fill(dq[r], 0.f);
      dkv[r] = host_tensor({Nl, 2 * Hkv * D});
      ops->fill(dkv[r], 0.f);
    }
    auto rows = [&](const Tensor& t, int s, int64_t w) { return t.slice(s * B * c, (s + 1) * B * c).view({B, c, w, D}); };
    auto lse_of = [&](const Tensor& t, int s) { return t.flat(s * B * H * c, (s + 1) * B * H * c).view({B, H, c}); };
    for (int r = 0; r < cp; ++r)
      for (int k = 0; k < cp; ++k)
        for (const CpBlock& b : cp_step_blocks(cp, r, k)) {
          Tensor os = rows(o[r], b.q_slot, H), ls = lse_of(l[r], b.q_slot);
          ops->attention_block_forward(rows(q[r], b.q_slot, W), rows(kv[cp_step_source(cp, r, k)], b.kv_slot, 2 * Hkv),
                                       b.causal, {}, os, ls);
        }
    for (int r = 0; r < cp; ++r)
      for (int k = 0; k < cp; ++k)
        for (const CpBlock& b : cp_step_blocks(cp, r, k)) {
          const int src = cp_step_source(cp, r, k);
          Tensor dqs = rows(dq[r], b.q_slot, W), dkvs = rows(dkv[src], b.kv_slot, 2 * Hkv);
          ops->attention_block_backward(rows(dO[r], b.q_slot, H), rows(q[r], b.q_slot, W),
                                        rows(kv[src], b.kv_slot, 2 * Hkv), rows(o[r], b.q_slot, H),
                                        lse_of(l[r], b.q_slot), b.causal, {}, dqs, dkvs);
        }
    // Compare every rank's rows with the whole sequence's.
    double worst_out = 0, worst_lse = 0, worst_grad = 0;
    for (int r = 0; r < cp; ++r) {
      ops->attention_kv_unpack(dkv[r], H, dq[r]);
      Tensor want_out = local(out, r, H), want_grad = local(dqkv, r, W);
      for (int64_t i = 0; i < want_out.numel(); ++i)
        worst_out = std::max(worst_out, std::abs(double(o[r].data<float>()[i]) - want_out.data<float>()[i]));
      for (int64_t i = 0; i < want_grad.numel(); ++i)
        worst_grad = std::max(worst_grad, std::abs(double(dq[r].data<float>()[i]) - want_grad.data<float>()[i]));
      for (int s = 0; s < 2; ++s)
        for (int64_t b = 0; b < B; ++b)
          for (int64_t h = 0; h < H; ++h)
            for (int64_t t = 0; t < c; ++t) {
              const double got = l[r].data<float>()[((s * B + b) * H + h) * c + t];
              const double want = lse.data<float>()[(b * H + h) * T + cp_chunk(cp, r, s) * c + t];
              worst_lse = std::max(worst_lse, std::abs(got - want));
            }
    }
    EXPECT_LT(worst_out, 2e-6);
    EXPECT_LT(worst_lse, 2e-6);
    EXPECT_LT(worst_grad, 2e-5);
  }
}

}  // namespace
}  // namespace tripod
