// Every collective of the MPI communicator under mpirun (4 ranks): sizes from 1 to millions of
// elements, odd counts, f32/bf16/i32, blocking and non-blocking, send/recv rings, all-to-all with
// blocks of any size, and the collective error check.
#include <fmt/format.h>

#include "core/error.h"
#include "kernels/op.h"
#include "parallel/comm/flight_recorder.h"
#include "parallel/comm/mpi_comm.h"
#include "parallel/context.h"
#include "test_util.h"

namespace tripod {
namespace {

class Comm : public ::testing::Test {
 protected:
  std::unique_ptr<Ops> ops = make_ops(Device::CPU);
  std::unique_ptr<MpiComm> world = mpi_world(ops.get(), 60.0);
  int r = world->rank(), n = world->size();
  Tensor make(int64_t count, DType dt = DType::F32) { return ops->empty({count}, dt, MemCategory::Comm); }
};

// Value of element i on rank r: small integers so f32 sums are exact.
float val(int r, int64_t i) { return static_cast<float>((r + 1) * 3 + i % 17); }

const std::vector<int64_t> kSizes = {1, 2, 7, 1000, 4099, (1 << 20) + 3};

TEST_F(Comm, AllReduceSumAndMax) {
  for (int64_t count : kSizes) {
    Tensor t = make(count);
    for (int64_t i = 0; i < count; ++i) t.data<float>()[i] = val(r, i);
    world->all_reduce(t);
    for (int64_t i = 0; i < count; ++i) {
      float want = 0;
      for (int q = 0; q < n; ++q) want += val(q, i);
      ASSERT_EQ(t.data<float>()[i], want) << "count " << count << " element " << i;
    }
    for (int64_t i = 0; i < count; ++i) t.data<float>()[i] = val(r, i);
    world->all_reduce(t, ReduceOp::Max);
    for (int64_t i = 0; i < count; ++i) ASSERT_EQ(t.data<float>()[i], val(n - 1, i)) << count;
  }
}

TEST_F(Comm, AllReduceBf16AndInt32) {
  Tensor b = make(33, DType::BF16), k = make(33, DType::I32);
  for (int64_t i = 0; i < 33; ++i) {
    b.data<bf16>()[i] = bf16(static_cast<float>(r + i));
    k.data<int32_t>()[i] = r * 1000 + static_cast<int32_t>(i);
  }
  world->all_reduce(b);
  world->all_reduce(k);
  for (int64_t i = 0; i < 33; ++i) {
    float want = 0;
    int32_t iw = 0;
    for (int q = 0; q < n; ++q) want += static_cast<float>(q + i), iw += q * 1000 + static_cast<int32_t>(i);
    EXPECT_EQ(static_cast<float>(b.data<bf16>()[i]), static_cast<float>(bf16(want)));
    EXPECT_EQ(k.data<int32_t>()[i], iw);
  }
}

TEST_F(Comm, ReduceScatterAndAllGather) {
  for (int64_t count : kSizes) {
    Tensor in = make(count * n), out = make(count);
    for (int64_t i = 0; i < count * n; ++i) in.data<float>()[i] = val(r, i);
    world->reduce_scatter(in, out);
    for (int64_t i = 0; i < count; ++i) {
      float want = 0;
      for (int q = 0; q < n; ++q) want += val(q, r * count + i);
      ASSERT_EQ(out.data<float>()[i], want) << count;
    }
    Tensor mine = make(count), all = make(count * n);
    for (int64_t i = 0; i < count; ++i) mine.data<float>()[i] = val(r, i);
    world->all_gather(mine, all);
    for (int q = 0; q < n; ++q)
      for (int64_t i = 0; i < count; ++i) ASSERT_EQ(all.data<float>()[q * count + i], val(q, i)) << count;
  }
}

TEST_F(Comm, BroadcastFromEveryRoot) {
  for (int root = 0; root < n; ++root) {
    Tensor t = make(1001);
    for (int64_t i = 0; i < 1001; ++i) t.data<float>()[i] = val(r, i);
    world->broadcast(t, root);
    for (int64_t i = 0; i < 1001; ++i) ASSERT_EQ(t.data<float>()[i], val(root, i));
  }
}

TEST_F(Comm, NonBlockingOverlap) {
  // Several collectives in flight at once complete correctly in any wait order.
  std::vector<Tensor> ts;
  std::vector<std::unique_ptr<CommRequest>> reqs;
  for (int k = 0; k < 5; ++k) {
    ts.push_back(make(100 + k));
    for (int64_t i = 0; i < 100 + k; ++i) ts.back().data<float>()[i] = val(r, i + k);
    reqs.push_back(world->iall_reduce(ts.back()));
  }
  for (int k = 4; k >= 0; --k) reqs[k]->wait();
  for (int k = 0; k < 5; ++k)
    for (int64_t i = 0; i < 100 + k; ++i) {
      float want = 0;
      for (int q = 0; q < n; ++q) want += val(q, i + k);
      ASSERT_EQ(ts[k].data<float>()[i], want);
    }
}

TEST_F(Comm, SendRecvRingsBothWays) {
  for (int64_t count : kSizes) {
    for (int dir : {1, -1}) {
      int to = (r + dir + n) % n, from = (r - dir + n) % n;
      Tensor out = make(count), in = make(count);
      for (int64_t i = 0; i < count; ++i) out.data<float>()[i] = val(r, i);
      auto rq = world->irecv(in, from, 7);
      auto sq = world->isend(out, to, 7);
      rq->wait();
      sq->wait();
      for (int64_t i = 0; i < count; ++i) ASSERT_EQ(in.data<float>()[i], val(from, i)) << count;
    }
  }
}

// all_to_all_v: rank r sends rank q a block of (r + 2q + scale) % 5 * scale elements (zero for
// some pairs, the rank's own block included), each naming (r, q, i), and exchanges where nothing
// or nothing of one rank's travels; every dtype, through the
// flight recorder's wrapper too (it records one all-to-all and forwards the exchange).
TEST_F(Comm, AllToAllVariableBlocks) {
  // Scale 0: nothing travels at all; scale 2: rank 0 neither sends nor receives anything.
  auto count = [&](int from, int to, int64_t scale) -> int64_t {
    if (scale == 2) return from == 0 || to == 0 ? 0 : from + to;
    return static_cast<int64_t>((from + 2 * to + scale) % 5) * scale;
  };
  auto value = [](int from, int to, int64_t i) { return static_cast<float>(from * 100 + to * 10 + i % 7); };
  auto rec = std::make_shared<FlightRecorder>(r, n, 16, "");
  std::vector<int> ranks(n);
  for (int q = 0; q < n; ++q) ranks[q] = q;
  RecordingComm recorded(mpi_subgroup(*world, ranks, "recorded"), rec, ranks);
  for (Communicator* c : {static_cast<Communicator*>(world.get()), static_cast<Communicator*>(&recorded)})
    for (DType dt : {DType::F32, DType::I32, DType::BF16})
      for (int64_t scale : {0, 1, 2, 3, 1001}) {
        SCOPED_TRACE(fmt::format("{} {} scale {}", c->name(), dtype_name(dt), scale));
        std::vector<int64_t> sc(n), rc(n);
        int64_t s_total = 0, r_total = 0;
        for (int q = 0; q < n; ++q) {
          s_total += sc[q] = count(r, q, scale);
          r_total += rc[q] = count(q, r, scale);
        }
        Tensor in = make(s_total + 3, dt), out = make(r_total + 2, dt);  // larger than needed
        auto set = [&](Tensor& t, int64_t at, float v) {
          if (dt == DType::F32) t.data<float>()[at] = v;
          else if (dt == DType::I32) t.data<int32_t>()[at] = static_cast<int32_t>(v);
          else t.data<bf16>()[at] = bf16(v);
        };
        auto get = [&](const Tensor& t, int64_t at) {
          if (dt == DType::F32) return t.data<float>()[at];
          if (dt == DType::I32) return static_cast<float>(t.data<int32_t>()[at]);
          return static_cast<float>(t.data<bf16>()[at]);
        };
        for (int64_t at = 0, q = 0; q < n; ++q)
          for (int64_t i = 0; i < sc[q]; ++i) set(in, at++, value(r, static_cast<int>(q), i));
        c->all_to_all_v(in, sc, out, rc);
        for (int64_t at = 0, q = 0; q < n; ++q)
          for (int64_t i = 0; i < rc[q]; ++i, ++at) {
            const float want = dt == DType::BF16 ? static_cast<float>(bf16(value(static_cast<int>(q), r, i)))
                                                 : value(static_cast<int>(q), r, i);
            ASSERT_EQ(get(out, at), want) << "from " << q << " element " << i;
          }
      }
  int recorded_ops = 0;
  for (const FlightEntry& e : rec->entries()) recorded_ops += e.kind == FlightKind::AllToAll;
  EXPECT_EQ(recorded_ops, 15);
  // Counts that do not fit the tensors are refused before anything is sent.
  std::vector<int64_t> too_many(n, 1000);
  Tensor small = make(4);
  EXPECT_THROW(world->all_to_all_v(small, too_many, small, too_many), Error);
}

TEST_F(Comm, AxisCommunicatorsOfAGrid) {
  ASSERT_EQ(n, 4);
  RankGrid grid(2, 1, 2);  // tp=2, pp=2
  ParallelContext par = make_parallel_context(*world, grid, {});
  Tensor t = make(1);
  t.data<float>()[0] = static_cast<float>(r);
  par.tp->all_reduce(t);  // TP groups {0,1} {2,3}
  EXPECT_EQ(t.data<float>()[0], r < 2 ? 1.f : 5.f);
  t.data<float>()[0] = static_cast<float>(r);
  par.pp->all_reduce(t);  // PP groups {0,2} {1,3}
  EXPECT_EQ(t.data<float>()[0], r % 2 == 0 ? 2.f : 4.f);
  ASSERT_TRUE(par.embedding);  // first and last stage both hold the tied embedding
  EXPECT_EQ(par.embedding->size(), 2);
  EXPECT_EQ(par.dp->size(), 1);
}

TEST_F(Comm, BytesSentFollowTheRingFormulas) {
  Tensor t = make(1000);
  int64_t before = world->bytes_sent();
  world->all_reduce(t);
  EXPECT_EQ(world->bytes_sent() - before, 2 * (n - 1) * 4000 / n);
}

// throw_if_any_failed: the lowest failing rank carries the message, as the run's (Shared) when
// every rank failed and as its own (Rank) when some did not; every other rank is told it is
// reported elsewhere; nobody throws when nobody failed.
TEST_F(Comm, AnyFailedThrowsOnEveryRankReportedOnce) {
  auto outcome = [&](bool fails) -> std::pair<std::string, InputError::Scope> {
    try {
      throw_if_any_failed(fails ? fmt::format("rank {} failed", r) : "", *world);
      return {"returned", InputError::Scope::Elsewhere};
    } catch (const InputError& e) {
      return {e.what(), e.scope()};
    }
  };
  using Scope = InputError::Scope;
  EXPECT_EQ(outcome(false).first, "returned");
  for (int only : {0, n - 1}) {  // one rank's own failure
    auto [what, scope] = outcome(r == only);
    EXPECT_EQ(what, r == only ? fmt::format("rank {} failed", r) : "") << only;
    EXPECT_EQ(scope, r == only ? Scope::Rank : Scope::Elsewhere) << only;
  }
  const auto odd = outcome(r % 2 == 1);  // ranks 1 and 3: rank 1 reports
  EXPECT_EQ(odd.first, r == 1 ? "rank 1 failed" : "");
  EXPECT_EQ(odd.second, r == 1 ? Scope::Rank : Scope::Elsewhere);
  const auto all = outcome(true);  // every rank: rank 0 reports for the run
  EXPECT_EQ(all.first, r == 0 ? "rank 0 failed" : "");
  EXPECT_EQ(all.second, r == 0 ? Scope::Shared : Scope::Elsewhere);
}

}  // namespace
}  // namespace tripod
