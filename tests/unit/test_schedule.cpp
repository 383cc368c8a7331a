// Pipeline schedules as data: the builders, the CSV format, the validator's refusals, and the
// simulator's bubble and peak in-flight figures against the closed forms of the papers.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "parallel/pipeline/schedules.h"
#include "parallel/pipeline/simulate.h"
#include "schedule_test_util.h"

namespace tripod {
namespace {

using test::input_error;
using test::join;

TEST(Action, PrintsAndParses) {
  EXPECT_EQ(F(3, 1).str(), "F3.1");
  EXPECT_EQ(B(12, 0).str(), "B12.0");
  EXPECT_EQ(parse_action("F3.1"), F(3, 1));
  EXPECT_EQ(parse_action(" B2 "), B(2, 0));
  EXPECT_EQ(parse_action("B10.3"), B(10, 3));
  for (const char* bad : {"", "F", "G1.0", "f1.0", "F-1.0", "F1.", "F1.2.3", "F 1", "F1.x", "F+1", "F99999999999"})
    EXPECT_FALSE(parse_action(bad).has_value()) << bad;
}

TEST(Schedules, GPipeAndOneFOneBLists) {
  EXPECT_EQ(join(gpipe_actions(3, 3, 1)), "F0.0 F1.0 F2.0 B0.0 B1.0 B2.0");
  // Warm-up pp-r-1 forwards, then one forward one backward, then the rest of the backwards.
  EXPECT_EQ(join(one_f_one_b_actions(4, 6, 0)), "F0.0 F1.0 F2.0 F3.0 B0.0 F4.0 B1.0 F5.0 B2.0 B3.0 B4.0 B5.0");
  EXPECT_EQ(join(one_f_one_b_actions(4, 6, 2)), "F0.0 F1.0 B0.0 F2.0 B1.0 F3.0 B2.0 F4.0 B3.0 F5.0 B4.0 B5.0");
  EXPECT_EQ(join(one_f_one_b_actions(4, 6, 3)), "F0.0 B0.0 F1.0 B1.0 F2.0 B2.0 F3.0 B3.0 F4.0 B4.0 F5.0 B5.0");
  // Fewer micro-batches than stages: the warm-up is cut to m.
  EXPECT_EQ(join(one_f_one_b_actions(4, 2, 0)), "F0.0 F1.0 B0.0 B1.0");
}

TEST(Schedules, InterleavedFollowsMegatronChunkOrder) {
  // m == pp: rank 0 warms up with every forward.
  EXPECT_EQ(join(interleaved_actions(2, 2, 2, 0)), "F0.0 F1.0 F0.1 F1.1 B0.1 B1.1 B0.0 B1.0");
  // Forwards go pp micro-batches at a time through chunk 0, then chunk 1; backwards mirror the
  // chunks. Rank 0 warms up with 2*(pp-1) + (vp-1)*pp = 4 forwards, rank 1 with 2.
  EXPECT_EQ(join(interleaved_actions(2, 2, 4, 0)),
            "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0");
  EXPECT_EQ(join(interleaved_actions(2, 2, 4, 1)),
            "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0");
  // Three chunks: chunk order 0,1,2 forward and 2,1,0 backward within each group of pp.
  auto l = interleaved_actions(2, 3, 2, 1);
  EXPECT_EQ(join(l), "F0.0 F1.0 F0.1 F1.1 F0.2 B0.2 F1.2 B1.2 B0.1 B1.1 B0.0 B1.0");
}

TEST(Schedules, BadNumbersAreRefusedNamingThem) {
  EXPECT_NE(input_error([] { build_schedule("1f1b", 0, 1, 4); }).find("pp = 0"), std::string::npos);
  EXPECT_NE(input_error([] { build_schedule("1f1b", -2, 1, 4); }).find("pp = -2"), std::string::npos);
  EXPECT_NE(input_error([] { build_schedule("gpipe", 2, 0, 4); }).find("vp = 0"), std::string::npos);
  EXPECT_NE(input_error([] { build_schedule("gpipe", 2, 1, 0); }).find("microbatches = 0"), std::string::npos);
  EXPECT_NE(input_error([] { build_schedule("1f1b", 2, 2, 4); }).find("vp = 2"), std::string::npos);
  EXPECT_NE(input_error([] { build_schedule("interleaved", 2, 1, 4); }).find("vp = 1"), std::string::npos);
  std::string e = input_error([] { build_schedule("interleaved", 4, 2, 6); });
  EXPECT_NE(e.find("microbatches = 6 is not a multiple of pp = 4"), std::string::npos) << e;
  EXPECT_NE(input_error([] { build_schedule("zigzag", 2, 1, 4); }).find("'zigzag'"), std::string::npos);
  EXPECT_NE(input_error([] { build_schedule("gpipe", 4096, 1, 100000); }).find("too large"), std::string::npos);
}

// Bubble fraction = idle time / makespan per rank, with forward 1, backward 2 and free messages.
TEST(Simulator, BubbleMatchesClosedFormsOverSweep) {
  for (const char* kind : {"gpipe", "1f1b"})
    for (int p : {1, 2, 3, 4, 5, 8})
      for (int m = 1; m <= 16; ++m) {
        Simulation sim = simulate(build_schedule(kind, p, 1, m), PipeCosts{1, 2, 0});
        const double want = double(p - 1) / (m + p - 1);
        EXPECT_DOUBLE_EQ(sim.makespan, 3.0 * (m + p - 1)) << kind << " p=" << p << " m=" << m;
        for (int r = 0; r < p; ++r) EXPECT_NEAR(sim.ranks[r].bubble, want, 1e-12) << kind << " p=" << p << " m=" << m;
      }
  for (int p : {1, 2, 3, 4, 8})
    for (int v : {2, 3, 4})
      for (int m : {p, 2 * p, 3 * p, 4 * p}) {
        Simulation sim = simulate(build_schedule("interleaved", p, v, m), PipeCosts{1, 2, 0});
        const double want = double(p - 1) / (v * m + p - 1);
        for (int r = 0; r < p; ++r) EXPECT_NEAR(sim.ranks[r].bubble, want, 1e-12) << "p=" << p << " v=" << v << " m=" << m;
      }
}

// Evaluation's forward-only schedule: valid for any (pp, vp, m), no backward anywhere, bubble
// (pp-1)/(vp*m+pp-1) when m >= pp (the next chunk's first input is back by then), and a B in it
// is refused.
TEST(Simulator, ForwardOnlySchedule) {
  EXPECT_EQ(join(forward_only_schedule(2, 2, 2).ranks[1]), "F0.0 F1.0 F0.1 F1.1");
  for (int p : {1, 2, 3, 4})
    for (int v : {1, 2, 3})
      for (int m : {1, 2, 4, 7}) {
        Schedule s = forward_only_schedule(p, v, m);
        Simulation sim = simulate(s, PipeCosts{1, 2, 0});
        for (int r = 0; r < p; ++r) {
          EXPECT_EQ(static_cast<int>(s.ranks[r].size()), v * m);
          if (m >= p) {
            EXPECT_NEAR(sim.ranks[r].bubble, double(p - 1) / (v * m + p - 1), 1e-12)
                << "p=" << p << " v=" << v << " m=" << m;
          }
        }
      }
  Schedule bad = forward_only_schedule(2, 1, 2);
  bad.ranks[1].push_back(B(0));
  EXPECT_NE(input_error([&] { validate_schedule(bad); }).find("B0.0 in a forward-only schedule"), std::string::npos)
      << input_error([&] { validate_schedule(bad); });
  Schedule missing = forward_only_schedule(2, 1, 2);
  missing.ranks[0].pop_back();
  EXPECT_NE(input_error([&] { validate_schedule(missing); }).find("F1.0 is missing"), std::string::npos);
}

TEST(Simulator, BubbleDoesNotDependOnTheBackwardToForwardRatio) {
  for (double b : {1.0, 3.0}) {
    EXPECT_NEAR(simulate(build_schedule("1f1b", 4, 1, 8), {1, b, 0}).bubble, 3.0 / 11, 1e-12);
    EXPECT_NEAR(simulate(build_schedule("interleaved", 4, 2, 8), {1, b, 0}).bubble, 3.0 / 19, 1e-12);
  }
}

// Peak in-flight = most (micro-batch, chunk) activations held at once on a rank.
TEST(Simulator, PeakInflight) {
  for (int p : {1, 2, 4, 8})
    for (int m : {1, 3, 8, 16}) {
      Simulation g = simulate(build_schedule("gpipe", p, 1, m), {});
      Simulation o = simulate(build_schedule("1f1b", p, 1, m), {});
      for (int r = 0; r < p; ++r) {
        EXPECT_EQ(g.ranks[r].peak_inflight, m);                    // GPipe holds every micro-batch
        EXPECT_EQ(o.ranks[r].peak_inflight, std::min(p - r, m));  // 1F1B: at most p
      }
      EXPECT_LE(o.peak_inflight, p);
    }
  // Interleaved: rank r warms up with w = 2(p-r-1) + (v-1)p forwards, so it holds
  // min(v*m, w + 1) chunk activations; rank 0 with m >= 2p holds (v+1)p - 1 of them, i.e.
  // p + (p-1)/v stages' worth: more than 1F1B's p by (p-1)/v (Narayanan et al. 2021).
  for (int p : {2, 3, 4, 8})
    for (int v : {2, 3, 4})
      for (int m : {p, 2 * p, 4 * p}) {
        Simulation sim = simulate(build_schedule("interleaved", p, v, m), {});
        for (int r = 0; r < p; ++r)
          EXPECT_EQ(sim.ranks[r].peak_inflight, std::min(v * m, 2 * (p - r - 1) + (v - 1) * p + 1))
              << "p=" << p << " v=" << v << " m=" << m << " r=" << r;
        if (m >= 2 * p) {
          EXPECT_DOUBLE_EQ(double(sim.ranks[0].peak_inflight) / v, p + double(p - 1) / v);
        }
      }
  // Per chunk: pp=2 vp=2 m=4, rank 0 holds 4 micro-batches on chunk 0 and 2 on chunk 1.
  Simulation s = simulate(build_schedule("interleaved", 2, 2, 4), {});
  EXPECT_EQ(s.ranks[0].peak_inflight_per_chunk, (std::vector<int>{4, 2}));
}

TEST(Simulator, CommunicationCostOnTheCriticalPath) {
  // One micro-batch through 3 stages: 3 forwards, 3 backwards (2 each), 4 messages of 0.5.
  Simulation sim = simulate(build_schedule("gpipe", 3, 1, 1), {1, 2, 0.5});
  EXPECT_DOUBLE_EQ(sim.makespan, 3 * 1 + 3 * 2 + 4 * 0.5);
  EXPECT_DOUBLE_EQ(sim.ranks[2].timeline[0].start, 2 * 1 + 2 * 0.5);
}

TEST(Plan, SendBuffersAreFreedDuringTheStep) {
  // The executor waits on a send once the receiver is known to have used it, so what a 1F1B
  // rank holds does not grow with the number of micro-batches.
  for (int p : {2, 4}) {
    Schedule a = build_schedule("1f1b", p, 1, 8), b = build_schedule("1f1b", p, 1, 32);
    PipePlan pa = plan_pipeline(a), pb = plan_pipeline(b);
    for (int r = 0; r < p; ++r) {
      EXPECT_EQ(plan_peak_buffers(pa, a, r), plan_peak_buffers(pb, b, r)) << "p=" << p << " r=" << r;
      EXPECT_LE(plan_peak_buffers(pb, b, r), p + 2);
    }
  }
  // GPipe holds every forward output until the backwards start.
  Schedule g = build_schedule("gpipe", 2, 1, 8);
  EXPECT_GE(plan_peak_buffers(plan_pipeline(g), g, 0), 8);
}

TEST(Plan, MessagesAreBetweenNeighbouringStages) {
  Schedule s = build_schedule("interleaved", 2, 2, 2);
  PipePlan plan = plan_pipeline(s);
  // 4 stages, 3 boundaries, 2 micro-batches, both directions.
  EXPECT_EQ(plan.messages.size(), 3u * 2 * 2);
  for (const PipeMessage& m : plan.messages) {
    const int from = s.stage(m.src_rank, m.src.chunk), to = s.stage(m.dst_rank, m.dst.chunk);
    EXPECT_EQ(to, m.grad ? from - 1 : from + 1);
    EXPECT_EQ(m.src.mb, m.dst.mb);
  }
}

// ---- custom schedules ----------------------------------------------------------------------

TEST(ScheduleCsv, ParsesAndRoundTrips) {
  Schedule s = parse_schedule_csv("# a comment\n\nF0, F1.0 , B0,B1\n  F0.0,B0.0,,F1.0,B1.0,,\r\n", "t.csv");
  EXPECT_EQ(s.kind, ScheduleKind::Custom);
  EXPECT_EQ(s.pp, 2);
  EXPECT_EQ(s.vp, 1);
  EXPECT_EQ(s.microbatches, 2);
  EXPECT_EQ(join(s.ranks[0]), "F0.0 F1.0 B0.0 B1.0");
  EXPECT_EQ(join(s.ranks[1]), "F0.0 B0.0 F1.0 B1.0");
  EXPECT_EQ(s.source_lines, (std::vector<int>{3, 4}));
  validate_schedule(s);

  Schedule i = build_schedule("interleaved", 4, 3, 8);
  Schedule back = parse_schedule_csv(schedule_csv(i), "i.csv");
  EXPECT_EQ(back.pp, 4);
  EXPECT_EQ(back.vp, 3);
  EXPECT_EQ(back.microbatches, 8);
  EXPECT_EQ(back.ranks, i.ranks);
}

TEST(ScheduleCsv, BadCellsNameLineAndCell) {
  std::string e = input_error([] { parse_schedule_csv("F0,B0\n\nF0,G1.0,B0\n", "x.csv"); });
  EXPECT_EQ(e, "x.csv:3 (rank 1): 'G1.0' is not an action: expected F, B, I or W, then <micro-batch>.<chunk>, e.g. "
            "F3.1 or W2.0");
  EXPECT_NE(input_error([] { parse_schedule_csv("# only a comment\n", "e.csv"); }).find("e.csv: no schedule rows"),
            std::string::npos);
  EXPECT_NE(input_error([] { load_schedule_csv("/nonexistent/s.csv"); }).find("/nonexistent/s.csv: cannot read"),
            std::string::npos);
}

TEST(Validator, NamesTheFirstBrokenDependency) {
  // Rank 1 (line 3 of the file) runs B2.0 before F2.0.
  Schedule s = parse_schedule_csv("F0,F1,F2,B0,B1,B2\n# rank 1:\nF0,B0,F1,B1,B2,F2\n", "bad.csv");
  EXPECT_EQ(input_error([&] { validate_schedule(s); }), "rank 1 (bad.csv:3): B2.0 before F2.0");
  // Built in memory: no file to name.
  s.source.clear();
  EXPECT_EQ(input_error([&] { validate_schedule(s); }), "rank 1: B2.0 before F2.0");
  // On one rank holding consecutive stages (pp = 1), chunk order matters too.
  Schedule c = parse_schedule_csv("F0.1,F0.0,B0.1,B0.0\n", "c.csv");
  EXPECT_EQ(input_error([&] { validate_schedule(c); }),
            "rank 0 (c.csv:1): F0.1 before F0.0 (virtual stage 1 takes the output of stage 0)");
  Schedule d = parse_schedule_csv("F0.0,F0.1,B0.0,B0.1\n", "d.csv");
  EXPECT_EQ(input_error([&] { validate_schedule(d); }),
            "rank 0 (d.csv:1): B0.0 before B0.1 (virtual stage 0 needs the gradient from stage 1)");
}

TEST(Validator, RefusesMalformedLists) {
  EXPECT_EQ(input_error([] { validate_schedule(parse_schedule_csv("F0,F1,B0,B1\nF0,B0,F0,B1,F1\n", "m.csv")); }),
            "rank 1 (m.csv:2): F0.0 appears twice (positions 1 and 3)");
  EXPECT_EQ(input_error([] { validate_schedule(parse_schedule_csv("F0,F1,B0,B1\nF0,B0,F1\n", "m.csv")); }),
            "rank 1 (m.csv:2): B1.0 is missing (every rank runs F and B, or F, I and W, of each of the 2 "
            "micro-batches on each of its 1 chunks)");
  Schedule s = build_schedule("1f1b", 2, 1, 2);
  s.ranks[0][0] = F(0, 1);
  EXPECT_EQ(input_error([&] { validate_schedule(s); }), "rank 0: F0.1: chunk 1 is out of range (vp = 1 chunks per rank)");
  s = build_schedule("1f1b", 2, 1, 2);
  s.ranks[1][2] = F(7);
  EXPECT_EQ(input_error([&] { validate_schedule(s); }),
            "rank 1: F7.0: micro-batch 7 is out of range (microbatches = 2)");
}

TEST(Validator, FindsDeadlockCycles) {
  // Rank 0 wants B0's gradient before sending F1; rank 1 runs B0 only after F1.
  Schedule s = parse_schedule_csv("F0,B0,F1,B1\nF0,F1,B0,B1\n", "dl.csv");
  EXPECT_EQ(input_error([&] { validate_schedule(s); }),
            "schedule deadlocks: rank 0 (dl.csv:1) waits before B0.0 for the gradient of B0.0 from rank 1, which "
            "rank 1 runs after F1.0; rank 1 (dl.csv:2) waits before F1.0 for the activation of F1.0 from rank 0, "
            "which rank 0 runs after B0.0");
}

TEST(Validator, MessagesMayBeConsumedInAnyOrderAndArePostedInSendingOrder) {
  // Rank 1 runs F1 before F0, whose activation rank 0 sent first: its receive of F0's message is
  // posted first (so the two match as they were sent, as NCCL needs) and waited on second.
  Schedule s = parse_schedule_csv("F0,F1,B0,B1\nF1,F0,B0,B1\n", "o.csv");
  const PipePlan plan = plan_pipeline(s);
  std::vector<std::string> ops;
  for (const PlanOp& op : plan.ranks[1])
    if (op.kind == PlanOpKind::PostRecv || op.kind == PlanOpKind::WaitRecv)
      ops.push_back(std::string(op.kind == PlanOpKind::PostRecv ? "post " : "wait ") +
                    plan.messages[op.index].src.str());
  EXPECT_EQ(ops, (std::vector<std::string>{"post F0.0", "post F1.0", "wait F1.0", "wait F0.0"}));
  EXPECT_EQ(plan_peak_buffers(plan, s, 1), 2);
  const Simulation sim = simulate(s, PipeCosts{});
  // Rank 1: F1 at 2 (once rank 0 has sent it), F0, B0 until 6, B1 until 8; rank 0: B0 6-8, B1 8-10.
  EXPECT_DOUBLE_EQ(sim.makespan, 10);
}

TEST(Validator, AcceptsEveryBuiltSchedule) {
  for (int p : {1, 2, 3, 4, 6})
    for (int m : {1, 2, 5, 12}) {
      validate_schedule(build_schedule("gpipe", p, 1, m));
      validate_schedule(build_schedule("1f1b", p, 1, m));
      for (int v : {2, 3})
        if (m % p == 0) validate_schedule(build_schedule("interleaved", p, v, m));
    }
}

}  // namespace
}  // namespace tripod
