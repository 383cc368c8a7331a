// Faults under mpirun: a rank that dies or stops answering ends the whole job with an error naming
// it, within parallel.timeout_s, instead of a hang; so does a data file that one rank lacks. A rank
// that stops sending on a pipeline edge, skips a data-parallel all-reduce or sleeps (the
// TRIPOD_TEST_COMM_FAULT hook) ends the job by the timeout, and the flight recorder's diagnosis
// names it, the operation and the peer.
#include <fmt/format.h>
#include <signal.h>

#include <map>

#include <nlohmann/json.hpp>

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

// A communication fault on 4 ranks, pp = 2 x dp = 2 (world ranks 0, 1: stage 0; 2, 3: stage 1;
// dp groups {0,1} and {2,3}; pipeline pairs 0-2 and 1-3), timeout 5 s: the job's status, its
// output, and `tripod trace diagnose` of its run directory (text and JSON).
struct Hang {
  test::CmdResult run, text, json_out;
  nlohmann::json diagnosis;
};

class FlightFaults : public test::E2eTest {
 protected:
  Hang hang(const std::string& fault) {
    const auto cfg = write_config({{"parallel.pp", "2"}, {"parallel.timeout_s", "5"}, {"train.steps", "6"},
                                   {"train.trace", "false"}});
    const std::string run = (dir_ / "run").string();
    Hang h;
    h.run = test::run_tripod("train --config " + cfg.string() + " --set train.output_dir=" + run,
                             {.np = 4, .env = "TRIPOD_TEST_COMM_FAULT=" + fault, .timeout_s = 90});
    h.text = test::run_tripod("trace diagnose " + run);
    h.json_out = test::run_tripod("trace diagnose --json " + run);
    h.diagnosis = nlohmann::json::parse(h.json_out.out, nullptr, false);
    return h;
  }
};

std::string culprit_text(const nlohmann::json& d) {
  return d.is_object() && d.contains("culprits") ? d["culprits"].dump() : "(no diagnosis)";
}

// Rank 0 posts no send to rank 2 from step 2: rank 2 waits for F0.0's activation, rank 0 for
// B0.0's gradient (a cycle); the forward comes first, so rank 0 is named.
TEST_F(FlightFaults, RankThatStopsSendingOnAPipelineEdgeIsNamed) {
  const Hang h = hang("stop-send:0@2");
  EXPECT_FALSE(h.run.timed_out) << h.run.err;
  EXPECT_EQ(h.run.status, 1) << h.run.err;
  // The job ends by the 5 s timeout, long before the 90 s limit of this test.
  EXPECT_NE(h.run.err.find("did not complete within 5 s"), std::string::npos) << h.run.err;
  ASSERT_EQ(h.text.status, 0) << h.text.err;
  EXPECT_NE(h.text.out.find("rank 2 is blocked in recv of F0.0 from rank 0 (pp group"), std::string::npos) << h.text.out;
  EXPECT_NE(h.text.out.find("rank 0 never posted the matching send"), std::string::npos) << h.text.out;
  EXPECT_NE(h.text.out.find("the hang starts at rank 0"), std::string::npos) << h.text.out;
  ASSERT_TRUE(h.diagnosis.is_object()) << h.json_out.out << h.json_out.err;
  ASSERT_EQ(h.diagnosis["culprits"].size(), 1u) << h.diagnosis.dump(1);
  EXPECT_EQ(h.diagnosis["culprits"][0]["rank"], 0) << h.diagnosis.dump(1);
  const auto& by = h.diagnosis["culprits"][0]["waited_for_by"];
  EXPECT_NE(std::find(by.begin(), by.end(), 2), by.end()) << h.diagnosis.dump(1);
  bool found = false;
  for (const auto& b : h.diagnosis["blocked"])
    if (b["rank"] == 2) {
      found = true;
      EXPECT_EQ(b["op"]["kind"], "recv");
      EXPECT_EQ(b["op"]["phase"], "F0.0");
      EXPECT_EQ(b["op"]["peer"], 0);
      EXPECT_EQ(b["op"]["comm"], "pp");
      EXPECT_EQ(b["op"]["step"], 2);
      EXPECT_EQ(b["waiting_for"], nlohmann::json::array({0}));
    }
  EXPECT_TRUE(found) << h.diagnosis.dump(1);
  // Rank 0 printed the same diagnosis before the job ended.
  EXPECT_NE(h.run.err.find("flight recorder (tripod trace diagnose"), std::string::npos) << h.run.err;
  EXPECT_NE(h.run.err.find("the hang starts at rank 0"), std::string::npos) << h.run.err;
}

// Rank 2 skips its data-parallel reduction of step 2 and goes on to the grad-norm all-reduce over
// the world; rank 3 waits for it in the dp all-reduce.
TEST_F(FlightFaults, RankThatSkipsADataParallelAllReduceIsNamed) {
  const Hang h = hang("skip-allreduce:2@2");
  EXPECT_FALSE(h.run.timed_out) << h.run.err;
  EXPECT_EQ(h.run.status, 1) << h.run.err;
  ASSERT_EQ(h.text.status, 0) << h.text.err;
  EXPECT_NE(h.text.out.find("dp group (ranks 2,3): all-reduce #"), std::string::npos) << h.text.out;
  EXPECT_NE(h.text.out.find("entered by 3; rank 2 is blocked in all-reduce #"), std::string::npos) << h.text.out;
  EXPECT_NE(h.text.out.find("of the world group (grad-norm, step 2)"), std::string::npos) << h.text.out;
  ASSERT_TRUE(h.diagnosis.is_object()) << h.json_out.out << h.json_out.err;
  ASSERT_EQ(h.diagnosis["culprits"].size(), 1u) << h.diagnosis.dump(1);
  EXPECT_EQ(h.diagnosis["culprits"][0]["rank"], 2) << h.diagnosis.dump(1);
  EXPECT_EQ(h.diagnosis["culprits"][0]["blocked_in"]["comm"], "world") << h.diagnosis.dump(1);
  EXPECT_EQ(h.diagnosis["culprits"][0]["blocked_in"]["phase"], "grad-norm") << h.diagnosis.dump(1);
  bool found = false;
  for (const auto& b : h.diagnosis["blocked"])
    if (b["rank"] == 3) {
      found = true;
      EXPECT_EQ(b["op"]["kind"], "all-reduce");
      EXPECT_EQ(b["op"]["comm"], "dp");
      EXPECT_EQ(b["op"]["step"], 2);
      EXPECT_EQ(b["waiting_for"], nlohmann::json::array({2}));
    }
  EXPECT_TRUE(found) << h.diagnosis.dump(1);
}

// Rank 1 sleeps 60 s in step 2: the others time out after 5 s and the job ends long before rank 1
// would wake; rank 1 left no record (it was not in communication), and rank 3 waits for its F0.0.
TEST_F(FlightFaults, SleepingRankIsNamedAndTheJobEndsByTheTimeout) {
  const Hang h = hang("sleep:1@2:60");
  EXPECT_FALSE(h.run.timed_out) << h.run.err;
  EXPECT_EQ(h.run.status, 1) << h.run.err;
  EXPECT_LT(h.run.seconds, 60) << "the job lasted until the sleeping rank woke up:\n" << h.run.err;
  std::printf("[ measured ] a 60 s sleep on one rank ended the job (timeout_s = 5) after %.1f s in all\n",
              h.run.seconds);
  ASSERT_EQ(h.text.status, 0) << h.text.err;
  EXPECT_NE(h.text.out.find("rank 1 left no flight record"), std::string::npos) << h.text.out;
  EXPECT_NE(h.text.out.find("rank 3 is blocked in recv of F0.0 from rank 1 (pp group"), std::string::npos)
      << h.text.out;
  ASSERT_TRUE(h.diagnosis.is_object()) << h.json_out.out << h.json_out.err;
  EXPECT_EQ(h.diagnosis["missing"], nlohmann::json::array({1})) << h.diagnosis.dump(1);
  ASSERT_EQ(h.diagnosis["culprits"].size(), 1u) << culprit_text(h.diagnosis);
  EXPECT_EQ(h.diagnosis["culprits"][0]["rank"], 1);
  EXPECT_EQ(h.diagnosis["culprits"][0]["state"], "no-record");
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
