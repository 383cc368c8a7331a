// Zero-bubble schedules as data: I and W actions, the V placement, ZB-H1, ZB-H2, ZB-V,
// DualPipeV and the auto schedule; the validator's rules for split backwards, the simulator's
// idle and memory figures against the closed forms, and PyTorch pipelining's CSV format.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>

#include "core/error.h"
#include "parallel/pipeline/schedules.h"
#include "parallel/pipeline/simulate.h"
#include "parallel/pipeline/zero_bubble.h"
#include "schedule_test_util.h"

namespace tripod {
namespace {

using test::input_error;
using test::join;

// Unit costs F = I = W = 1 (B = 2), free communication.
PipeCosts unit() { return PipeCosts{1, 2, 0}; }

// Counts, independently of the validator, that every (rank, chunk, micro-batch) has one F and
// either one B or one I and one W, the W after the I and the I after the F.
void expect_complete(const Schedule& s) {
  for (int r = 0; r < s.pp; ++r) {
    std::map<std::tuple<int, int, int>, int> pos;  // (kind, chunk, mb) -> position
    for (int i = 0; i < static_cast<int>(s.ranks[r].size()); ++i) {
      const Action& a = s.ranks[r][i];
      auto [it, fresh] = pos.try_emplace({static_cast<int>(a.kind), a.chunk, a.mb}, i);
      EXPECT_TRUE(fresh) << enum_name(s.kind) << " rank " << r << ": " << a.str() << " twice";
    }
    for (int c = 0; c < s.vp; ++c)
      for (int mb = 0; mb < s.microbatches; ++mb) {
        auto get = [&](ActionKind k) {
          auto it = pos.find({static_cast<int>(k), c, mb});
          return it == pos.end() ? -1 : it->second;
        };
        const int f = get(ActionKind::Forward), b = get(ActionKind::Backward), i = get(ActionKind::Input),
                  w = get(ActionKind::Weight);
        ASSERT_GE(f, 0) << enum_name(s.kind) << " rank " << r << " F" << mb << "." << c;
        if (b >= 0) {
          EXPECT_TRUE(i < 0 && w < 0) << enum_name(s.kind) << " rank " << r << " B and I/W of " << mb << "." << c;
          EXPECT_GT(b, f);
        } else {
          ASSERT_TRUE(i >= 0 && w >= 0) << enum_name(s.kind) << " rank " << r << " no backward of " << mb << "." << c;
          EXPECT_GT(i, f);
          EXPECT_GT(w, i);
        }
      }
  }
}

TEST(Action, SplitBackwardsPrintAndParse) {
  EXPECT_EQ(I(3, 1).str(), "I3.1");
  EXPECT_EQ(W(3, 1).str(), "W3.1");
  EXPECT_EQ(parse_action("I3.1"), I(3, 1));
  EXPECT_EQ(parse_action(" W2 "), W(2, 0));
  EXPECT_TRUE(I(0).input_grad() && !I(0).weight_grad());
  EXPECT_TRUE(!W(0).input_grad() && W(0).weight_grad());
  EXPECT_TRUE(B(0).input_grad() && B(0).weight_grad());
  for (const char* bad : {"X1.0", "i1.0", "W", "I-1", "WI1"}) EXPECT_FALSE(parse_action(bad).has_value()) << bad;
}

TEST(Placement, OneMappingBothWays) {
  // pp = 3: loop puts (0,3) (1,4) (2,5) on ranks 0..2; V puts (0,5) (1,4) (2,3).
  Schedule loop, v;
  loop.pp = v.pp = 3;
  loop.vp = v.vp = 2;
  v.placement = Placement::V;
  EXPECT_EQ(loop.stage(0, 1), 3);
  EXPECT_EQ(v.stage(0, 1), 5);
  EXPECT_EQ(v.stage(2, 1), 3);
  for (const Schedule* s : {&loop, &v})
    for (int r = 0; r < 3; ++r)
      for (int c = 0; c < 2; ++c) {
        const int st = s->stage(r, c);
        EXPECT_EQ(s->rank_of_stage(st), r);
        EXPECT_EQ(s->chunk_of_stage(st), c);
      }
  EXPECT_EQ(placement_stage(Placement::Loop, 4, 1, 2), 9);
  EXPECT_EQ(parse_placement("v"), Placement::V);
  EXPECT_FALSE(parse_placement("V").has_value());
  EXPECT_NE(input_error([] { check_placement(Placement::V, 3); }).find("vp = 3"), std::string::npos);
}

TEST(ZeroBubble, EveryScheduleValidatesAndIsComplete) {
  for (int p : {1, 2, 3, 4, 8})
    for (int m : {1, 2, 3, 5, 8, 16}) {
      std::vector<Schedule> all = {build_schedule("zb-h1", p, 1, m), build_schedule("zb-h2", p, 1, m),
                                   build_schedule("zbv", p, 2, m), zbv_schedule(p, m, /*eager=*/true),
                                   build_schedule("auto", p, 1, m)};
      if (m >= 2 * p) all.push_back(build_schedule("dualpipev", p, 2, m));
      for (const Schedule& s : all) {
        SCOPED_TRACE(std::string(enum_name(s.kind)) + " p=" + std::to_string(p) + " m=" + std::to_string(m));
        EXPECT_NO_THROW(validate_schedule(s));  // includes the deadlock check
        expect_complete(s);
        Simulation sim = simulate(s, unit());
        EXPECT_GT(sim.makespan, 0);
      }
    }
}

TEST(ZeroBubble, ZbH1ListsDeferWeightGradients) {
  // Rank r defers r W's; the last rank keeps pp-1 pending until its ramp-down.
  EXPECT_EQ(join(zb_h1_actions(2, 4, 0)), "F0.0 F1.0 I0.0 W0.0 F2.0 I1.0 W1.0 F3.0 I2.0 W2.0 I3.0 W3.0");
  EXPECT_EQ(join(zb_h1_actions(2, 4, 1)), "F0.0 I0.0 F1.0 I1.0 W0.0 F2.0 I2.0 W1.0 F3.0 I3.0 W2.0 W3.0");
}

TEST(ZeroBubble, IdleMatchesClosedFormsWithUnitCosts) {
  for (int p : {2, 3, 4, 8})
    for (int m : {p, 2 * p, 4 * p, 4 * p + 3}) {
      SCOPED_TRACE("p=" + std::to_string(p) + " m=" + std::to_string(m));
      Simulation one = simulate(build_schedule("1f1b", p, 1, m), unit());
      Simulation h1 = simulate(build_schedule("zb-h1", p, 1, m), unit());
      for (int r = 0; r < p; ++r) {
        EXPECT_DOUBLE_EQ(one.ranks[r].idle, 3.0 * (p - 1));
        EXPECT_DOUBLE_EQ(h1.ranks[r].idle, p - 1.0);  // m >= p
      }
      EXPECT_LE(h1.peak_memory, p);  // 1F1B's peak
      EXPECT_DOUBLE_EQ(h1.peak_memory, one.peak_memory);
      if (m < 2 * p) continue;
      // m >= 2p: ZB-H2 and ZB-V (the paper's order, at 1F1B's memory) have no idle when steps
      // overlap (period = busy); ZB-H2 idles pp-1 in a synchronised step (rank r waits r for its
      // first input and pp-1-r at the end).
      Simulation h2 = simulate(build_schedule("zb-h2", p, 1, m), unit());
      Simulation v_eager = simulate(zbv_schedule(p, m, true), unit());
      Simulation v = simulate(build_schedule("zbv", p, 2, m), unit());
      for (int r = 0; r < p; ++r) {
        EXPECT_DOUBLE_EQ(h2.ranks[r].overlapped_idle, 0);
        EXPECT_DOUBLE_EQ(h2.ranks[r].idle, p - 1.0);
        EXPECT_DOUBLE_EQ(v_eager.ranks[r].overlapped_idle, 0);
        EXPECT_DOUBLE_EQ(v.ranks[r].overlapped_idle, 0);
      }
      EXPECT_DOUBLE_EQ(v.period, 6.0 * m);  // every rank: 2 chunks x m x (F + I + W)
      EXPECT_LE(h2.peak_memory, 2 * p - 1);
      EXPECT_DOUBLE_EQ(v.peak_memory, 2 * p);  // 1F1B's memory: pp stages = 2pp chunks
      EXPECT_LE(v_eager.peak_memory, 3 * p - 1);
    }
}

TEST(ZeroBubble, VSchedulesRefuseOtherChunkCounts) {
  EXPECT_NE(input_error([] { build_schedule("zbv", 4, 1, 8); }).find("vp = 1"), std::string::npos);
  EXPECT_NE(input_error([] { build_schedule("dualpipev", 4, 3, 8); }).find("vp = 3"), std::string::npos);
  EXPECT_NE(input_error([] { build_schedule("zbv", 4, 2, 8, Placement::Loop); }).find("got placement = \"loop\""),
            std::string::npos);
  EXPECT_NE(input_error([] { build_schedule("zb-h1", 4, 1, 8, Placement::V); }).find("placement = \"v\" with schedule = \"zb-h1\""),
            std::string::npos);
  EXPECT_NE(input_error([] { build_schedule("zb-h1", 4, 2, 8); }).find("vp = 2"), std::string::npos);
  EXPECT_NE(input_error([] { build_schedule("dualpipev", 4, 2, 7); }).find("2*pp = 8"), std::string::npos);
  // A hand-made V schedule with three chunks.
  Schedule s = build_schedule("zbv", 2, 2, 4);
  s.vp = 3;
  EXPECT_NE(input_error([&] { validate_schedule(s); }).find("vp = 3"), std::string::npos);
}

TEST(ZeroBubble, PublishedOrdersRunAsTheyAre) {
  // ZB-V's order consumes some messages of a peer in another order than the peer sends them
  // (pp = 4): valid as it is (receives are posted in sending order), and what zbv builds.
  Schedule raw;
  raw.kind = ScheduleKind::Zbv;
  raw.pp = 4;
  raw.vp = 2;
  raw.microbatches = 8;
  raw.placement = Placement::V;
  for (int r = 0; r < 4; ++r) raw.ranks.push_back(zbv_actions(4, 8, r));
  EXPECT_NO_THROW(validate_schedule(raw));
  EXPECT_EQ(build_schedule("zbv", 4, 2, 8).ranks, raw.ranks);
  // fifo_order (the eager candidate) moves consumers up so each peer's messages go in order.
  Schedule fixed = fifo_order(raw);
  EXPECT_NE(fixed.ranks, raw.ranks);
  EXPECT_NO_THROW(validate_schedule(fixed));
  expect_complete(fixed);
  const PipePlan plan = plan_pipeline(fixed);
  for (int r = 0; r < 4; ++r) {
    int last = -1;  // the consuming positions of the messages from one peer, in sending order
    for (int q : {r - 1, r + 1}) {
      last = -1;
      for (int id : q >= 0 && q < 4 ? plan.send_msg[q] : std::vector<int>{})
        if (id >= 0 && plan.messages[id].dst_rank == r) {
          EXPECT_GT(plan.messages[id].dst_index, last);
          last = plan.messages[id].dst_index;
        }
    }
  }
  // A schedule already in order stays as it is.
  Schedule h1 = build_schedule("zb-h1", 4, 1, 8);
  EXPECT_EQ(fifo_order(h1).ranks, h1.ranks);
}

// ---- validator rules for split backwards ------------------------------------------------------

TEST(ZeroBubbleValidator, RefusesBrokenSplitBackwards) {
  auto err = [](const char* csv) { return input_error([&] { validate_schedule(parse_schedule_csv(csv, "s.csv")); }); };
  EXPECT_EQ(err("F0,W0,I0\n"), "rank 0 (s.csv:1): W0.0 before I0.0 (W computes the weight gradients from what I keeps)");
  EXPECT_EQ(err("I0,W0\n"), "rank 0 (s.csv:1): I0.0 without F0.0");
  EXPECT_EQ(err("F0,I0,F1,B1\nF0,I0,W0,F1,B1\n"),
            "rank 0 (s.csv:1): W0.0 is missing (I0.0 runs, and its weight gradients are computed only by a W)");
  EXPECT_EQ(err("F0,B0,W0\n"),
            "rank 0 (s.csv:1): B0.0 and W0.0: the backward of a micro-batch is one B, or an I and then a W, not both");
  EXPECT_EQ(err("F0,I0,B0,W0\n"),
            "rank 0 (s.csv:1): B0.0 and W0.0: the backward of a micro-batch is one B, or an I and then a W, not both");
  EXPECT_EQ(err("F0,F0.1,W0.1,I0.1,B0\n"),
            "rank 0 (s.csv:1): W0.1 before I0.1 (W computes the weight gradients from what I keeps)");
  // On one rank an I waits for the next stage's I (or B) as B does.
  EXPECT_EQ(err("F0.0,F0.1,I0.0,I0.1,W0.1,W0.0\n"),
            "rank 0 (s.csv:1): I0.0 before I0.1 (virtual stage 0 needs the gradient from stage 1)");
  EXPECT_NE(err("F0,W0,F1,B1\n").find("W0.0 without I0.0"), std::string::npos);
}

TEST(ZeroBubbleValidator, MessagesAndLastWeightGradient) {
  // I sends the input gradient as B does; W sends nothing: ZB-H1 and 1F1B exchange the same
  // messages.
  for (int p : {2, 4})
    for (int m : {4, 8})
      EXPECT_EQ(plan_pipeline(build_schedule("zb-h1", p, 1, m)).messages.size(),
                plan_pipeline(build_schedule("1f1b", p, 1, m)).messages.size());
  Schedule s = parse_schedule_csv("F0,F1,I0,I1,W1,W0\nF0,I0,F1,I1,W0,W1\n", "m.csv");
  PipePlan plan = plan_pipeline(s);
  for (const PipeMessage& msg : plan.messages) {
    EXPECT_NE(msg.src.kind, ActionKind::Weight);
    if (msg.grad) {
      EXPECT_EQ(msg.src.kind, ActionKind::Input);
      EXPECT_EQ(msg.dst.kind, ActionKind::Input);
    }
  }
  // Gradients are final after the chunk's last W (or B).
  EXPECT_EQ(plan.last_backward[0][0], 5);
  EXPECT_EQ(s.ranks[0][5], W(0));
  EXPECT_EQ(plan.last_backward[1][0], 5);
  // A rank holding a B where its peer split: B and I exchange the same gradient.
  EXPECT_NO_THROW(validate_schedule(parse_schedule_csv("F0,F1,I0,B1,W0\nF0,B0,F1,I1,W1\n", "mix.csv")));
}

// ---- simulator ------------------------------------------------------------------------------

TEST(ZeroBubbleSimulator, SeparateCostsAndMemoryBetweenIAndW) {
  // One rank, one micro-batch: F I W takes F + I + W.
  Schedule s = parse_schedule_csv("F0,I0,W0\n", "one.csv");
  PipeCosts c{1, 5, 0};
  c.weight = 2;  // I = 3
  Simulation sim = simulate(s, c);
  EXPECT_DOUBLE_EQ(sim.makespan, 6);
  EXPECT_DOUBLE_EQ(sim.ranks[0].timeline[1].end - sim.ranks[0].timeline[1].start, 3);
  EXPECT_DOUBLE_EQ(sim.ranks[0].timeline[2].end - sim.ranks[0].timeline[2].start, 2);
  // Without a split, I and W take half the backward each.
  EXPECT_DOUBLE_EQ(simulate(s, PipeCosts{1, 4, 0}).ranks[0].timeline[2].start, 3);
  // Per-stage F, I, W times: B = I + W.
  StageCosts st = stage_costs_fiw({1}, {2}, {3}, 2);
  EXPECT_EQ(st.backward, (std::vector<double>{5, 5}));
  Schedule two = build_schedule("zb-h1", 2, 1, 2);
  Simulation a = simulate(two, plan_pipeline(two), PipeCosts{}, st);
  EXPECT_DOUBLE_EQ(a.ranks[0].busy, 2 * (1 + 2 + 3));
  EXPECT_NE(input_error([] { stage_costs_fiw({1, 2, 3}, {1}, {1}, 2); }).find("3 forward times for 2"),
            std::string::npos);
  // Memory: two micro-batches waiting for their W hold 2 units at weight_memory 1, 1 at 0.5.
  Schedule hold = parse_schedule_csv("F0,F1,I0,I1,W0,W1\n", "h.csv");
  PipeCosts full{1, 2, 0};
  EXPECT_DOUBLE_EQ(simulate(hold, full).peak_memory, 2);
  EXPECT_EQ(simulate(hold, full).peak_inflight, 2);
  PipeCosts half = full;
  half.weight_memory = 0.25;
  Schedule late = parse_schedule_csv("F0,I0,F1,I1,W0,W1\n", "l.csv");
  EXPECT_DOUBLE_EQ(simulate(late, half).peak_memory, 1.25);  // 0.25 (W0 pending) + 1 (F1)
  EXPECT_DOUBLE_EQ(simulate(late, full).peak_memory, 2);
  // Bad costs.
  PipeCosts bad{1, 2, 0};
  bad.weight = 3;
  EXPECT_NE(input_error([&] { simulate(s, bad); }).find("at most the backward"), std::string::npos);
}

// ---- auto -----------------------------------------------------------------------------------

TEST(AutoSchedule, NeverWorseThanTheBestFixedScheduleWithinTheCap) {
  struct Case {
    int p, m;
    std::vector<double> f, i, w;
  };
  const std::vector<Case> cases = {
      {4, 8, {1}, {1}, {1}},
      {4, 16, {1}, {1.5}, {0.5}},
      {4, 12, {1, 1, 1, 1.3}, {1, 1, 1, 1.4}, {1, 1, 1, 1.2}},  // a heavy last stage (the head)
      {3, 7, {2}, {1}, {3}},
      {8, 16, {1}, {1}, {1}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE("p=" + std::to_string(c.p) + " m=" + std::to_string(c.m));
    StageCosts sc = stage_costs_fiw(c.f, c.i, c.w, c.p);
    AutoSchedule a = auto_schedule(c.p, 1, Placement::Loop, c.m, sc, 0, 0);
    EXPECT_NO_THROW(validate_schedule(a.schedule));
    expect_complete(a.schedule);
    PipeCosts pc;
    Simulation mine = simulate(a.schedule, plan_pipeline(a.schedule), pc, sc);
    EXPECT_LE(mine.peak_memory, c.p + 1e-9);  // default cap: what 1F1B holds
    for (const char* k : {"gpipe", "1f1b", "zb-h1", "zb-h2"}) {
      Schedule f = build_schedule(k, c.p, 1, c.m);
      Simulation fs = simulate(f, plan_pipeline(f), pc, sc);
      if (fs.peak_memory <= c.p + 1e-9) {
        EXPECT_LE(mine.makespan, fs.makespan + 1e-9) << k;
      }
    }
    // With twice the memory it may only get better.
    AutoSchedule roomy = auto_schedule(c.p, 1, Placement::Loop, c.m, sc, 0, 2 * c.p);
    EXPECT_LE(simulate(roomy.schedule, plan_pipeline(roomy.schedule), pc, sc).makespan, mine.makespan + 1e-9);
    EXPECT_FALSE(a.chosen.empty());
    EXPECT_EQ(a.schedule.kind, ScheduleKind::Auto);
  }
  // V placement: against zbv and dualpipev.
  StageCosts sc = stage_costs_fiw({1}, {1}, {1}, 8);
  AutoSchedule v = auto_schedule(4, 2, Placement::V, 8, sc, 0, 0);
  EXPECT_EQ(v.schedule.placement, Placement::V);
  Schedule z = build_schedule("zbv", 4, 2, 8);
  EXPECT_LE(simulate(v.schedule, plan_pipeline(v.schedule), PipeCosts{}, sc).makespan,
            simulate(z, plan_pipeline(z), PipeCosts{}, sc).makespan + 1e-9);
  // A cap nothing fits.
  EXPECT_NE(input_error([&] { auto_schedule(4, 1, Placement::Loop, 8, StageCosts{}, 0, 0.5); }).find("raise the memory cap"),
            std::string::npos);
}

TEST(AutoSchedule, ListSchedulesValidateForUnevenCosts) {
  for (int p : {2, 3, 5})
    for (int m : {1, 4, 9})
      for (Placement pl : {Placement::Loop, Placement::V}) {
        ListScheduleOptions o;
        o.pp = p;
        o.vp = pl == Placement::V ? 2 : 1;
        o.microbatches = m;
        o.placement = pl;
        const int S = p * o.vp;
        for (int st = 0; st < S; ++st) {
          o.costs.forward.push_back(1 + 0.37 * ((st * 7) % 5));
          o.costs.backward.push_back(2 + 0.29 * ((st * 3) % 4));
          o.costs.weight.push_back(0.5 + 0.2 * (st % 3));
        }
        o.cap.assign(p, 2.0 * o.vp);
        for (bool split : {true, false}) {
          o.split_backward = split;
          Schedule s = list_schedule(o, ScheduleKind::Auto);
          SCOPED_TRACE("p=" + std::to_string(p) + " m=" + std::to_string(m) + (split ? " split" : " B"));
          EXPECT_NO_THROW(validate_schedule(s));
          expect_complete(s);
        }
      }
}

// ---- CSV formats ----------------------------------------------------------------------------

TEST(ScheduleCsvZb, TripodFormatTakesIWAndThePlacement) {
  for (const Schedule& s : {build_schedule("zb-h1", 3, 1, 5), build_schedule("zbv", 3, 2, 6),
                            build_schedule("dualpipev", 2, 2, 4)}) {
    std::string text = schedule_csv(s);
    Schedule back = parse_schedule_csv(text, "t.csv");
    EXPECT_EQ(back.ranks, s.ranks) << enum_name(s.kind);
    EXPECT_EQ(back.placement, s.placement) << enum_name(s.kind);
    EXPECT_EQ(back.vp, s.vp);
    const std::string again = schedule_csv(back);  // the same but for the kind in the comment line
    EXPECT_EQ(again.substr(again.find('\n')), text.substr(text.find('\n')));
  }
  EXPECT_NE(schedule_csv(build_schedule("zbv", 2, 2, 4)).find("\nplacement = v\n"), std::string::npos);
}

TEST(ScheduleCsvZb, PyTorchFormatRoundTrips) {
  // ZB-H1 pp=2 m=2 as PyTorch writes it: <stage><F|I|W|B><micro-batch>.
  Schedule h1 = build_schedule("zb-h1", 2, 1, 2);
  EXPECT_EQ(schedule_csv_pytorch(h1), "0F0,0F1,0I0,0W0,0I1,0W1\n1F0,1I0,1F1,1I1,1W0,1W1\n");
  // V placement: rank 0 holds stages 0 and 3 for pp = 2.
  Schedule v = build_schedule("zbv", 2, 2, 4);
  const std::string pt = schedule_csv_pytorch(v);
  EXPECT_EQ(pt.substr(0, 4), "0F0,");
  EXPECT_NE(pt.find("3I0"), std::string::npos);
  for (const Schedule& s : {h1, v, build_schedule("interleaved", 2, 3, 4), build_schedule("dualpipev", 3, 2, 6),
                            build_schedule("1f1b", 4, 1, 6)}) {
    Schedule back = parse_schedule_csv(schedule_csv_pytorch(s), "pt.csv");
    EXPECT_EQ(back.ranks, s.ranks) << enum_name(s.kind);
    EXPECT_EQ(back.placement, s.placement) << enum_name(s.kind);
    EXPECT_EQ(back.vp, s.vp) << enum_name(s.kind);
    EXPECT_EQ(back.microbatches, s.microbatches) << enum_name(s.kind);
    EXPECT_EQ(schedule_csv_pytorch(back), schedule_csv_pytorch(s));
    // And back through tripod's format.
    EXPECT_EQ(parse_schedule_csv(schedule_csv(back), "t.csv").ranks, s.ranks);
  }
  // Empty cells (PyTorch's idle steps) are skipped; the format may be forced.
  Schedule e = parse_schedule_csv("0F0,,0F1,0B0,,0B1\n,1F0,1B0,1F1,1B1\n", "e.csv", ScheduleCsvFormat::PyTorch);
  EXPECT_EQ(join(e.ranks[0]), "F0.0 F1.0 B0.0 B1.0");
  EXPECT_EQ(join(e.ranks[1]), "F0.0 B0.0 F1.0 B1.0");
  EXPECT_NO_THROW(validate_schedule(e));
}

TEST(ScheduleCsvZb, BadCellsNameFileLineRankAndAction) {
  EXPECT_EQ(input_error([] { parse_schedule_csv("F0,B0\n\nF0,X1.0,B0\n", "x.csv"); }),
            "x.csv:3 (rank 1): 'X1.0' is not an action: expected F, B, I or W, then <micro-batch>.<chunk>, e.g. F3.1 "
            "or W2.0");
  EXPECT_EQ(input_error([] { parse_schedule_csv("0F0,0X1\n", "p.csv"); }),
            "p.csv:1 (rank 0): '0X1' is not a compute action of PyTorch's compute_only format: expected "
            "<stage><F|I|W|B><micro-batch>, e.g. 0F1 or 1W0");
  EXPECT_NE(input_error([] { parse_schedule_csv("0F0,0SEND_F0\n", "p.csv"); }).find("communication and resharding"),
            std::string::npos);
  // Forcing tripod's format on a PyTorch file names the first cell.
  EXPECT_NE(input_error([] { parse_schedule_csv("0F0\n", "f.csv", ScheduleCsvFormat::Tripod); }).find("'0F0'"),
            std::string::npos);
  // A stage on a row where neither placement puts it.
  EXPECT_EQ(input_error([] { parse_schedule_csv("0F0,2F0\n1F0,3F0,0F0\n", "w.csv"); }),
            "w.csv:2 (rank 1): 0F0: stage 0 is not on rank 1 in the loop placement (rank r holds stages r, r+2, ...) "
            "nor in the v placement (rank r holds stages r and 3-r)");
  EXPECT_NE(input_error([] { parse_schedule_csv("0F0\n1F0,2F0\n", "n.csv"); }).find("n.csv: stages 0..2 on 2 ranks"),
            std::string::npos);
  // V placement with another chunk count.
  EXPECT_EQ(input_error([] { parse_schedule_csv("placement = v\nF0.0,F0.2\n", "v.csv"); }),
            "v.csv:2 (rank 0): F0.2: chunk 2, but placement v (line 1) puts exactly 2 model chunks, 0 and 1, on each "
            "rank");
  EXPECT_NE(input_error([] { parse_schedule_csv("placement = v\nF0,B0\n", "v1.csv"); }).find("v1.csv:1: placement v"),
            std::string::npos);
  EXPECT_NE(input_error([] { parse_schedule_csv("placement = w\nF0,B0\n", "pw.csv"); }).find("placement 'w'"),
            std::string::npos);
}

}  // namespace
}  // namespace tripod
