// The timeline simulation of a pipeline plan; see plan.h for the communication rules modelled.
#include "parallel/pipeline/simulate.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <unordered_map>
#include <utility>

#include "core/error.h"
#include "parallel/pipeline/plan_run.h"
#include "parallel/pipeline/schedules.h"

namespace tripod {

namespace {
constexpr double kUnset = -1;
}  // namespace

StageCosts stage_costs_fiw(const std::vector<double>& f, const std::vector<double>& i, const std::vector<double>& w,
                           int num_stages) {
  StageCosts out;
  auto expand = [&](const std::vector<double>& v, const char* what) {
    TRIPOD_INPUT_CHECK(v.size() == 1 || static_cast<int>(v.size()) == num_stages,
                       "costs: {} {} times for {} virtual stages (give 1, or one per stage)", v.size(), what,
                       num_stages);
    for (double t : v)
      TRIPOD_INPUT_CHECK(t >= 0 && std::isfinite(t), "costs: {} time {} must be finite and >= 0", what, t);
    return v.size() == 1 ? std::vector<double>(num_stages, v[0]) : v;
  };
  out.forward = expand(f, "forward");
  std::vector<double> ii = expand(i, "input-gradient (I)");
  out.weight = expand(w, "weight-gradient (W)");
  out.backward.resize(num_stages);
  for (int s = 0; s < num_stages; ++s) out.backward[s] = ii[s] + out.weight[s];
  return out;
}

double action_time(const PipeCosts& costs, const StageCosts& stages, const Action& a, int stage) {
  if (a.forward()) return stages.forward.empty() ? costs.forward : stages.forward[stage];
  const double b = stages.backward.empty() ? costs.backward : stages.backward[stage];
  double w;
  if (!stages.weight.empty()) w = stages.weight[stage];
  else if (costs.weight >= 0 && !stages.backward.empty() && costs.backward > 0) w = b * costs.weight / costs.backward;
  else if (costs.weight >= 0 && stages.backward.empty()) w = costs.weight;
  else w = b / 2;
  switch (a.kind) {
    case ActionKind::Backward: return b;
    case ActionKind::Input: return b - w;
    case ActionKind::Weight: return w;
    case ActionKind::Forward: break;
  }
  return 0;
}

PlanRun run_plan(const Schedule& s, const PipePlan& plan, const PipeCosts& costs, bool find_releases,
                 const StageCosts& stages) {
  const int P = s.pp;
  const size_t M = plan.messages.size();
  PlanRun run;
  run.pc.assign(P, 0);
  run.start.resize(P);
  run.end.resize(P);
  run.releases.resize(P);
  for (int r = 0; r < P; ++r) {
    run.start[r].assign(s.ranks[r].size(), 0);
    run.end[r].assign(s.ranks[r].size(), 0);
  }
  std::vector<double> now(P, 0), sent(M, kUnset), posted(M, kUnset);
  std::vector<int> waiter(M, -1);  // the rank blocked on this message, if any
  // Direct knowledge: known[r][q] = the last action rank q had finished when it sent the latest
  // message rank r has received from it. pending[r][q]: r's sends to q not yet known consumed,
  // in sending order. Maps, since each rank talks to a few neighbours only.
  std::vector<std::unordered_map<int, int>> known(find_releases ? P : 0);
  std::vector<std::unordered_map<int, std::deque<int>>> pending(find_releases ? P : 0);
  auto arrival = [&](int x) { return std::max(sent[x], posted[x]) + costs.comm; };

  std::deque<int> ready;
  for (int r = 0; r < P; ++r) ready.push_back(r);
  while (!ready.empty()) {
    const int r = ready.front();
    ready.pop_front();
    const auto& ops = plan.ranks[r];
    while (run.pc[r] < ops.size()) {
      const PlanOp op = ops[run.pc[r]];
      bool blocked = false;
      switch (op.kind) {
        case PlanOpKind::PostRecv:
          posted[op.index] = now[r];
          if (waiter[op.index] >= 0) ready.push_back(std::exchange(waiter[op.index], -1));
          break;
        case PlanOpKind::WaitRecv: {
          if (sent[op.index] == kUnset) {
            waiter[op.index] = r;
            blocked = true;
            break;
          }
          now[r] = std::max(now[r], arrival(op.index));
          if (find_releases) {
            const PipeMessage& msg = plan.messages[op.index];
            const int q = msg.src_rank;
            int& k = known[r].try_emplace(q, -1).first->second;
            k = std::max(k, msg.src_index);
            auto& pend = pending[r][q];
            while (!pend.empty() && plan.messages[pend.front()].dst_index <= k) {
              run.releases[r].push_back({run.pc[r], pend.front()});
              pend.pop_front();
            }
          }
          break;
        }
        case PlanOpKind::Compute: {
          const Action& a = s.ranks[r][op.index];
          run.start[r][op.index] = now[r];
          now[r] += action_time(costs, stages, a, s.stage(r, a.chunk));
          run.end[r][op.index] = now[r];
          break;
        }
        case PlanOpKind::PostSend:
          sent[op.index] = now[r];
          if (find_releases) pending[r][plan.messages[op.index].dst_rank].push_back(op.index);
          if (waiter[op.index] >= 0) ready.push_back(std::exchange(waiter[op.index], -1));
          break;
        case PlanOpKind::WaitSend:
          if (posted[op.index] == kUnset) {
            waiter[op.index] = r;
            blocked = true;
            break;
          }
          now[r] = std::max(now[r], arrival(op.index));
          break;
      }
      if (blocked) break;
      ++run.pc[r];
    }
  }
  for (int r = 0; r < P; ++r)
    if (run.pc[r] < plan.ranks[r].size()) run.finished = false;
  return run;
}

Simulation simulate(const Schedule& s, const PipeCosts& costs) { return simulate(s, plan_pipeline(s), costs); }

Simulation simulate(const Schedule& s, const PipePlan& plan, const PipeCosts& costs) {
  return simulate(s, plan, costs, StageCosts{});
}

Simulation simulate(const Schedule& s, const PipePlan& plan, const PipeCosts& costs, const StageCosts& stages) {
  TRIPOD_INPUT_CHECK(costs.forward >= 0 && costs.backward >= 0 && costs.comm >= 0 &&
                         std::isfinite(costs.forward + costs.backward + costs.comm),
                     "costs: forward {}, backward {}, communication {} must be finite and >= 0", costs.forward,
                     costs.backward, costs.comm);
  TRIPOD_INPUT_CHECK(costs.weight < 0 || (std::isfinite(costs.weight) && costs.weight <= costs.backward),
                     "costs: weight-gradient (W) time {} must be finite and at most the backward's {}", costs.weight,
                     costs.backward);
  TRIPOD_INPUT_CHECK(costs.weight_memory >= 0 && costs.weight_memory <= 1,
                     "costs: weight_memory {} (what a micro-batch holds between I and W, per unit of what F holds) "
                     "must be within [0, 1]",
                     costs.weight_memory);
  for (const auto* v : {&stages.forward, &stages.backward, &stages.weight}) {
    TRIPOD_INPUT_CHECK(v->empty() || static_cast<int>(v->size()) == s.num_stages(),
                       "costs: {} per-stage times for {} virtual stages", v->size(), s.num_stages());
    for (double t : *v) TRIPOD_INPUT_CHECK(t >= 0 && std::isfinite(t), "costs: a stage time {} is not finite >= 0", t);
  }
  for (size_t i = 0; i < stages.weight.size(); ++i)
    TRIPOD_INPUT_CHECK(!stages.backward.empty() && stages.weight[i] <= stages.backward[i],
                       "costs: stage {}: weight-gradient (W) time {} exceeds its backward {}", i, stages.weight[i],
                       stages.backward.empty() ? 0.0 : stages.backward[i]);
  PlanRun run = run_plan(s, plan, costs, false, stages);
  TRIPOD_CHECK(run.finished, "a validated pipeline plan did not finish");
  Simulation sim;
  sim.ranks.resize(s.pp);
  for (int r = 0; r < s.pp; ++r) {
    RankSimulation& rs = sim.ranks[r];
    const auto& list = s.ranks[r];
    rs.peak_inflight_per_chunk.assign(s.vp, 0);
    std::vector<int> per_chunk(s.vp, 0);
    int inflight = 0;
    double memory = 0;
    for (size_t i = 0; i < list.size(); ++i) {
      const Action& a = list[i];
      rs.timeline.push_back({a, run.start[r][i], run.end[r][i]});
      rs.busy += run.end[r][i] - run.start[r][i];
      sim.makespan = std::max(sim.makespan, run.end[r][i]);
      // Activations are held from the start of F to the end of B or W: count F before the peak.
      const int d = a.forward() ? 1 : a.weight_grad() ? -1 : 0;
      inflight += d;
      per_chunk[a.chunk] += d;
      rs.peak_inflight = std::max(rs.peak_inflight, inflight);
      rs.peak_inflight_per_chunk[a.chunk] = std::max(rs.peak_inflight_per_chunk[a.chunk], per_chunk[a.chunk]);
      switch (a.kind) {
        case ActionKind::Forward: memory += 1; break;
        case ActionKind::Backward: memory -= 1; break;
        case ActionKind::Input: memory -= 1 - costs.weight_memory; break;
        case ActionKind::Weight: memory -= costs.weight_memory; break;
      }
      rs.peak_memory = std::max(rs.peak_memory, memory);
    }
    if (!list.empty()) rs.span = run.end[r].back() - run.start[r].front();
    sim.peak_inflight = std::max(sim.peak_inflight, rs.peak_inflight);
    sim.peak_memory = std::max(sim.peak_memory, rs.peak_memory);
    sim.period = std::max(sim.period, rs.span);
  }
  for (auto& rs : sim.ranks) {
    rs.idle = sim.makespan - rs.busy;
    rs.overlapped_idle = sim.period - rs.busy;
    rs.bubble = sim.makespan > 0 ? 1.0 - rs.busy / sim.makespan : 0.0;
    sim.bubble += rs.bubble / s.pp;
  }
  return sim;
}

}  // namespace tripod
