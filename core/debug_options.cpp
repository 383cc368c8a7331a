// Reading the TRIPOD_* environment variables into DebugOptions.
#include "core/debug_options.h"

#include <cmath>
#include <cstdlib>
#include <string>
#include <string_view>

#include "core/error.h"

namespace tripod {

std::vector<FaultInjection> parse_fault_injections(const char* spec) {
  std::vector<FaultInjection> out;
  if (!spec || !*spec) return out;
  std::string s(spec);
  for (size_t pos = 0; pos <= s.size();) {
    size_t end = s.find(',', pos);
    if (end == std::string::npos) end = s.size();
    std::string item = s.substr(pos, end - pos);
    size_t at = item.find('@');
    std::string where = at == std::string::npos ? "" : item.substr(0, at);
    int64_t step = 0;
    try {
      if (at != std::string::npos) step = std::stoll(item.substr(at + 1));
    } catch (const std::exception&) {
      step = 0;
    }
    TRIPOD_INPUT_CHECK((where == "loss" || where == "grad") && step > 0,
                       "TRIPOD_INJECT_NAN: '{}' is not loss@STEP or grad@STEP (STEP >= 1), in '{}'", item, s);
    out.push_back({step, where == "loss"});
    pos = end + 1;
  }
  return out;
}

SlowRank parse_slow_rank(const char* spec) {
  if (!spec || !*spec) return {};
  const std::string s(spec);
  const size_t colon = s.find(':');
  SlowRank r;
  bool ok = colon != std::string::npos && colon > 0 && colon + 1 < s.size();
  if (ok) {
    const std::string rank = s.substr(0, colon), factor = s.substr(colon + 1);
    char* end = nullptr;
    const long v = std::strtol(rank.c_str(), &end, 10);
    ok = *end == '\0' && v >= 0 && v <= 1 << 24;
    r.rank = static_cast<int>(v);
    r.factor = std::strtod(factor.c_str(), &end);
    ok = ok && *end == '\0' && std::isfinite(r.factor) && r.factor >= 1;
  }
  TRIPOD_INPUT_CHECK(ok, "environment variable TRIPOD_SLOW_RANK = \"{}\" is not RANK:FACTOR (a world rank >= 0 and a "
                     "slow-down factor >= 1, e.g. 3:2)", s);
  return r;
}

CommFault parse_comm_fault(const char* spec) {
  CommFault f;
  if (!spec || !*spec) return f;
  const std::string s(spec);
  const size_t colon = s.find(':'), at = s.find('@');
  const std::string kind = s.substr(0, colon);
  bool ok = colon != std::string::npos && at != std::string::npos && at > colon;
  f.kind = kind == "stop-send" ? CommFault::Kind::StopSend
           : kind == "skip-allreduce" ? CommFault::Kind::SkipAllReduce
           : kind == "sleep" ? CommFault::Kind::Sleep
                             : CommFault::Kind::None;
  ok = ok && f.kind != CommFault::Kind::None;
  if (ok) {
    try {
      size_t used = 0;
      const std::string rank = s.substr(colon + 1, at - colon - 1);
      f.rank = std::stoi(rank, &used);
      ok = used == rank.size() && f.rank >= 0;
      const size_t colon2 = s.find(':', at);
      const std::string step = s.substr(at + 1, colon2 == std::string::npos ? std::string::npos : colon2 - at - 1);
      f.step = std::stoll(step, &used);
      ok = ok && used == step.size() && f.step >= 1;
      if (colon2 != std::string::npos) {
        ok = ok && f.kind == CommFault::Kind::Sleep;
        const std::string secs = s.substr(colon2 + 1);
        f.sleep_s = std::stod(secs, &used);
        ok = ok && used == secs.size() && f.sleep_s >= 0 && f.sleep_s < 1e6;
      }
    } catch (const std::exception&) {
      ok = false;
    }
  }
  TRIPOD_INPUT_CHECK(ok,
                     "environment variable TRIPOD_TEST_COMM_FAULT = \"{}\" is not stop-send:RANK@STEP, "
                     "skip-allreduce:RANK@STEP or sleep:RANK@STEP[:SECONDS] (RANK >= 0, STEP >= 1)",
                     s);
  return f;
}

DebugOptions read_debug_options() {
  auto env = [](const char* name) -> std::string_view {
    const char* v = std::getenv(name);
    return v ? v : "";
  };
  DebugOptions o;
  const std::string_view comm = env("TRIPOD_COMM");
  TRIPOD_INPUT_CHECK(comm.empty() || comm == "mpi" || comm == "auto",
                     "environment variable TRIPOD_COMM = \"{}\" is not \"auto\" or \"mpi\"", comm);
  o.force_mpi = comm == "mpi";
  const std::string_view att = env("TRIPOD_ATTENTION");
  TRIPOD_INPUT_CHECK(att.empty() || att == "auto" || att == "cudnn" || att == "reference",
                     "environment variable TRIPOD_ATTENTION = \"{}\" is not \"auto\", \"cudnn\" or \"reference\"", att);
  o.attention = att == "cudnn" ? AttentionKernels::Cudnn
                : att == "reference" ? AttentionKernels::Reference
                                     : AttentionKernels::Auto;
  const std::string_view timing = env("TRIPOD_CUDA_TIMING");
  TRIPOD_INPUT_CHECK(timing.empty() || timing == "0" || timing == "1",
                     "environment variable TRIPOD_CUDA_TIMING = \"{}\" is not 0 or 1", timing);
  o.cuda_timing = timing == "1";
  const std::string peak(env("TRIPOD_PEAK_TFLOPS"));
  if (!peak.empty()) {
    char* end = nullptr;
    o.peak_tflops = std::strtod(peak.c_str(), &end);
    TRIPOD_INPUT_CHECK(end != peak.c_str() && *end == '\0' && std::isfinite(o.peak_tflops) && o.peak_tflops > 0,
                       "environment variable TRIPOD_PEAK_TFLOPS = \"{}\" is not a positive number of TFLOP/s", peak);
  }
  o.inject_nan = parse_fault_injections(std::getenv("TRIPOD_INJECT_NAN"));
  o.slow_rank = parse_slow_rank(std::getenv("TRIPOD_SLOW_RANK"));
  // A number of milliseconds >= 0 (0 when unset).
  auto millis = [&](const char* name) {
    const std::string v(env(name));
    if (v.empty()) return 0;
    size_t used = 0;
    int ms = -1;
    try {
      ms = std::stoi(v, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    TRIPOD_INPUT_CHECK(used == v.size() && ms >= 0,
                       "environment variable {} = \"{}\" is not a number of milliseconds >= 0", name, v);
    return ms;
  };
  o.checkpoint_sleep_ms = millis("TRIPOD_TEST_CKPT_SLEEP_MS");
  o.exit_linger_ms = millis("TRIPOD_TEST_EXIT_LINGER_MS");
  o.step_sleep_ms = millis("TRIPOD_TEST_STEP_SLEEP_MS");
  o.comm_fault = parse_comm_fault(std::getenv("TRIPOD_TEST_COMM_FAULT"));
  o.launch_status = std::string(env("TRIPOD_LAUNCH_STATUS"));
  const std::string attempt(env("TRIPOD_RESTART_ATTEMPT"));
  if (!attempt.empty()) {
    // Written by launch/restarts.sh, never by hand: a malformed value is ignored, not refused.
    auto number = [&](const char* name) {
      const std::string v(env(name));
      char* end = nullptr;
      const double x = std::strtod(v.c_str(), &end);
      return end != v.c_str() && std::isfinite(x) ? x : 0.0;
    };
    o.restart.attempt = static_cast<int>(number("TRIPOD_RESTART_ATTEMPT"));
    o.restart.cause = std::string(env("TRIPOD_RESTART_CAUSE"));
    o.restart.exit_status = static_cast<int>(number("TRIPOD_RESTART_EXIT_STATUS"));
    o.restart.failed_at = number("TRIPOD_RESTART_FAILED_AT");
    o.restart.previous_start = number("TRIPOD_RESTART_PREVIOUS_START");
  }
  return o;
}

}  // namespace tripod
