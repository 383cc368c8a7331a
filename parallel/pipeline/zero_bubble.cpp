// The zero-bubble schedules: a list scheduler, ZB-H1, ZB-H2, ZB-V, DualPipeV, and the auto
// schedule; see zero_bubble.h.
#include "parallel/pipeline/zero_bubble.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <set>
#include <utility>

#include "core/error.h"
#include "parallel/pipeline/schedules.h"

namespace tripod {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kEps = 1e-9;

struct RankState {
  double clock = 0;
  std::vector<int> next_f, next_b;  // per chunk: the next micro-batch to run forward / backward
  std::deque<std::pair<int, int>> pending_w;  // (micro-batch, chunk) with I done, W not yet
  double held = 0;
  std::vector<Action> list;
};

}  // namespace

Schedule list_schedule(const ListScheduleOptions& o, ScheduleKind kind) {
  const int P = o.pp, V = o.vp, M = o.microbatches, S = P * V;
  TRIPOD_CHECK(P >= 1 && V >= 1 && M >= 1, "list schedule: pp {} vp {} m {}", P, V, M);
  Schedule s;
  s.kind = kind;
  s.pp = P;
  s.vp = V;
  s.microbatches = M;
  s.placement = o.placement;
  check_placement(o.placement, V);
  auto cost = [&](const std::vector<double>& v, int st, double dflt) { return v.empty() ? dflt : v[st]; };
  auto f_time = [&](int st) { return cost(o.costs.forward, st, 1.0); };
  auto w_time = [&](int st) {
    return o.costs.weight.empty() ? cost(o.costs.backward, st, 2.0) / 2 : o.costs.weight[st];
  };
  auto b_time = [&](int st) { return cost(o.costs.backward, st, 2.0); };

  std::vector<double> fend(static_cast<size_t>(S) * M, -1), gend(static_cast<size_t>(S) * M, -1);
  auto at = [&](int st, int mb) { return static_cast<size_t>(st) * M + mb; };
  // Messages between two ranks in sending order: key (grad, receiving stage, micro-batch).
  std::map<std::pair<int, int>, std::deque<long long>> queues;
  auto key = [&](bool grad, int st, int mb) { return (static_cast<long long>(grad) * S + st) * M + mb; };
  auto head_is = [&](int src, int dst, long long k) {
    auto it = queues.find({src, dst});
    return it != queues.end() && !it->second.empty() && it->second.front() == k;
  };

  std::vector<RankState> ranks(P);
  for (auto& r : ranks) {
    r.next_f.assign(V, 0);
    r.next_b.assign(V, 0);
  }
  auto cap_of = [&](int r) { return o.cap.empty() ? kInf : o.cap[r]; };

  // The action rank r would start next and when; ignore_cap lets a forward run over the cap.
  struct Choice {
    double t = kInf;
    Action a;
  };
  auto choose = [&](int r, bool ignore_cap) {
    RankState& rs = ranks[r];
    const bool w_first =
        !rs.pending_w.empty() && o.max_pending_w >= 0 && static_cast<int>(rs.pending_w.size()) >= o.max_pending_w;
    // Candidates: (ready time, priority class, tie-break, action). Classes: the input gradient 0,
    // W 1 when past max_pending_w, the forward 2, W 3.
    struct Cand {
      double t;
      int cls;
      long long tie;
      Action a;
    };
    std::vector<Cand> cands;
    for (int c = 0; c < V; ++c) {
      const int st = s.stage(r, c);
      int mb = rs.next_b[c];
      if (mb < M && fend[at(st, mb)] >= 0) {
        double t = kInf;
        if (st == S - 1) {
          t = fend[at(st, mb)];
        } else if (gend[at(st + 1, mb)] >= 0) {
          const int src = s.rank_of_stage(st + 1);
          if (src == r) t = gend[at(st + 1, mb)];
          else if (head_is(src, r, key(true, st, mb))) t = gend[at(st + 1, mb)] + o.comm;
        }
        // The oldest micro-batch first, then the later stage.
        if (t < kInf) cands.push_back({t, 0, static_cast<long long>(mb) * S + (S - 1 - st), o.split_backward ? I(mb, c) : B(mb, c)});
      }
      mb = rs.next_f[c];
      if (mb < M && (ignore_cap || rs.held + 1 <= cap_of(r) + kEps)) {
        double t = kInf;
        if (st == 0) {
          t = 0;
        } else if (fend[at(st - 1, mb)] >= 0) {
          const int src = s.rank_of_stage(st - 1);
          if (src == r) t = fend[at(st - 1, mb)];
          else if (head_is(src, r, key(false, st, mb))) t = fend[at(st - 1, mb)] + o.comm;
        }
        // The later stage first (it brings a micro-batch nearer its loss), then the older.
        if (t < kInf) cands.push_back({t, 2, static_cast<long long>(S - 1 - st) * M + mb, F(mb, c)});
      }
    }
    if (!rs.pending_w.empty())
      cands.push_back({rs.clock, w_first ? 1 : 3, 0, W(rs.pending_w.front().first, rs.pending_w.front().second)});
    Choice ch;
    if (cands.empty()) return ch;
    double t = kInf;
    for (const Cand& x : cands) t = std::min(t, std::max(x.t, rs.clock));
    const Cand* pick = nullptr;
    for (const Cand& x : cands)
      if (std::max(x.t, rs.clock) <= t + kEps &&
          (!pick || x.cls < pick->cls || (x.cls == pick->cls && x.tie < pick->tie)))
        pick = &x;
    ch.t = t;
    ch.a = pick->a;
    return ch;
  };

  long long remaining = static_cast<long long>(P) * V * M * (o.split_backward ? 3 : 2);
  std::vector<Choice> cached(P);
  std::vector<char> dirty(P, 1);
  while (remaining > 0) {
    int r_best = -1;
    for (int r = 0; r < P; ++r) {
      if (dirty[r]) {
        cached[r] = choose(r, false);
        dirty[r] = 0;
      }
      if (cached[r].t < kInf && (r_best < 0 || cached[r].t < cached[r_best].t)) r_best = r;
    }
    if (r_best < 0) {
      // Every rank is stopped by its memory cap: the earliest free rank runs its forward anyway.
      for (int r = 0; r < P; ++r) {
        Choice c = choose(r, true);
        if (c.t < kInf && (r_best < 0 || c.t < cached[r_best].t)) {
          r_best = r;
          cached[r] = c;
        }
      }
      TRIPOD_CHECK(r_best >= 0, "list schedule stuck with {} actions left", remaining);
    }
    const int r = r_best;
    RankState& rs = ranks[r];
    const Action a = cached[r].a;
    const int st = s.stage(r, a.chunk);
    const double start = cached[r].t;
    dirty[r] = 1;
    auto send = [&](int to_stage, bool grad) {
      const int to = s.rank_of_stage(to_stage);
      if (to == r) return;
      queues[{r, to}].push_back(key(grad, to_stage, a.mb));
      dirty[to] = 1;
    };
    auto consume = [&](int from_stage, bool grad) {
      const int from = s.rank_of_stage(from_stage);
      if (from == r) return;
      auto& q = queues[{from, r}];
      TRIPOD_CHECK(!q.empty() && q.front() == key(grad, st, a.mb), "list schedule: message order");
      q.pop_front();
    };
    switch (a.kind) {
      case ActionKind::Forward:
        if (st > 0) consume(st - 1, false);
        rs.clock = start + f_time(st);
        fend[at(st, a.mb)] = rs.clock;
        rs.held += 1;
        ++rs.next_f[a.chunk];
        if (st + 1 < S) {
          send(st + 1, false);
          if (s.rank_of_stage(st + 1) == r) dirty[r] = 1;
        }
        break;
      case ActionKind::Input:
      case ActionKind::Backward:
        if (st + 1 < S) consume(st + 1, true);
        rs.clock = start + (a.kind == ActionKind::Backward ? b_time(st) : b_time(st) - w_time(st));
        gend[at(st, a.mb)] = rs.clock;
        ++rs.next_b[a.chunk];
        if (a.kind == ActionKind::Backward) {
          rs.held -= 1;
        } else {
          rs.held -= 1 - o.weight_memory;
          rs.pending_w.emplace_back(a.mb, a.chunk);
        }
        if (st > 0) send(st - 1, true);
        break;
      case ActionKind::Weight:
        rs.clock = start + w_time(st);
        rs.held -= o.weight_memory;
        rs.pending_w.pop_front();
        break;
    }
    rs.list.push_back(a);
    --remaining;
  }
  for (auto& r : ranks) s.ranks.push_back(std::move(r.list));
  return s;
}

namespace {

void check_zb_numbers(const char* kind, int pp, int microbatches) {
  TRIPOD_INPUT_CHECK(pp >= 1, "pp = {}: the pipeline needs at least 1 stage", pp);
  TRIPOD_INPUT_CHECK(microbatches >= 1, "microbatches = {}: a step needs at least 1 micro-batch", microbatches);
  TRIPOD_INPUT_CHECK(static_cast<long long>(pp) * 2 * microbatches <= kMaxSchedulePairs,
                     "{}: pp = {} x microbatches = {} is too large (at most {} micro-batch/stage pairs)", kind, pp,
                     microbatches, kMaxSchedulePairs);
}

ListScheduleOptions unit_options(int pp, int vp, Placement placement, int microbatches, double cap) {
  ListScheduleOptions o;
  o.pp = pp;
  o.vp = vp;
  o.microbatches = microbatches;
  o.placement = placement;
  o.cap.assign(pp, cap);
  o.weight_memory = 1;  // the named schedules count a held micro-batch as a whole until its W
  const int S = pp * vp;
  o.costs.forward.assign(S, 1);
  o.costs.backward.assign(S, 2);
  o.costs.weight.assign(S, 1);
  return o;
}

}  // namespace

Schedule fifo_order(Schedule s) {
  const int P = s.pp, S = s.num_stages(), M = s.microbatches;
  // Runs the lists in order, without times. When a rank's next action waits for a message that
  // has been sent but is not the first unconsumed one from that peer, the action consuming the
  // first one moves up to just before it (its own dependencies are met: they come earlier in the
  // list, or validation would refuse the schedule anyway).
  auto key = [&](bool grad, int st, int mb) { return (static_cast<long long>(grad) * S + st) * M + mb; };
  std::map<std::pair<int, int>, std::deque<long long>> queues;
  std::vector<size_t> pos(P, 0);
  // The message action `a` on rank r consumes: (source rank, key), or source -1.
  auto input = [&](int r, const Action& a) -> std::pair<int, long long> {
    const int st = s.stage(r, a.chunk);
    if (a.forward() && st > 0 && s.rank_of_stage(st - 1) != r) return {s.rank_of_stage(st - 1), key(false, st, a.mb)};
    if (a.input_grad() && st + 1 < S && s.rank_of_stage(st + 1) != r)
      return {s.rank_of_stage(st + 1), key(true, st, a.mb)};
    return {-1, 0};
  };
  bool progress = true;
  while (progress) {
    progress = false;
    for (int r = 0; r < P; ++r) {
      auto& list = s.ranks[r];
      while (pos[r] < list.size()) {
        auto [src, k] = input(r, list[pos[r]]);
        if (src >= 0) {
          auto& q = queues[{src, r}];
          auto it = std::find(q.begin(), q.end(), k);
          if (it == q.end()) break;  // not sent yet
          if (it != q.begin()) {
            const long long head = q.front();
            size_t j = pos[r] + 1;
            while (j < list.size() && !(input(r, list[j]).first == src && input(r, list[j]).second == head)) ++j;
            if (j == list.size()) break;  // malformed: validation names it
            std::rotate(list.begin() + static_cast<std::ptrdiff_t>(pos[r]), list.begin() + static_cast<std::ptrdiff_t>(j),
                        list.begin() + static_cast<std::ptrdiff_t>(j) + 1);
            continue;
          }
          q.pop_front();
        }
        const Action& a = list[pos[r]];
        const int st = s.stage(r, a.chunk);
        if (a.forward() && st + 1 < S && s.rank_of_stage(st + 1) != r)
          queues[{r, s.rank_of_stage(st + 1)}].push_back(key(false, st + 1, a.mb));
        if (a.input_grad() && st > 0 && s.rank_of_stage(st - 1) != r)
          queues[{r, s.rank_of_stage(st - 1)}].push_back(key(true, st - 1, a.mb));
        ++pos[r];
        progress = true;
      }
    }
  }
  return s;
}

// ZB-H1, rank r: 1F1B's warm-up of w = pp-r-1 forwards, then F(w+i) and I(i) in turn, the W of
// each I deferred by d = min(r, m-w-1) slots (a rank defers r W's: with its w+1 in-flight
// micro-batches it then holds pp at most, 1F1B's peak on rank 0); in the ramp-down each I is
// followed by the oldest pending W, and the W's left close the list. The deferred W's fill the
// ramp-down, where 1F1B idles.
std::vector<Action> zb_h1_actions(int pp, int m, int r) {
  const int w = std::min(pp - r - 1, m);
  const int d = std::max(0, std::min(r, m - w - 1));
  std::vector<Action> out;
  std::deque<int> pending;
  for (int i = 0; i < w; ++i) out.push_back(F(i));
  for (int i = 0; i + w < m; ++i) {
    out.push_back(F(w + i));
    out.push_back(I(i));
    pending.push_back(i);
    if (static_cast<int>(pending.size()) > d) {
      out.push_back(W(pending.front()));
      pending.pop_front();
    }
  }
  for (int i = std::max(0, m - w); i < m; ++i) {
    out.push_back(I(i));
    pending.push_back(i);
    out.push_back(W(pending.front()));
    pending.pop_front();
  }
  for (int mb : pending) out.push_back(W(mb));
  return out;
}

Schedule zb_h1_schedule(int pp, int microbatches) {
  check_zb_numbers("zb-h1", pp, microbatches);
  Schedule s;
  s.kind = ScheduleKind::ZbH1;
  s.pp = pp;
  s.microbatches = microbatches;
  for (int r = 0; r < pp; ++r) s.ranks.push_back(zb_h1_actions(pp, microbatches, r));
  return s;
}

// ZB-H2: the list scheduler for unit costs with up to 2pp-1 micro-batches held: enough warm-up
// forwards that no rank waits for a gradient once its first one has arrived.
Schedule zb_h2_schedule(int pp, int microbatches) {
  check_zb_numbers("zb-h2", pp, microbatches);
  return list_schedule(unit_options(pp, 1, Placement::Loop, microbatches, 2 * pp - 1), ScheduleKind::ZbH2);
}

// ZB-V, rank r (chunk 0 = stage r, chunk 1 = stage 2pp-1-r), built for n = max(m, 2pp-1)
// micro-batches and then cut to the m there are:
//  - 2(pp-r)-1 forwards of chunk 0; r pairs (forward chunk 1, forward chunk 0); pp-r times
//    (forward, I, W of chunk 1): the V's first micro-batches go down and back up;
//  - steady state: (forward chunk 0 while any are left, I and W chunk 0, forward, I and W chunk 1)
//    until every forward has run;
//  - ramp-down: r pairs (I chunk 0, I chunk 1), then pp-r times (I chunk 0, the oldest pending W
//    of chunk 0), then the pending W's of chunk 1, then of chunk 0.
// At most 2pp chunk activations (pp stages', 1F1B's peak) on any rank.
std::vector<Action> zbv_actions(int pp, int m, int r) {
  const int n = std::max(m, 2 * pp - 1);
  std::vector<Action> out;
  int f0 = 0, f1 = 0, b0 = 0, b1 = 0;
  for (int i = 0; i < 2 * (pp - r) - 1; ++i) out.push_back(F(f0++, 0));
  for (int i = 0; i < r; ++i) {
    out.push_back(F(f1++, 1));
    out.push_back(F(f0++, 0));
  }
  for (int i = 0; i < pp - r; ++i) {
    out.push_back(F(f1++, 1));
    out.push_back(I(b1, 1));
    out.push_back(W(b1++, 1));
  }
  while (f1 < f0 || f0 < n) {
    if (f0 < n) out.push_back(F(f0++, 0));
    out.push_back(I(b0, 0));
    out.push_back(W(b0++, 0));
    out.push_back(F(f1++, 1));
    out.push_back(I(b1, 1));
    out.push_back(W(b1++, 1));
  }
  int w0 = b0, w1 = b1;
  for (int i = 0; i < r; ++i) {
    out.push_back(I(b0++, 0));
    out.push_back(I(b1++, 1));
  }
  for (int i = 0; i < pp - r; ++i) {
    out.push_back(I(b0++, 0));
    out.push_back(W(w0++, 0));
  }
  while (w1 < b1) out.push_back(W(w1++, 1));
  while (w0 < b0) out.push_back(W(w0++, 0));
  std::erase_if(out, [&](const Action& a) { return a.mb >= m; });
  return out;
}

Schedule zbv_schedule(int pp, int microbatches, bool eager) {
  check_zb_numbers("zbv", pp, microbatches);
  Schedule s;
  s.kind = ScheduleKind::Zbv;
  s.pp = pp;
  s.vp = 2;
  s.microbatches = microbatches;
  s.placement = Placement::V;
  for (int r = 0; r < pp; ++r) s.ranks.push_back(zbv_actions(pp, microbatches, r));
  return eager ? fifo_order(std::move(s)) : s;
}

// DualPipeV. Chunk 0 is stage r, chunk 1 stage 2pp-1-r. Phases of rank r (counts per phase):
//  1. 2(pp-r-1) forwards of chunk 0;
//  2. r+1 pairs: forward chunk 0, forward chunk 1;
//  3. pp-r-1 times: I chunk 1, its W, forward chunk 1;
//  4. m-2pp+r+1 times: forward chunk 0, B chunk 1, forward chunk 1, B chunk 0 (DualPipe overlaps
//     each forward with the backward after it; here they run one after the other);
//  5. pp-r-1 times: B chunk 1, forward chunk 1, B chunk 0;
//  6. r+1 times: backward chunk 1, backward chunk 0, from about half-way split into I (their W
//     wait): on odd ranks from the chunk-1 backward of the middle pair, on even ranks from its
//     chunk-0 backward;
//  7. pp-r-1 times: a pending W, then the backward of chunk 0 (I once split);
//  8. the pending W's.
// Each chunk's forwards and backwards go in micro-batch order.
std::vector<Action> dualpipev_actions(int pp, int m, int r) {
  std::vector<Action> out;
  int next_f[2] = {0, 0}, next_b[2] = {0, 0};
  std::deque<std::pair<int, int>> pending;
  auto fwd = [&](int c) { out.push_back(F(next_f[c]++, c)); };
  auto bwd = [&](int c, bool split) {
    const int mb = next_b[c]++;
    if (split) {
      out.push_back(I(mb, c));
      pending.emplace_back(mb, c);
    } else {
      out.push_back(B(mb, c));
    }
  };
  auto weight = [&] {
    if (pending.empty()) return;
    out.push_back(W(pending.front().first, pending.front().second));
    pending.pop_front();
  };
  for (int i = 0; i < 2 * (pp - r - 1); ++i) fwd(0);
  for (int i = 0; i < r + 1; ++i) {
    fwd(0);
    fwd(1);
  }
  for (int i = 0; i < pp - r - 1; ++i) {
    bwd(1, true);
    weight();
    fwd(1);
  }
  for (int i = 0; i < m - 2 * pp + r + 1; ++i) {
    fwd(0);
    bwd(1, false);
    fwd(1);
    bwd(0, false);
  }
  for (int i = 0; i < pp - r - 1; ++i) {
    bwd(1, false);
    fwd(1);
    bwd(0, false);
  }
  bool split = false;
  const int n6 = r + 1;
  for (int i = 0; i < n6; ++i) {
    if (i == n6 / 2 && r % 2 == 1) split = true;
    bwd(1, split);
    if (i == n6 / 2 && r % 2 == 0) split = true;
    bwd(0, split);
  }
  for (int i = 0; i < pp - r - 1; ++i) {
    weight();
    bwd(0, split);
  }
  while (!pending.empty()) weight();
  return out;
}

Schedule dualpipev_schedule(int pp, int microbatches) {
  check_zb_numbers("dualpipev", pp, microbatches);
  TRIPOD_CHECK(microbatches >= 2 * pp, "dualpipev with m = {} < 2pp (check_schedule_kind refuses it)", microbatches);
  Schedule s;
  s.kind = ScheduleKind::DualPipeV;
  s.pp = pp;
  s.vp = 2;
  s.microbatches = microbatches;
  s.placement = Placement::V;
  for (int r = 0; r < pp; ++r) s.ranks.push_back(dualpipev_actions(pp, microbatches, r));
  return s;
}

AutoSchedule auto_schedule(int pp, int vp, Placement placement, int m, const StageCosts& costs, double comm,
                           double cap, double weight_memory) {
  TRIPOD_INPUT_CHECK(pp >= 1 && vp >= 1 && m >= 1,
                     "auto schedule: pp = {}, vp = {}, microbatches = {}: each must be at least 1", pp, vp, m);
  check_placement(placement, vp);
  TRIPOD_INPUT_CHECK(static_cast<long long>(pp) * vp * m <= kMaxSchedulePairs,
                     "auto schedule: pp = {} x vp = {} x microbatches = {} is too large (at most {} pairs)", pp, vp,
                     m, kMaxSchedulePairs);
  TRIPOD_INPUT_CHECK(std::isfinite(comm) && comm >= 0, "auto schedule: communication time {} must be finite and >= 0",
                     comm);
  TRIPOD_INPUT_CHECK(std::isfinite(cap), "auto schedule: memory cap {} is not finite", cap);
  const int S = pp * vp;
  StageCosts c = costs;
  if (c.forward.empty()) c.forward.assign(S, 1);
  if (c.backward.empty()) c.backward.assign(S, 2);
  if (c.weight.empty()) {
    c.weight.resize(S);
    for (int i = 0; i < S; ++i) c.weight[i] = c.backward[i] / 2;
  }
  if (cap <= 0) cap = static_cast<double>(pp) * vp;
  PipeCosts pc;
  pc.comm = comm;
  pc.weight_memory = weight_memory;

  AutoSchedule out;
  double best = kInf;
  auto consider = [&](const std::string& name, Schedule sched) {
    Simulation sim = simulate(sched, plan_pipeline(sched), pc, c);
    AutoCandidate cand{name, sim.makespan, sim.peak_memory, sim.peak_memory <= cap + kEps};
    out.candidates.push_back(cand);
    if (cand.fits && sim.makespan < best - kEps) {
      best = sim.makespan;
      out.chosen = name;
      out.schedule = std::move(sched);
    }
  };
  // The fixed schedules these numbers allow.
  if (placement == Placement::Loop && vp == 1) {
    for (ScheduleKind k : {ScheduleKind::GPipe, ScheduleKind::OneFOneB})
      consider(std::string(enum_name(k)), build_schedule(k, pp, 1, m));
    consider("zb-h1", zb_h1_schedule(pp, m));
    consider("zb-h2", zb_h2_schedule(pp, m));
  }
  if (placement == Placement::Loop && vp > 1 && m % pp == 0) consider("interleaved", build_schedule(ScheduleKind::Interleaved, pp, vp, m));
  if (placement == Placement::V) {
    consider("zbv", zbv_schedule(pp, m));
    consider("zbv eager", zbv_schedule(pp, m, /*eager=*/true));
    if (m >= 2 * pp) consider("dualpipev", dualpipev_schedule(pp, m));
  }
  // List schedules for these costs, for caps from 1F1B's memory up to the cap.
  std::vector<double> caps;
  const double base = static_cast<double>(pp) * vp;
  for (double k = base; k < cap - kEps; k += std::max(1.0, std::floor(base / 2))) caps.push_back(k);
  caps.push_back(cap);
  for (double k : caps)
    for (bool split : {true, false})
      for (int pend : {-1, pp}) {
        if (!split && pend >= 0) continue;
        ListScheduleOptions o;
        o.pp = pp;
        o.vp = vp;
        o.microbatches = m;
        o.placement = placement;
        o.split_backward = split;
        o.cap.assign(pp, k);
        o.weight_memory = weight_memory;
        o.costs = c;
        o.comm = comm;
        o.max_pending_w = pend;
        consider(fmt::format("list cap={:g}{}{}", k, split ? "" : " B", pend >= 0 ? fmt::format(" w<={}", pend) : ""),
                 list_schedule(o, ScheduleKind::Auto));
      }
  if (best == kInf) {
    double least = kInf;
    for (const auto& cand : out.candidates) least = std::min(least, cand.peak_memory);
    throw InputError(fmt::format("auto schedule: no schedule holds at most {:g} chunk activations per rank (the least "
                                 "any candidate holds is {:g}); raise the memory cap",
                                 cap, least));
  }
  out.schedule.kind = ScheduleKind::Auto;
  return out;
}

}  // namespace tripod
