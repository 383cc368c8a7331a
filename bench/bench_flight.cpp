// The flight recorder's cost per communication operation: what RecordingComm adds to a blocking
// collective (record, then marks Waiting and Completed) on one thread, in ns, median of 9 runs of
// 200,000 operations. Multiplied by the operations a rank makes per step (printed by
// bench/flight_overhead.sh from a dump), it bounds the recorder's share of a step.
//
//   build/bin/bench_flight [--ops-per-step N --step-ms T]
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "parallel/comm/flight_recorder.h"

int main(int argc, char** argv) {
  using namespace tripod;
  double ops_per_step = 0, step_ms = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--ops-per-step")) ops_per_step = std::atof(argv[i + 1]);
    if (!std::strcmp(argv[i], "--step-ms")) step_ms = std::atof(argv[i + 1]);
  }
  FlightRecorder rec(0, 8, 2000, "");
  const int comm = rec.add_comm("dp", {0, 2, 4, 6});
  const int pp = rec.add_comm("pp", {0, 4});
  rec.set_step(1);
  const int n = 200000;
  std::vector<double> ns;
  for (int rep = 0; rep < 9; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) {
      FlightPhase phase(&rec, "F7.1");
      const uint64_t id = (i & 1) ? rec.record(comm, FlightKind::AllReduce, -1, -1, 4096)
                                  : rec.record(pp, FlightKind::Send, 4, i & 15, 4096);
      rec.mark(id, FlightState::Waiting);
      rec.mark(id, FlightState::Completed);
    }
    ns.push_back(std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / n);
  }
  std::sort(ns.begin(), ns.end());
  fmt::print("{:<44} {:>10}\n", "flight recorder, per operation", "ns");
  fmt::print("{:<44} {:>10.1f}\n", "record + wait + complete + phase (median)", ns[ns.size() / 2]);
  fmt::print("{:<44} {:>10.1f}\n", "  (min of 9)", ns.front());
  if (ops_per_step > 0 && step_ms > 0)
    fmt::print("{:<44} {:>9.4f}%\n", fmt::format("share of a {:.1f} ms step at {:.0f} ops/step", step_ms, ops_per_step),
               100 * ops_per_step * ns[ns.size() / 2] * 1e-6 / step_ms);
  return 0;
}
