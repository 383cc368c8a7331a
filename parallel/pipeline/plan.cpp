// Schedule validation and the per-rank plan of point-to-point operations; see plan.h for the
// communication rules.
#include "parallel/pipeline/plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/error.h"
#include "parallel/pipeline/plan_run.h"
#include "parallel/pipeline/schedules.h"

namespace tripod {

namespace {

// Position of each (kind, chunk, micro-batch) in one rank's list, -1 where absent.
struct PositionTable {
  int vp = 1, m = 1;
  std::vector<int> pos;
  PositionTable(int vp_, int m_) : vp(vp_), m(m_), pos(kActionKinds * static_cast<size_t>(vp_) * m_, -1) {}
  size_t key(const Action& a) const { return (static_cast<size_t>(a.kind) * vp + a.chunk) * m + a.mb; }
  int& at(const Action& a) { return pos[key(a)]; }
  int get(const Action& a) const { return pos[key(a)]; }
  // The action computing the input gradient of (mb, chunk) on this rank: its B, else its I.
  Action input_grad(int mb, int chunk) const { return get(B(mb, chunk)) >= 0 ? B(mb, chunk) : I(mb, chunk); }
};

const char* payload(bool grad) { return grad ? "gradient" : "activation"; }

// Checks each rank's list on its own: ranges, duplicates, the dependencies whose two ends are on
// this rank (in list order, so the first broken one is named), and missing actions. Returns the
// position tables.
std::vector<PositionTable> check_lists(const Schedule& s) {
  TRIPOD_INPUT_CHECK(s.pp >= 1 && s.vp >= 1 && s.microbatches >= 1,
                     "schedule: pp = {}, vp = {}, microbatches = {}: each must be at least 1", s.pp, s.vp,
                     s.microbatches);
  TRIPOD_INPUT_CHECK(static_cast<int>(s.ranks.size()) == s.pp, "schedule: {} rank lists for pp = {}",
                     s.ranks.size(), s.pp);
  TRIPOD_INPUT_CHECK(static_cast<long long>(s.pp) * s.vp * s.microbatches <= kMaxSchedulePairs,
                     "schedule: pp = {} x vp = {} x microbatches = {} is too large (at most {} pairs)", s.pp, s.vp,
                     s.microbatches, kMaxSchedulePairs);
  TRIPOD_INPUT_CHECK(s.placement != Placement::V || s.vp == 2,
                     "{}placement v puts exactly 2 model chunks on each pipeline rank, but the schedule has vp = {}",
                     s.source.empty() ? "" : s.source + ": ", s.vp);
  std::vector<PositionTable> tables;
  for (int r = 0; r < s.pp; ++r) {
    PositionTable t(s.vp, s.microbatches);
    const auto& list = s.ranks[r];
    for (int i = 0; i < static_cast<int>(list.size()); ++i) {
      const Action& a = list[i];
      TRIPOD_INPUT_CHECK(a.mb < s.microbatches, "{}: {}: micro-batch {} is out of range (microbatches = {})",
                         s.where(r), a.str(), a.mb, s.microbatches);
      TRIPOD_INPUT_CHECK(a.chunk < s.vp, "{}: {}: chunk {} is out of range (vp = {} chunks per rank)", s.where(r),
                         a.str(), a.chunk, s.vp);
      TRIPOD_INPUT_CHECK(!s.forward_only || a.forward(), "{}: {} in a forward-only schedule (it runs forwards only)",
                         s.where(r), a.str());
      TRIPOD_INPUT_CHECK(t.at(a) < 0, "{}: {} appears twice (positions {} and {})", s.where(r), a.str(),
                         t.at(a) + 1, i + 1);
      t.at(a) = i;
    }
    tables.push_back(std::move(t));
  }
  // Dependencies within one rank, in list order.
  const int S = s.num_stages();
  for (int r = 0; r < s.pp; ++r) {
    const auto& list = s.ranks[r];
    const auto& t = tables[r];
    // `a` at position i needs `need` earlier on this rank; `why` explains, "" for nothing.
    auto require = [&](int i, const Action& a, const Action& need, const std::string& why) {
      const int at = t.get(need);
      TRIPOD_INPUT_CHECK(at >= 0, "{}: {} without {}{}", s.where(r), a.str(), need.str(), why);
      TRIPOD_INPUT_CHECK(at < i, "{}: {} before {}{}", s.where(r), a.str(), need.str(), why);
    };
    for (int i = 0; i < static_cast<int>(list.size()); ++i) {
      const Action& a = list[i];
      const int st = s.stage(r, a.chunk);
      if (a.forward()) {
        if (st > 0 && s.rank_of_stage(st - 1) == r) {
          // A missing F of the previous stage is named by the completeness check below.
          Action need = F(a.mb, s.chunk_of_stage(st - 1));
          if (t.get(need) >= 0)
            require(i, a, need, fmt::format(" (virtual stage {} takes the output of stage {})", st, st - 1));
        }
      } else if (a.input_grad()) {
        require(i, a, F(a.mb, a.chunk), "");
        if (st + 1 < S && s.rank_of_stage(st + 1) == r) {
          Action need = t.input_grad(a.mb, s.chunk_of_stage(st + 1));
          if (t.get(need) >= 0)
            require(i, a, need, fmt::format(" (virtual stage {} needs the gradient from stage {})", st, st + 1));
        }
      } else {  // W
        TRIPOD_INPUT_CHECK(t.get(B(a.mb, a.chunk)) < 0,
                           "{}: {} and {}: the backward of a micro-batch is one B, or an I and then a W, not both",
                           s.where(r), B(a.mb, a.chunk).str(), a.str());
        require(i, a, I(a.mb, a.chunk), " (W computes the weight gradients from what I keeps)");
      }
    }
  }
  // Every (micro-batch, chunk): one F, and one B or one I and one W.
  for (int r = 0; r < s.pp; ++r) {
    const auto& t = tables[r];
    for (int c = 0; c < s.vp; ++c)
      for (int mb = 0; mb < s.microbatches; ++mb) {
        TRIPOD_INPUT_CHECK(t.get(F(mb, c)) >= 0,
                           "{}: {} is missing (every rank runs F and B, or F, I and W, of each of the {} micro-batches "
                           "on each of its {} chunks)",
                           s.where(r), F(mb, c).str(), s.microbatches, s.vp);
        if (s.forward_only) continue;
        const bool b = t.get(B(mb, c)) >= 0, i = t.get(I(mb, c)) >= 0, w = t.get(W(mb, c)) >= 0;
        TRIPOD_INPUT_CHECK(!(b && i), "{}: {} and {}: the backward of a micro-batch is one B, or an I and then a W, "
                           "not both", s.where(r), B(mb, c).str(), I(mb, c).str());
        TRIPOD_INPUT_CHECK(b || i,
                           "{}: {} is missing (every rank runs F and B, or F, I and W, of each of the {} micro-batches "
                           "on each of its {} chunks)",
                           s.where(r), B(mb, c).str(), s.microbatches, s.vp);
        TRIPOD_INPUT_CHECK(!i || w, "{}: {} is missing ({} runs, and its weight gradients are computed only by a W)",
                           s.where(r), W(mb, c).str(), I(mb, c).str());
      }
  }
  return tables;
}

// The messages between ranks, and each action's incoming / outgoing message.
void add_messages(const Schedule& s, const std::vector<PositionTable>& tables, PipePlan& plan) {
  const int S = s.num_stages();
  plan.recv_msg.assign(s.pp, {});
  plan.send_msg.assign(s.pp, {});
  plan.last_backward.assign(s.pp, std::vector<int>(s.vp, -1));
  for (int r = 0; r < s.pp; ++r) {
    plan.recv_msg[r].assign(s.ranks[r].size(), -1);
    plan.send_msg[r].assign(s.ranks[r].size(), -1);
  }
  for (int r = 0; r < s.pp; ++r) {
    const auto& list = s.ranks[r];
    for (int i = 0; i < static_cast<int>(list.size()); ++i) {
      const Action& a = list[i];
      const int st = s.stage(r, a.chunk);
      if (a.weight_grad()) plan.last_backward[r][a.chunk] = i;
      if (a.kind == ActionKind::Weight) continue;  // W sends nothing
      const int to_stage = a.forward() ? st + 1 : st - 1;
      if (to_stage < 0 || to_stage >= S) continue;
      const int to_rank = s.rank_of_stage(to_stage);
      if (to_rank == r) continue;  // handed over in memory
      const int to_chunk = s.chunk_of_stage(to_stage);
      PipeMessage msg;
      msg.src_rank = r;
      msg.dst_rank = to_rank;
      msg.src_index = i;
      msg.src = a;
      msg.dst = a.forward() ? F(a.mb, to_chunk) : tables[to_rank].input_grad(a.mb, to_chunk);
      msg.dst_index = tables[to_rank].get(msg.dst);
      msg.grad = !a.forward();
      // MPI guarantees tags up to 32767; receives are posted in sending order (add_ops), so a
      // repeated tag still matches.
      msg.tag = static_cast<int>(((static_cast<long long>(a.mb) * S + to_stage) * 2 + (msg.grad ? 1 : 0)) % 32768);
      const int id = static_cast<int>(plan.messages.size());
      plan.messages.push_back(msg);
      plan.send_msg[r][i] = id;
      plan.recv_msg[to_rank][msg.dst_index] = id;
    }
  }
}

// The plan before send waits are placed: every send is waited on after the last action. The
// receive of action i is posted when action i-1 starts; before it, every message its sender sent
// earlier to this rank that is not yet posted (consumed later): receives from one peer are posted
// in that peer's sending order, so that they match as the sends were posted, whatever order the
// rank consumes them in.
void add_ops(const Schedule& s, PipePlan& plan) {
  plan.ranks.assign(s.pp, {});
  // Per receiver and sender, the messages between them in sending order; each message's place there.
  std::vector<std::unordered_map<int, std::vector<int>>> from(s.pp);
  std::vector<int> place(plan.messages.size(), -1);
  for (int q = 0; q < s.pp; ++q)
    for (int id : plan.send_msg[q])
      if (id >= 0) {
        auto& list = from[plan.messages[id].dst_rank][q];
        place[id] = static_cast<int>(list.size());
        list.push_back(id);
      }
  for (int r = 0; r < s.pp; ++r) {
    std::unordered_map<int, int> next;  // per sender: the first message not yet posted
    auto& ops = plan.ranks[r];
    auto post = [&](int id) {
      if (id < 0) return;
      const int q = plan.messages[id].src_rank;
      int& k = next[q];
      for (; k <= place[id]; ++k) ops.push_back({PlanOpKind::PostRecv, from[r][q][k]});
    };
    const int n = static_cast<int>(s.ranks[r].size());
    if (n > 0) post(plan.recv_msg[r][0]);
    for (int i = 0; i < n; ++i) {
      if (plan.recv_msg[r][i] >= 0) ops.push_back({PlanOpKind::WaitRecv, plan.recv_msg[r][i]});
      if (i + 1 < n) post(plan.recv_msg[r][i + 1]);
      ops.push_back({PlanOpKind::Compute, i});
      if (plan.send_msg[r][i] >= 0) ops.push_back({PlanOpKind::PostSend, plan.send_msg[r][i]});
    }
    for (int i = 0; i < n; ++i)
      if (plan.send_msg[r][i] >= 0) ops.push_back({PlanOpKind::WaitSend, plan.send_msg[r][i]});
  }
}

// Names the cycle of ranks waiting on each other when the run could not finish.
[[noreturn]] void report_deadlock(const Schedule& s, const PipePlan& plan, const PlanRun& run) {
  auto stuck_recv = [&](int r) -> int {
    if (run.pc[r] >= plan.ranks[r].size()) return -1;
    const PlanOp& op = plan.ranks[r][run.pc[r]];
    return op.kind == PlanOpKind::WaitRecv ? op.index : -1;
  };
  int start = -1;
  for (int r = 0; r < s.pp && start < 0; ++r)
    if (stuck_recv(r) >= 0) start = r;
  TRIPOD_CHECK(start >= 0, "pipeline plan stuck with no rank waiting for a message");
  // Follow "waits for a message from" until a rank repeats: that rank starts the cycle.
  std::vector<int> seen(s.pp, 0);
  int r = start;
  while (!seen[r]) {
    seen[r] = 1;
    int x = stuck_recv(r);
    TRIPOD_CHECK(x >= 0, "pipeline plan: rank {} is stuck but not in a receive", r);
    r = plan.messages[x].src_rank;
  }
  std::string cycle;
  const int first = r;
  do {
    const PipeMessage& msg = plan.messages[stuck_recv(r)];
    // What the producer is itself stuck at: the action after its position in the plan.
    const PipeMessage& next = plan.messages[stuck_recv(msg.src_rank)];
    cycle += fmt::format("{}{} waits before {} for the {} of {} from rank {}, which rank {} runs after {}",
                         cycle.empty() ? "" : "; ", s.where(r), msg.dst.str(), payload(msg.grad), msg.src.str(),
                         msg.src_rank, msg.src_rank, next.dst.str());
    r = msg.src_rank;
  } while (r != first);
  throw InputError(fmt::format("schedule deadlocks: {}", cycle));
}

}  // namespace

PipePlan plan_pipeline(const Schedule& s) {
  auto tables = check_lists(s);
  PipePlan plan;
  add_messages(s, tables, plan);
  add_ops(s, plan);
  PlanRun run = run_plan(s, plan, PipeCosts{}, /*find_releases=*/true);
  if (!run.finished) report_deadlock(s, plan, run);
  // Move each send wait up to just after the receive wait that proves it was consumed.
  for (int r = 0; r < s.pp; ++r) {
    const auto& old = plan.ranks[r];
    const auto& rel = run.releases[r];
    std::vector<char> moved(plan.messages.size(), 0);
    for (const auto& [pos, id] : rel) moved[id] = 1;
    std::vector<PlanOp> ops;
    ops.reserve(old.size());
    size_t k = 0;
    for (size_t i = 0; i < old.size(); ++i) {
      if (old[i].kind == PlanOpKind::WaitSend && moved[old[i].index]) continue;
      ops.push_back(old[i]);
      for (; k < rel.size() && rel[k].first == i; ++k) ops.push_back({PlanOpKind::WaitSend, rel[k].second});
    }
    plan.ranks[r] = std::move(ops);
  }
  return plan;
}

int plan_peak_buffers(const PipePlan& plan, const Schedule& s, int rank) {
  // Buffers: +1 per posted receive, -1 when its action consumes it; a forward handing over in
  // memory holds its output until the next chunk's forward; a backward likewise; a sent result
  // is held until its send wait.
  const int S = s.num_stages();
  int held = 0, peak = 0;
  for (const PlanOp& op : plan.ranks[rank]) {
    switch (op.kind) {
      case PlanOpKind::PostRecv: ++held; break;
      case PlanOpKind::WaitSend: --held; break;
      case PlanOpKind::Compute: {
        const Action& a = s.ranks[rank][op.index];
        const int st = s.stage(rank, a.chunk);
        // Consumes its input (received or handed over), if it has one.
        if (a.kind == ActionKind::Weight) break;  // W neither takes nor gives a pipeline tensor
        const bool has_input = a.forward() ? st > 0 : st + 1 < S;
        if (has_input) --held;
        const bool has_output = a.forward() ? st + 1 < S : st > 0;
        if (has_output) ++held;  // handed over in memory, or sent and held until its wait
        break;
      }
      case PlanOpKind::WaitRecv:
      case PlanOpKind::PostSend: break;
    }
    peak = std::max(peak, held);
  }
  TRIPOD_CHECK(held == 0, "plan of rank {} leaves {} buffers held", rank, held);
  return peak;
}

}  // namespace tripod
