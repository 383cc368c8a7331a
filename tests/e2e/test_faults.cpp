// Faults under mpirun: a rank that dies or stops answering ends the whole job with an error naming
// it, within parallel.timeout_s, instead of a hang; so does a data file that one rank lacks.
#include <fmt/format.h>
#include <signal.h>

#include <map>

#include "data/indexed_dataset.h"
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

// A data file that one rank lacks: each rank runs in its own working directory with the same
// relative data prefix (Open MPI's MPMD form, one rank per directory). Every rank stops at once
// with exit status 2 and one error line, from the rank that lacks the file; nothing is written
// beside the data (no index cache built by the rank that has it).
TEST_F(Faults, DataFileMissingOnOneRankOnly) {
  namespace fs = std::filesystem;
  const fs::path dir = dir_ / "ranks", run = dir_ / "run";
  fs::create_directories(dir / "has" / "data");
  fs::create_directories(dir / "lacks");
  {
    IndexedDatasetWriter w((dir / "has" / "data" / "tiny").string(), TokenDType::U16);
    std::vector<int32_t> doc(40);
    for (int d = 0; d < 8; ++d) {
      for (size_t i = 0; i < doc.size(); ++i) doc[i] = static_cast<int32_t>((d * 7 + i) % 64);
      w.add_document(doc);
    }
    w.finish();
  }
  // One layer of width 16 over 8 tokens, 2 steps of 2 sequences, from the relative prefix.
  test::write_file(dir / "c.toml",
                   test::tiny_config({{"model.n_layers", "1"}, {"model.n_heads", "2"}, {"model.d_model", "16"},
                                      {"model.seq_len", "8"}, {"train.micro_batch_size", "1"},
                                      {"train.global_batch_size", "2"}, {"train.steps", "2"}, {"train.log_interval", ""},
                                      {"train.trace", "false"}, {"data.synthetic", ""},
                                      {"data.prefixes", "[\"data/tiny\"]"}}));
  auto files = [&] {
    std::map<std::string, std::string> out;
    for (const auto& e : fs::recursive_directory_iterator(dir))
      if (e.is_regular_file()) out[e.path().string()] = slurp(e.path());
    return out;
  };
  const auto before = files();
  for (int lacking : {1, 0}) {
    SCOPED_TRACE(fmt::format("world rank {} lacks the data", lacking));
    const fs::path wdir[2] = {dir / (lacking == 0 ? "lacks" : "has"), dir / (lacking == 0 ? "has" : "lacks")};
    const std::string args = fmt::format("{} train --config {} --set train.output_dir={}", test::tripod_bin(),
                                         (dir / "c.toml").string(), run.string());
    const auto r = test::run_cmd(
        fmt::format("{}-wdir {} {} : -np 1 -wdir {} {}", test::mpirun(1), wdir[0].string(), args, wdir[1].string(), args),
        120);
    EXPECT_EQ(r.status, 2) << r.err;
    EXPECT_LT(r.seconds, 60) << r.err;
    EXPECT_EQ(test::count_lines_starting(r.err, "error:"), 1) << r.err;
    const std::string want = fmt::format("error: rank {}: data.prefixes: data/tiny.idx: no such file", lacking);
    EXPECT_NE(r.err.find(want), std::string::npos) << r.err;
    EXPECT_TRUE(files() == before) << "a file under " << dir << " was written, changed or removed";
  }
}

}  // namespace
}  // namespace tripod
