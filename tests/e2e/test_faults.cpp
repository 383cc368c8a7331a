// Faults under mpirun: a rank that dies or stops answering ends the whole job with an error naming
// it, within parallel.timeout_s, instead of a hang; so does a data file that one rank lacks.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <signal.h>

#include <map>
#include <thread>

#include "cli_util.h"
#include "data/indexed_dataset.h"

namespace tripod {
namespace {

using test::slurp;

using namespace std::chrono_literals;

// A tiny pipeline (pp = 2) x data-parallel (dp = 2) run long enough to be interrupted.
const char* kLong = R"([model]
n_layers = 2
n_heads = 4
d_model = 32
seq_len = 16
vocab_size = 64
[parallel]
pp = 2
timeout_s = 5
[train]
micro_batch_size = 2
global_batch_size = 8
steps = 100000
log_interval = 1
trace = false
[data]
synthetic = true
)";

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
  int status = -1;
  double seconds_after_signal = 0;
  std::string output;
};

// Starts the run on 4 ranks, waits until it has logged two steps, sends `sig` to world rank 2 and
// waits for mpirun to end (at most `limit`).
Interrupted interrupt_rank(const std::string& name, int sig, std::chrono::seconds limit) {
  auto dir = test::scratch_dir(name);
  test::write_file(dir / "c.toml", kLong);
  std::string run = (dir / "run").string();
  std::string cmd = test::mpirun(4) + test::tripod_bin() + " train --config " + (dir / "c.toml").string() +
                    " --set train.output_dir=" + run;
  std::system(("(" + cmd + " >" + (dir / "out").string() + " 2>&1; echo $? >" + (dir / "rc").string() + ") &").c_str());

  Interrupted r;
  auto started = std::chrono::steady_clock::now();
  while (test::count_lines_starting(slurp(dir / "run" / "metrics.jsonl"), "{") < 2) {
    if (std::chrono::steady_clock::now() - started > 120s || std::filesystem::exists(dir / "rc")) {
      ADD_FAILURE() << "the run did not get going: " << slurp(dir / "out");
      return r;
    }
    std::this_thread::sleep_for(100ms);
  }
  pid_t victim = find_rank(dir.string(), 2);
  if (victim <= 0) {
    ADD_FAILURE() << "world rank 2 not found";
    return r;
  }
  kill(victim, sig);
  auto t0 = std::chrono::steady_clock::now();
  while (!std::filesystem::exists(dir / "rc") && std::chrono::steady_clock::now() - t0 < limit)
    std::this_thread::sleep_for(100ms);
  r.seconds_after_signal = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::this_thread::sleep_for(200ms);  // the rc file is written, then flushed
  if (std::filesystem::exists(dir / "rc")) r.status = std::stoi(slurp(dir / "rc"));
  r.output = slurp(dir / "out");
  kill(victim, SIGKILL);  // a stopped rank, should mpirun have left it
  if (r.status < 0) std::system(("pkill -9 -f " + dir.string()).c_str());
  std::filesystem::remove_all(dir);
  return r;
}

TEST(Faults, KilledRankEndsTheJobNamingIt) {
  Interrupted r = interrupt_rank("killed", SIGKILL, 60s);
  ASSERT_GE(r.status, 0) << "the job did not end within 60 s of rank 2 dying:\n" << r.output;
  EXPECT_NE(r.status, 0);
  // Open MPI notices the dead process and names it; the other ranks are ended.
  EXPECT_NE(r.output.find("rank 2"), std::string::npos) << r.output;
}

TEST(Faults, UnresponsiveRankTimesOutWithAnErrorNamingIt) {
  // A stopped rank is alive to the launcher: only the collective timeout (5 s) can end the job.
  Interrupted r = interrupt_rank("stopped", SIGSTOP, 60s);
  ASSERT_GE(r.status, 0) << "the job did not end within 60 s of rank 2 stopping:\n" << r.output;
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
TEST(Faults, DataFileMissingOnOneRankOnly) {
  namespace fs = std::filesystem;
  const auto dir = test::scratch_dir("data_one_rank"), run = test::scratch_dir("data_one_rank_run");
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
  test::write_file(dir / "c.toml", R"([model]
n_layers = 1
n_heads = 2
d_model = 16
seq_len = 8
vocab_size = 64
[train]
micro_batch_size = 1
global_batch_size = 2
steps = 2
trace = false
[data]
prefixes = ["data/tiny"]
)");
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
    const auto r = test::run_cmd(fmt::format("timeout -k 5 120 {}-wdir {} {} : -np 1 -wdir {} {}", test::mpirun(1),
                                             wdir[0].string(), args, wdir[1].string(), args));
    EXPECT_EQ(r.status, 2) << r.err;
    EXPECT_LT(r.seconds, 60) << r.err;
    EXPECT_EQ(test::count_lines_starting(r.err, "error:"), 1) << r.err;
    const std::string want = fmt::format("error: rank {}: data.prefixes: data/tiny.idx: no such file", lacking);
    EXPECT_NE(r.err.find(want), std::string::npos) << r.err;
    EXPECT_TRUE(files() == before) << "a file under " << dir << " was written, changed or removed";
  }
  fs::remove_all(run);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tripod
