// Faults under mpirun: a rank that dies or stops answering ends the whole job with an error naming
// it, within parallel.timeout_s, instead of a hang.
#include <signal.h>

#include "e2e_test.h"

namespace tripod {
namespace {

using test::slurp;

using namespace std::chrono_literals;

// A tiny pipeline (pp = 2) x data-parallel (dp = 2) run long enough to be interrupted.
const test::ConfigOverrides kLong = {
    {"parallel.pp", "2"}, {"parallel.timeout_s", "5"}, {"train.steps", "100000"}, {"train.trace", "false"}};

// The pid of the process started under `marker` (a path in its command line) with this world rank.
pid_t find_rank(const std::string& marker, int rank) {
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmd = slurp(e.path() / "cmdline"), env = slurp(e.path() / "environ");
    std::replace(cmd.begin(), cmd.end(), '\0', ' ');
    if (cmd.find(" train ") == std::string::npos || cmd.find(marker) == std::string::npos) continue;
    if (cmd.find("mpirun") != std::string::npos) continue;
    if (env.find(std::string("OMPI_COMM_WORLD_RANK=") + std::to_string(rank) + '\0') != std::string::npos)
      return static_cast<pid_t>(std::stol(name));
  }
  return -1;
}

struct Interrupted {
  bool ended = false;  // mpirun ended within the limit
  int status = -1;
  double seconds_after_signal = 0;
  std::string output;
};

class Faults : public test::E2eTest {
 protected:
  // Starts the run on 4 ranks, waits until it has logged two steps, sends `sig` to world rank 2
  // and waits for mpirun to end (at most `limit`).
  Interrupted interrupt_rank(int sig, std::chrono::seconds limit) {
    const auto cfg = write_config(kLong);
    test::Background job(
        test::tripod_cmd("train --config " + cfg.string() + " --set train.output_dir=" + (dir_ / "run").string(),
                         {.np = 4}),
        dir_ / "out");
    Interrupted r;
    auto started = std::chrono::steady_clock::now();
    while (test::count_lines_starting(slurp(dir_ / "run" / "metrics.jsonl"), "{") < 2) {
      if (std::chrono::steady_clock::now() - started > 120s || job.wait(0)) {
        ADD_FAILURE() << "the run did not get going: " << job.log();
        return r;
      }
      std::this_thread::sleep_for(100ms);
    }
    pid_t victim = find_rank(dir_.string(), 2);
    if (victim <= 0) {
      ADD_FAILURE() << "world rank 2 not found";
      return r;
    }
    kill(victim, sig);
    auto t0 = std::chrono::steady_clock::now();
    const std::optional<int> status = job.wait(static_cast<double>(limit.count()));
    r.seconds_after_signal = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.ended = status.has_value();
    r.status = status.value_or(-1);
    r.output = job.log();
    kill(victim, SIGKILL);  // a stopped rank, should mpirun have left it
    if (!r.ended) std::system(("pkill -9 -f " + dir_.string()).c_str());
    return r;
  }
};

TEST_F(Faults, KilledRankEndsTheJobNamingIt) {
  Interrupted r = interrupt_rank(SIGKILL, 60s);
  ASSERT_TRUE(r.ended) << "the job did not end within 60 s of rank 2 dying:\n" << r.output;
  EXPECT_NE(r.status, 0);
  // Open MPI notices the dead process and names it; the other ranks are ended.
  EXPECT_NE(r.output.find("rank 2"), std::string::npos) << r.output;
}

TEST_F(Faults, UnresponsiveRankTimesOutWithAnErrorNamingIt) {
  // A stopped rank is alive to the launcher: only the collective timeout (5 s) can end the job.
  Interrupted r = interrupt_rank(SIGSTOP, 60s);
  ASSERT_TRUE(r.ended) << "the job did not end within 60 s of rank 2 stopping:\n" << r.output;
  EXPECT_NE(r.status, 0);
  EXPECT_LT(r.seconds_after_signal, 40) << r.output;
  EXPECT_NE(r.output.find("did not complete within 5 s"), std::string::npos) << r.output;
  // The ranks that waited probe the others: rank 2 alone does not answer.
  EXPECT_NE(r.output.find("world rank(s) 2 did not answer a liveness probe"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace tripod
