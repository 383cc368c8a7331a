// The one start-up path of train, eval, generate and the benchmarks.
#include "train/runtime.h"

#include <fmt/format.h>
#include <time.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>

#include "parallel/comm/flight_diagnose.h"
#include "train/mpi_session.h"
#include "train/signals.h"

namespace tripod {

std::unique_ptr<Ops> make_rank_ops(const Config& cfg, const DebugOptions& debug) {
  const int gpus = cuda_device_count();
  return make_ops(cfg.train.device,
                  gpus > 0 ? MpiSession::local_rank() % gpus : 0, debug);
}

namespace {

void sleep_s(double s) {
  timespec ts{static_cast<time_t>(s), static_cast<long>((s - static_cast<double>(static_cast<time_t>(s))) * 1e9)};
  nanosleep(&ts, nullptr);
}

// The hooks of every wait: dump the ring on a stop signal (once per signal) and on a timeout;
// after a timeout rank 0 prints the diagnosis while the others give it a moment before exiting.
std::shared_ptr<WaitHooks> flight_hooks(std::shared_ptr<FlightRecorder> rec, double timeout_s) {
  auto hooks = std::make_shared<WaitHooks>();
  auto dumped_at = std::make_shared<std::atomic<double>>(0.0);
  auto seen = std::make_shared<int>(0);
  hooks->poll = [rec, seen] {
    const int sig = stop_signal();
    if (sig == 0 || sig == *seen) return;
    *seen = sig;
    rec->dump(fmt::format("signal {} while waiting", sig == SIGUSR1 ? "SIGUSR1" : sig == SIGTERM ? "SIGTERM" : "?"));
  };
  hooks->timed_out = [rec, dumped_at](const std::string& what) {
    if (dumped_at->load() > 0) return;
    dumped_at->store(flight_now());
    rec->dump("timeout: " + what);
  };
  hooks->failed = [rec, dumped_at, timeout_s](const std::string&) {
    if (rec->dump_dir().empty()) return;
    if (rec->world_rank() != 0) {
      sleep_s(2.0);  // rank 0 reads this rank's dump and prints the diagnosis before the launcher ends the job
      return;
    }
    const std::string run_dir = std::filesystem::path(rec->dump_dir()).parent_path().string();
    const std::string report = flight_report(run_dir, dumped_at->load() - 2 * timeout_s - 30);
    if (!report.empty()) {
      std::fprintf(stderr, "flight recorder (tripod trace diagnose %s):\n%s", run_dir.c_str(), report.c_str());
      std::fflush(stderr);
    }
  };
  return hooks;
}

}  // namespace

std::string flight_report(const std::string& run_dir, double since) {
  try {
    std::vector<FlightRing> rings;
    // The others dump when their own waits time out, before their liveness probes, as this rank
    // did; by now they have, but give a slow file system a second.
    for (int tries = 0; tries < 10; ++tries) {
      rings.clear();
      for (FlightRing& r : read_flight_rings(run_dir))
        if (r.time >= since) rings.push_back(std::move(r));
      if (!rings.empty() && static_cast<int>(rings.size()) >= rings.front().world_size) break;
      sleep_s(0.1);
    }
    std::string out;
    for (const std::string& line : diagnose_flight(rings).lines) out += "  " + line + "\n";
    return out;
  } catch (const std::exception& e) {
    return "";
  }
}

Runtime make_runtime(const Config& cfg, bool flight_recorder) {
  return make_runtime(cfg, read_debug_options(), flight_recorder);
}

Runtime make_runtime(const Config& cfg, const DebugOptions& debug, bool flight_recorder) {
  Runtime rt;
  rt.debug = debug;
  rt.ops = make_rank_ops(cfg, rt.debug);
  const ParallelConfig& pc = cfg.parallel;
  rt.world = mpi_world(rt.ops.get(), pc.timeout_s);
  if (flight_recorder && pc.flight_recorder_size > 0) {
    namespace fs = std::filesystem;
    const std::string dir = cfg.train.output_dir.empty() ? "" : (fs::path(cfg.train.output_dir) / "flight").string();
    if (rt.world->rank() == 0 && !dir.empty() && fs::exists(dir)) {
      std::error_code ec;
      fs::remove_all(dir + ".previous", ec);
      fs::rename(dir, dir + ".previous", ec);
    }
    rt.flight = std::make_shared<FlightRecorder>(rt.world->rank(), rt.world->size(),
                                                 static_cast<size_t>(pc.flight_recorder_size), dir);
    rt.world->set_hooks(flight_hooks(rt.flight, pc.timeout_s));
  }
  rt.par = make_parallel_context(*rt.world, pc.grid(),
                                 {.sequence_parallel = pc.sequence_parallel,
                                  .cp_comm = pc.cp_comm,
                                  .moe_dispatcher = pc.moe_dispatcher,
                                  .force_mpi = rt.debug.force_mpi,
                                  .flight = rt.flight,
                                  .comm_fault = rt.debug.comm_fault});
  return rt;
}

}  // namespace tripod
