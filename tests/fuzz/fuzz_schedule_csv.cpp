// Fuzzes custom pipeline schedules (CSV): parsing, validation and simulation. A schedule that
// validates must simulate without deadlock, and print back to CSV that parses to itself.
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
    (void)simulate(s, PipeCosts{});
    if (schedule_csv(parse_schedule_csv(schedule_csv(s), "again.csv")) != schedule_csv(s)) std::abort();
  });
  return 0;
}
