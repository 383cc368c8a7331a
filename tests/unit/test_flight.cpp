// The flight recorder (ring, sequence numbers, JSON dump and read-back) and the hang diagnosis on
// hand-made rings: a collective some members never entered, a pipeline receive whose send was
// never posted, a cycle of waits, a rank that left no record, a transfer still in flight.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "core/error.h"
#include "parallel/comm/flight_diagnose.h"

namespace tripod {
namespace {

using nlohmann::json;

TEST(FlightRecorder, RingKeepsTheLastOperationsAndNumbersThemPerCommunicator) {
  FlightRecorder rec(3, 8, /*capacity=*/4, "");
  const int dp = rec.add_comm("dp", {1, 3, 5, 7});
  const int pp = rec.add_comm("pp", {3, 7});
  rec.set_step(5);
  rec.set_phase("B6.0");
  const uint64_t a = rec.record(dp, FlightKind::AllReduce, -1, -1, 64);
  rec.record(pp, FlightKind::Send, 7, 11, 32);
  rec.record(pp, FlightKind::Send, 7, 12, 32);  // another tag: its own count
  rec.record(pp, FlightKind::Send, 7, 11, 32);
  const uint64_t e = rec.record(dp, FlightKind::ReduceScatter, -1, -1, 64);
  rec.mark(a, FlightState::Completed);  // gone from the ring: ignored
  rec.mark(e, FlightState::Waiting);
  const auto es = rec.entries();
  ASSERT_EQ(es.size(), 4u);
  EXPECT_EQ(es.front().id, 1u);
  EXPECT_EQ(es.back().id, 4u);
  EXPECT_EQ(es[0].seq, 0u);  // first send with tag 11
  EXPECT_EQ(es[1].seq, 0u);  // first with tag 12
  EXPECT_EQ(es[2].seq, 1u);  // second with tag 11
  EXPECT_EQ(es[3].seq, 1u);  // the dp communicator's second collective
  EXPECT_EQ(es[3].state, FlightState::Waiting);
  EXPECT_GT(es[3].t_start, 0);
  EXPECT_STREQ(es[3].phase, "B6.0");
  EXPECT_EQ(es[3].step, 5);
  {
    FlightPhase scoped(&rec, "optimizer");
    EXPECT_STREQ(rec.phase(), "optimizer");
  }
  EXPECT_STREQ(rec.phase(), "B6.0");
}

TEST(FlightRecorder, DumpReadsBackAsTheSameRing) {
  const auto dir = test::scratch_dir("flight_dump");
  FlightRecorder rec(2, 4, 100, (dir / "flight").string());
  const int pp = rec.add_comm("pp", {0, 2});
  rec.set_step(3);
  rec.set_phase("F1.0");
  const uint64_t id = rec.record(pp, FlightKind::Recv, 0, 9, 128);
  rec.mark(id, FlightState::Waiting);
  const std::string path = rec.dump("timeout: test");
  ASSERT_EQ(path, (dir / "flight" / "rank_00002.json").string());
  const auto rings = read_flight_rings(dir.string());
  ASSERT_EQ(rings.size(), 1u);
  const FlightRing& r = rings[0];
  EXPECT_EQ(r.rank, 2);
  EXPECT_EQ(r.world_size, 4);
  EXPECT_EQ(r.reason, "timeout: test");
  ASSERT_EQ(r.comms.size(), 1u);
  EXPECT_EQ(r.comms[0].name, "pp");
  EXPECT_EQ(r.comms[0].world_ranks, (std::vector<int>{0, 2}));
  ASSERT_EQ(r.ops.size(), 1u);
  EXPECT_EQ(r.ops[0].kind, FlightKind::Recv);
  EXPECT_EQ(r.ops[0].state, FlightState::Waiting);
  EXPECT_EQ(r.ops[0].peer, 0);
  EXPECT_EQ(r.ops[0].tag, 9);
  EXPECT_EQ(r.ops[0].bytes, 128);
  EXPECT_EQ(r.ops[0].phase, "F1.0");
  EXPECT_EQ(r.ops[0].step, 3);
  // A damaged dump is bad input naming the file.
  test::write_file(dir / "flight" / "rank_00001.json", "{\"rank\": 1}");
  try {
    read_flight_rings(dir.string());
    ADD_FAILURE() << "a damaged dump was read";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("rank_00001.json"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

// Hand-made rings.
struct RingBuilder {
  FlightRing ring;
  RingBuilder(int rank, int world) {
    ring.rank = rank;
    ring.world_size = world;
    ring.reason = "timeout";
  }
  RingBuilder& comm(const std::string& name, std::vector<int> ranks) {
    ring.comms.push_back({name, std::move(ranks)});
    return *this;
  }
  RingBuilder& op(int comm, FlightKind kind, FlightState state, uint64_t seq, std::string phase, int64_t step = 1,
                  int peer = -1, int tag = -1, double t = 0) {
    FlightOp o;
    o.id = ring.ops.size();
    o.comm = comm;
    o.kind = kind;
    o.state = state;
    o.seq = seq;
    o.phase = std::move(phase);
    o.step = step;
    o.peer = peer;
    o.tag = tag;
    o.t_enqueue = o.t_start = t > 0 ? t : 100.0 + static_cast<double>(o.id);
    o.t_end = state == FlightState::Completed ? o.t_start + 0.5 : 0;
    ring.ops.push_back(std::move(o));
    return *this;
  }
};

using K = FlightKind;
using S = FlightState;

bool has_line(const FlightDiagnosis& d, const std::string& text) {
  for (const auto& l : d.lines)
    if (l.find(text) != std::string::npos) return true;
  return false;
}

std::string all_lines(const FlightDiagnosis& d) {
  std::string s;
  for (const auto& l : d.lines) s += l + "\n";
  return s;
}

// The example: dp group (0,2,4,6); 0, 2, 4 are in all-reduce #812; 6 waits for the
// activation of F7.1 from 5 in the pipeline; 5 is not blocked and last completed B6.0.
TEST(FlightDiagnosis, CollectiveMissingAMemberThatWaitsOnAPipelinePeer) {
  std::vector<FlightRing> rings;
  for (int r : {0, 2, 4})
    rings.push_back(RingBuilder(r, 8)
                        .comm("dp", {0, 2, 4, 6})
                        .op(0, K::AllReduce, S::Completed, 811, "dp-reduce", 9)
                        .op(0, K::AllReduce, S::Waiting, 812, "dp-reduce", 10)
                        .ring);
  rings.push_back(RingBuilder(6, 8)
                      .comm("dp", {0, 2, 4, 6})
                      .comm("pp", {5, 6})
                      .op(0, K::AllReduce, S::Completed, 811, "dp-reduce", 9)
                      .op(1, K::Recv, S::Waiting, 20, "F7.1", 10, 5, 33)
                      .ring);
  rings.push_back(RingBuilder(5, 8)
                      .comm("pp", {5, 6})
                      .op(0, K::Recv, S::Completed, 19, "F7.1", 9, 6, 33)
                      .op(0, K::Send, S::Completed, 20, "B6.0", 10, 6, 40)
                      .ring);
  for (int r : {1, 3, 7}) rings.push_back(RingBuilder(r, 8).ring);  // idle ranks with empty rings
  const FlightDiagnosis d = diagnose_flight(rings);
  EXPECT_TRUE(has_line(d, "dp group (ranks 0,2,4,6): all-reduce #812 (dp-reduce, step 10) entered by 0,2,4; rank 6 is "
                          "blocked in recv of F7.1 from rank 5 (pp group, tag 33, #20, step 10)"))
      << all_lines(d);
  EXPECT_TRUE(has_line(d, "rank 6 is blocked in recv of F7.1 from rank 5")) << all_lines(d);
  EXPECT_TRUE(has_line(d, "rank 5 never posted the matching send")) << all_lines(d);
  EXPECT_TRUE(has_line(d, "the hang starts at rank 5")) << all_lines(d);
  EXPECT_TRUE(has_line(d, "rank 5 is not blocked in communication; it last completed send of B6.0 to rank 6"))
      << all_lines(d);
  ASSERT_EQ(d.json["culprits"].size(), 1u) << d.json.dump(1);
  EXPECT_EQ(d.json["culprits"][0]["rank"], 5);
  EXPECT_EQ(d.json["culprits"][0]["state"], "not-blocked");
  EXPECT_EQ(d.json["culprits"][0]["waited_for_by"], json::array({6}));
  EXPECT_EQ(d.json["culprits"][0]["last_completed"]["phase"], "B6.0");
  EXPECT_EQ(d.json["missing"], json::array());
  ASSERT_EQ(d.json["blocked"].size(), 4u);
  EXPECT_EQ(d.json["blocked"][0]["rank"], 0);
  EXPECT_EQ(d.json["blocked"][0]["waiting_for"], json::array({6}));
}

// A rank that stopped sending: 1 waits for F0.0's activation from 0, 0 for B0.0's gradient from 1
// (which 1 cannot send before its F0.0). A cycle: the forward comes first, so 0 is named.
TEST(FlightDiagnosis, CycleOfPipelineWaitsNamesTheRankThatSkippedTheEarlierMessage) {
  for (bool later_first : {false, true}) {
    // The rank that skipped started waiting first or last: the step order decides, not the clock.
    const double t0 = later_first ? 200 : 100, t1 = later_first ? 100 : 200;
    std::vector<FlightRing> rings = {
        RingBuilder(0, 2).comm("pp", {0, 1}).op(0, K::Recv, S::Waiting, 4, "B0.0", 5, 1, 3, t0).ring,
        RingBuilder(1, 2).comm("pp", {0, 1}).op(0, K::Recv, S::Waiting, 4, "F0.0", 5, 0, 1, t1).ring,
    };
    const FlightDiagnosis d = diagnose_flight(rings);
    ASSERT_EQ(d.json["culprits"].size(), 1u) << d.json.dump(1);
    EXPECT_EQ(d.json["culprits"][0]["rank"], 0) << all_lines(d);
    EXPECT_TRUE(has_line(d, "rank 1 is blocked in recv of F0.0 from rank 0 (pp group, tag 1, #4, step 5); rank 0 "
                            "never posted the matching send"))
        << all_lines(d);
    EXPECT_TRUE(has_line(d, "the hang starts at rank 0")) << all_lines(d);
  }
}

// A rank that skipped the data-parallel reduction went on to the grad-norm all-reduce: the dp
// wait comes first in the step, so the skipper is named.
TEST(FlightDiagnosis, CycleOfCollectivesNamesTheRankThatSkipped) {
  std::vector<FlightRing> rings;
  for (int r : {0, 1, 2})
    rings.push_back(RingBuilder(r, 4)
                        .comm("dp", r < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3})
                        .comm("world", {0, 1, 2, 3})
                        .op(0, K::AllReduce, S::Completed, 7, "dp-reduce", 2)
                        .op(1, K::AllReduce, S::Waiting, 3, "grad-norm", 2)
                        .ring);
  rings[2].ops.erase(rings[2].ops.begin());  // rank 2 skipped its dp all-reduce #7
  rings[2].ops[0].seq = 3;
  rings.push_back(RingBuilder(3, 4)
                      .comm("dp", {2, 3})
                      .comm("world", {0, 1, 2, 3})
                      .op(0, K::AllReduce, S::Waiting, 7, "B1.0", 2)
                      .ring);
  const FlightDiagnosis d = diagnose_flight(rings);
  ASSERT_EQ(d.json["culprits"].size(), 1u) << d.json.dump(1);
  EXPECT_EQ(d.json["culprits"][0]["rank"], 2) << all_lines(d);
  EXPECT_TRUE(has_line(d, "dp group (ranks 2,3): all-reduce #7 (B1.0, step 2) entered by 3; rank 2 is blocked in "
                          "all-reduce #3 of the world group (grad-norm, step 2)"))
      << all_lines(d);
  EXPECT_TRUE(has_line(d, "world group (ranks 0,1,2,3): all-reduce #3 (grad-norm, step 2) entered by 0,1,2; rank 3 "
                          "is blocked in all-reduce #7 of the dp group"))
      << all_lines(d);
}

TEST(FlightDiagnosis, RankWithoutARecordIsNamed) {
  std::vector<FlightRing> rings = {
      RingBuilder(0, 3).comm("world", {0, 1, 2}).op(0, K::AllReduce, S::Waiting, 5, "grad-norm", 4).ring,
      RingBuilder(2, 3).comm("world", {0, 1, 2}).op(0, K::AllReduce, S::Failed, 5, "grad-norm", 4).ring,
  };
  const FlightDiagnosis d = diagnose_flight(rings);
  EXPECT_EQ(d.json["missing"], json::array({1}));
  ASSERT_EQ(d.json["culprits"].size(), 1u);
  EXPECT_EQ(d.json["culprits"][0]["rank"], 1);
  EXPECT_EQ(d.json["culprits"][0]["state"], "no-record");
  EXPECT_TRUE(has_line(d, "world group (ranks 0,1,2): all-reduce #5 (grad-norm, step 4) entered by 0,2; rank 1 left "
                          "no flight record (dead, or stuck outside communication)"))
      << all_lines(d);
}

TEST(FlightDiagnosis, PostedCounterpartIsATransferInFlightNotAMissingRank) {
  std::vector<FlightRing> rings = {
      RingBuilder(0, 2).comm("pp", {0, 1}).op(0, K::Send, S::Enqueued, 2, "F3.0", 7, 1, 5).ring,
      RingBuilder(1, 2).comm("pp", {0, 1}).op(0, K::Recv, S::Waiting, 2, "F3.0", 7, 0, 5).ring,
  };
  const FlightDiagnosis d = diagnose_flight(rings);
  EXPECT_TRUE(has_line(d, "rank 0 posted the matching send (still in transfer)")) << all_lines(d);
  EXPECT_EQ(d.json["culprits"].size(), 0u);
  // With another tag the send does not match.
  rings[0].ops[0].tag = 6;
  EXPECT_TRUE(has_line(diagnose_flight(rings), "rank 0 never posted the matching send"));
}

TEST(FlightDiagnosis, NothingBlocked) {
  std::vector<FlightRing> rings = {
      RingBuilder(0, 2).comm("world", {0, 1}).op(0, K::AllReduce, S::Completed, 5, "grad-norm").ring,
      RingBuilder(1, 2).comm("world", {0, 1}).op(0, K::AllReduce, S::Completed, 5, "grad-norm").ring,
  };
  const FlightDiagnosis d = diagnose_flight(rings);
  EXPECT_TRUE(has_line(d, "no rank of the 2 that left a flight record is blocked")) << all_lines(d);
  EXPECT_EQ(d.json["blocked"].size(), 0u);
}

}  // namespace
}  // namespace tripod
