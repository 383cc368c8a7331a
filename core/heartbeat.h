// A rank's heartbeat for the launcher's watchdog (launch/restarts.sh). Under a launcher that
// restarts failed runs (TRIPOD_LAUNCH_STATUS=FILE), every rank of `tripod train` keeps a file
// FILE.rank<R> holding "HOST PID LIMIT_S STATE" and touches it every second from a thread of its
// own. The launcher watches those files: one left untouched for LIMIT_S seconds while its process
// lives belongs to a rank that is stopped (SIGSTOP, a frozen node): it kills that rank (on this
// host; the whole job for a rank elsewhere), so the job ends and starts again. That covers what no
// rank can see by itself: a rank frozen after its peers have finished, which mpirun would wait
// for forever. A rank that ends writes STATE "exited"; one that is merely slow keeps beating.
#pragma once

#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

namespace tripod {

class Heartbeat {
 public:
  static constexpr double kPeriodS = 1;   // how often the file is touched
  static constexpr double kMinLimitS = 10;  // the launcher's limit is max(parallel.timeout_s, this)

  // Beats into `status_path`.rank<world rank> (the rank as the launcher's environment gives it);
  // does nothing when `status_path` is empty. Never throws: a file it cannot write only means no
  // watchdog.
  Heartbeat(const std::string& status_path, double timeout_s);
  ~Heartbeat();  // writes STATE "exited"
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

 private:
  void write(const char* state) const;

  std::string path_, host_;
  double limit_s_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread beat_;
};

}  // namespace tripod
