// The watch thread of MpiDeadline: sleeps until the call returns or its time is up.
#include "parallel/comm/mpi_deadline.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>

namespace tripod {

namespace {

// This process's world rank as the launcher gives it (MPI may not be initialized yet), or "?".
std::string launcher_rank() {
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"})
    if (const char* v = std::getenv(var)) return v;
  return "?";
}

}  // namespace

MpiDeadline::MpiDeadline(std::string what, double limit_s) : what_(std::move(what)), limit_s_(limit_s) {
  watch_ = std::thread([this] {
    std::unique_lock lock(mu_);
    if (cv_.wait_for(lock, std::chrono::duration<double>(limit_s_), [this] { return done_; })) return;
    std::fprintf(stderr,
                 "error: rank %s: %s did not complete within %.0f s: a peer rank has died, stopped or hung before "
                 "taking part (parallel.timeout_s, at least %.0f s here, sets this limit)\n",
                 launcher_rank().c_str(), what_.c_str(), limit_s_, kMinLimitS);
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
