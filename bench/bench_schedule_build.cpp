// What the planner pays per pipeline candidate: building a schedule, planning its messages
// (plan_pipeline: validation and the deadlock check) and simulating it with per-stage costs, for
// the fixed schedules `tripod plan` ranks, at Megatron-sized micro-batch counts. Prints the median
// of --repeats runs per step, in milliseconds.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

#include "parallel/pipeline/schedules.h"
#include "parallel/pipeline/simulate.h"

using namespace tripod;

namespace {

double median_ms(int repeats, const std::function<void()>& f) {
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Schedule build, plan and simulation time per planner candidate"};
  int repeats = 3;
  std::vector<int> pps = {8, 64}, ms = {128, 256, 512};
  app.add_option("--repeats", repeats, "Timed runs per cell (median)");
  app.add_option("--pp", pps, "Pipeline sizes");
  app.add_option("--m", ms, "Micro-batches per step");
  CLI11_PARSE(app, argc, argv);
  fmt::print("{:>12} {:>4} {:>5} {:>8} | {:>10} {:>10} {:>10} {:>10}\n", "schedule", "pp", "m", "actions", "build ms",
             "plan ms", "sim ms", "total ms");
  struct Kind {
    ScheduleKind kind;
    int vp;
    Placement placement;
  };
  for (int pp : pps)
    for (int m : ms)
      for (const Kind& k : {Kind{ScheduleKind::OneFOneB, 1, Placement::Loop}, Kind{ScheduleKind::ZbH1, 1, Placement::Loop},
                            Kind{ScheduleKind::Interleaved, 2, Placement::Loop}, Kind{ScheduleKind::Zbv, 2, Placement::V}}) {
        Schedule s;
        PipePlan plan;
        const double build = median_ms(repeats, [&] { s = build_schedule(k.kind, pp, k.vp, m, k.placement); });
        const double planning = median_ms(repeats, [&] { plan = plan_pipeline(s); });
        StageCosts costs;
        for (int st = 0; st < pp * k.vp; ++st) {  // a heavier last stage, as the head makes it
          costs.forward.push_back(st + 1 == pp * k.vp ? 1.3 : 1.0);
          costs.backward.push_back(st + 1 == pp * k.vp ? 2.6 : 2.0);
          costs.weight.push_back(st + 1 == pp * k.vp ? 1.2 : 1.0);
        }
        const double sim = median_ms(repeats, [&] { simulate(s, plan, PipeCosts{}, costs); });
        size_t actions = 0;
        for (const auto& r : s.ranks) actions += r.size();
        fmt::print("{:>12} {:>4} {:>5} {:>8} | {:>10.2f} {:>10.2f} {:>10.2f} {:>10.2f}\n", enum_name(k.kind), pp, m,
                   actions, build, planning, sim, build + planning + sim);
        std::fflush(stdout);
      }
  return 0;
}
