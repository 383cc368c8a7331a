// The watch thread of MpiDeadline: sleeps until the call returns or its time is up.
#include "parallel/comm/mpi_deadline.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "core/log.h"

namespace tripod {

MpiDeadline::MpiDeadline(std::string what, double limit_s) : what_(std::move(what)), limit_s_(limit_s) {
  watch_ = std::thread([this] {
    std::unique_lock lock(mu_);
    if (cv_.wait_for(lock, std::chrono::duration<double>(limit_s_), [this] { return done_; })) return;
    const char* rank = launcher_rank();
    std::fprintf(stderr,
                 "error: rank %s: %s did not complete within %.0f s: a peer rank has died, stopped or hung before "
                 "taking part (parallel.timeout_s, at least %.0f s here, sets this limit)\n",
                 rank ? rank : "?", what_.c_str(), limit_s_, kMinLimitS);
    std::fflush(stderr);
    std::_Exit(1);
  });
}

MpiDeadline::~MpiDeadline() {
  {
    std::lock_guard lock(mu_);
    done_ = true;
  }
  cv_.notify_one();
  watch_.join();
}

}  // namespace tripod
