// Fuzzes custom pipeline schedules (CSV, tripod's format and PyTorch's): parsing, validation and
// simulation. A schedule that validates must simulate without deadlock, and print back to either
// CSV format that parses to itself.
#include "parallel/pipeline/schedules.h"
#include "parallel/pipeline/simulate.h"
#include "tests/fuzz/fuzz_util.h"

using namespace tripod;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  fuzz::expect_only_input_errors([&] {
    Schedule s = parse_schedule_csv(text, "fuzz.csv");
    if (s.pp > 64 || s.microbatches > 256 || s.vp > 16) return;  // simulation cost, not a finding
    validate_schedule(s);
    PipeCosts costs;
    costs.weight = 0.75;
    costs.weight_memory = 0.5;
    (void)simulate(s, costs);
    if (schedule_csv(parse_schedule_csv(schedule_csv(s), "again.csv")) != schedule_csv(s)) std::abort();
    Schedule p = parse_schedule_csv(schedule_csv_pytorch(s), "again_pt.csv");
    // pp = 1 with two chunks fits both placements; the stages, not the placement, must survive.
    if (schedule_csv_pytorch(p) != schedule_csv_pytorch(s) || p.ranks != s.ranks) std::abort();
  });
  return 0;
}
