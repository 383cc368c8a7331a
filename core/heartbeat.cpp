#include "core/heartbeat.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "core/log.h"

namespace tripod {

Heartbeat::Heartbeat(const std::string& status_path, double timeout_s) {
  if (status_path.empty()) return;
  const char* rank = launcher_rank();
  path_ = status_path + ".rank" + (rank ? rank : "0");
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  host_ = host;
  limit_s_ = timeout_s > kMinLimitS ? timeout_s : kMinLimitS;
  write("alive");
  beat_ = std::thread([this] {
    std::unique_lock lock(mu_);
    while (!cv_.wait_for(lock, std::chrono::duration<double>(kPeriodS), [this] { return done_; }))
      ::utimensat(AT_FDCWD, path_.c_str(), nullptr, 0);  // mtime = now
  });
}

Heartbeat::~Heartbeat() {
  if (path_.empty()) return;
  {
    std::lock_guard lock(mu_);
    done_ = true;
  }
  cv_.notify_one();
  beat_.join();
  write("exited");
}

// Whole or not at all: written beside the file and renamed over it.
void Heartbeat::write(const char* state) const {
  const std::string tmp = path_ + ".tmp";
  if (FILE* f = std::fopen(tmp.c_str(), "w")) {
    std::fprintf(f, "%s %d %.0f %s\n", host_.c_str(), static_cast<int>(::getpid()), limit_s_, state);
    if (std::fclose(f) == 0) std::rename(tmp.c_str(), path_.c_str());
  }
}

}  // namespace tripod
