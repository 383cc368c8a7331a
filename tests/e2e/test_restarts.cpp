// Automatic restarts (launch/local.sh --max-restarts, launch/restarts.sh): a 2-rank pipeline run
// with a checkpoint every 5 steps is killed a dozen times at random moments (SIGKILL of one rank,
// SIGTERM of every rank, a frozen rank) and still reaches its last step with weights and Adam
// moments bit-identical to an uninterrupted run, every checkpoint verifying and every restart
// logged (restarts.jsonl, the report's panel); a rank frozen at start-up ends its job too; a run
// given bad input is not restarted.
#include <fmt/format.h>
#include <signal.h>

#include <random>

#include "checkpoint/reader.h"
#include "e2e_test.h"
#include "report/report.h"
#include "train/run_files.h"

namespace tripod {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using test::slurp;

// 2 layers of width 64 over 32 tokens, pp = 2 (one layer per rank), 180 steps of 8 sequences: small
// enough for the suite (the soak stretches each step to 25 ms so that faults land mid-run).
const test::ConfigOverrides kSoak = {{"parallel.pp", "2"},          {"parallel.timeout_s", "2"},
                                     {"model.d_model", "64"},       {"model.seq_len", "32"},
                                     {"train.steps", "180"},        {"train.warmup_steps", "5"},
                                     {"train.trace", "false"},      {"checkpoint.interval", "5"}};

// The pid of the `tripod train` process of world rank `rank` whose command line holds `marker`.
pid_t find_rank(const std::string& marker, int rank) {
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmd = slurp(e.path() / "cmdline"), env = slurp(e.path() / "environ");
    std::replace(cmd.begin(), cmd.end(), '\0', ' ');
    if (cmd.find(" train ") == std::string::npos || cmd.find(marker) == std::string::npos) continue;
    if (cmd.find("mpirun") != std::string::npos || cmd.find("local.sh") != std::string::npos) continue;
    if (env.find(std::string("OMPI_COMM_WORLD_RANK=") + std::to_string(rank) + '\0') != std::string::npos)
      return static_cast<pid_t>(std::stol(name));
  }
  return -1;
}

// Every stored state of every tensor, whole.
std::map<std::string, std::vector<float>> state(const std::string& dir) {
  CheckpointReader r(dir);
  std::map<std::string, std::vector<float>> out;
  for (const auto& [name, shape] : r.tensors())
    for (StateKind k : {StateKind::Value, StateKind::M, StateKind::V}) {
      if (!r.has_kind(k)) continue;
      auto& v = out[name + "/" + state_kind_name(k)];
      v.resize(shape_numel(shape));
      PieceGeom whole{.global_shape = shape, .shard_dim = -1, .box_offset = 0, .box_size = shape[0],
                      .flat_begin = 0, .flat_end = shape_numel(shape)};
      r.assemble(name, k, {{whole, v.data()}});
    }
  return out;
}

// `launch/local.sh 2 CONFIG ARGS` as the test runs it: the test's own MPI variables dropped.
std::string local_sh(const std::string& args) {
  std::string env = test::mpirun(2);
  env = env.substr(0, env.find(" mpirun "));
  return env + " TRIPOD=" + test::tripod_bin() + " " + TRIPOD_SOURCE_PATH + "/launch/local.sh " + args;
}

// Every process whose command line holds `marker` (a test's own folder): the launcher, mpirun and
// the ranks of its runs.
std::vector<pid_t> processes_with(const std::string& marker) {
  std::vector<pid_t> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos || std::stol(name) == ::getpid()) continue;
    std::string cmd = slurp(e.path() / "cmdline");
    std::replace(cmd.begin(), cmd.end(), '\0', ' ');
    if (cmd.find(marker) != std::string::npos) out.push_back(static_cast<pid_t>(std::stol(name)));
  }
  return out;
}

// At the end of a test, passed or failed, no process of its runs is left: a frozen (SIGSTOPped)
// rank would otherwise outlive it, and so would the mpirun waiting for it. SIGKILL ends a stopped
// process too.
struct KillLeftovers {
  std::string marker;
  ~KillLeftovers() {
    for (int round = 0; round < 3; ++round) {
      const std::vector<pid_t> left = processes_with(marker);
      if (left.empty()) return;
      for (pid_t p : left) kill(p, SIGKILL);
      std::this_thread::sleep_for(200ms);
    }
  }
};

int64_t last_logged(const fs::path& run) {
  const auto l = test::losses(run);
  return l.empty() ? 0 : l.rbegin()->first;
}

class Restarts : public test::E2eTest {};

TEST_F(Restarts, SoakOfKillsReachesTheLastStepBitIdentically) {
  const fs::path cfg = write_config(kSoak);
  const std::string full = (dir_ / "full").string();
  auto r = test::run_tripod(
      fmt::format("train --config {} --set train.output_dir={}/run --set checkpoint.dir={}/ck", cfg.string(), full, full),
      {.np = 2});
  ASSERT_EQ(r.status, 0) << r.err;

  const fs::path run = dir_ / "run", ck = dir_ / "ck";
  // Every step takes at least 25 ms (a test hook): on an idle machine this model's steps take a
  // few ms, and a restarted attempt would run to the end before the test sees its step.
  test::Background job("env TRIPOD_TEST_STEP_SLEEP_MS=25 " +
                       local_sh(fmt::format("2 {} --max-restarts 20 --restart-backoff 0.2 --set train.output_dir={} "
                                            "--set checkpoint.dir={}",
                                            cfg.string(), run.string(), ck.string())),
                       dir_ / "log");
  const KillLeftovers leftovers{dir_.string()};
  std::mt19937 rng(26);
  const char* kinds[] = {"sigkill", "sigterm", "freeze"};
  std::vector<std::string> done;
  // Faults at increasing progress: once the current attempt has logged a step (its signal
  // handlers are in place) and the run has reached step 6, 12, ..., 72 (of 180: a loaded machine's
  // test may see a fault's moment late), plus up to 150 ms
  // (a random moment within a step or a save). "The current attempt": the ranks running now, and
  // a metrics line written since they were first seen (the attempt a stop signal ended writes its
  // last line after the signal, and the launcher starts the next one within a second).
  auto lines = [&] { return test::metrics(run).size(); };
  std::vector<pid_t> attempt;      // the current attempt's ranks
  size_t lines_at_attempt = 0;     // metrics lines when they were first seen
  for (int i = 0; i < 12; ++i) {
    const int64_t target = 6 * (i + 1);
    const auto t0 = std::chrono::steady_clock::now();
    for (;;) {
      ASSERT_FALSE(job.wait(0)) << "the job ended before fault " << i << ":\n" << job.log();
      ASSERT_LT(std::chrono::steady_clock::now() - t0, 120s) << "no progress to step " << target << ":\n" << job.log();
      const std::vector<pid_t> now = {find_rank(run.string(), 0), find_rank(run.string(), 1)};
      if (now != attempt) {  // a new attempt (or one between its ranks' starts)
        attempt = now;
        lines_at_attempt = lines();
      } else if (now[0] > 0 && now[1] > 0 && lines() > lines_at_attempt && last_logged(run) >= target) {
        break;
      }
      std::this_thread::sleep_for(20ms);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(std::uniform_int_distribution<int>(0, 150)(rng)));
    const std::string kind = kinds[i % 3];
    const int victim = std::uniform_int_distribution<int>(0, 1)(rng);
    std::vector<pid_t> pids = {find_rank(run.string(), 0), find_rank(run.string(), 1)};
    if (pids != attempt) {  // the attempt ended meanwhile: the next fault comes later
      --i;
      continue;
    }
    // The world stops first (a small run's steps take milliseconds: it must not run on to its
    // end while the fault is being dealt), then the fault, then the world goes on.
    for (pid_t p : pids) kill(p, SIGSTOP);
    if (kind == "sigkill") kill(pids[victim], SIGKILL);
    if (kind == "sigterm")
      for (pid_t p : pids) kill(p, SIGTERM);
    for (int r = 0; r < 2; ++r)
      if (kind != "freeze" || r != victim) kill(pids[r], SIGCONT);
    done.push_back(fmt::format("{} of rank {} after step {}", kind, victim, last_logged(run)));
    // The next fault waits for this attempt to end: its rank processes gone.
    const auto t1 = std::chrono::steady_clock::now();
    while (find_rank(run.string(), 0) == pids[0] || find_rank(run.string(), 1) == pids[1]) {
      ASSERT_LT(std::chrono::steady_clock::now() - t1, 60s) << "attempt did not end after " << done.back();
      std::this_thread::sleep_for(20ms);
    }
  }
  const std::optional<int> status = job.wait(240);
  ASSERT_TRUE(status.has_value()) << "the job did not finish:\n" << job.log();
  EXPECT_EQ(*status, 0) << job.log();
  const std::string log = job.log();
  std::string faults;
  for (const auto& f : done) faults += f + "\n";

  // Bit-identical to the uninterrupted run: every step's loss and the final weights and moments.
  EXPECT_EQ(test::losses(run), test::losses(fs::path(full) / "run")) << faults;
  EXPECT_TRUE(state((ck / "iter_0000180").string()) == state(full + "/ck/iter_0000180"))
      << "weights or Adam moments differ from the uninterrupted run after:\n" << faults;
  // Every checkpoint verifies.
  int checkpoints = 0;
  for (const auto& e : fs::directory_iterator(ck)) {
    // (iter_N.tmp: a save a fault interrupted, never committed; the next save removes it.)
    if (!e.is_directory() || e.path().filename().string().rfind("iter_", 0) != 0 || e.path().extension() == ".tmp")
      continue;
    ++checkpoints;
    const auto v = test::run_tripod("ckpt verify " + e.path().string());
    EXPECT_EQ(v.status, 0) << e.path() << ":\n" << v.out << v.err;
  }
  EXPECT_GE(checkpoints, 36);  // every 5 steps of 180
  // Every restart logged, with its cause, and shown in the report.
  const auto restarts = read_restarts((run / "restarts.jsonl").string());
  EXPECT_EQ(restarts.size(), 12u) << slurp(run / "restarts.jsonl") << faults << log;
  int timeouts = 0, killed = 0, stopped = 0, unresponsive = 0;
  int64_t resumed = 0;
  for (size_t i = 0; i < restarts.size(); ++i) {
    const RestartRecord& rr = restarts[i];
    EXPECT_EQ(rr.attempt, static_cast<int64_t>(i + 1));
    // From a committed checkpoint (every 5 steps, or a stop signal's save), never backwards.
    EXPECT_GE(rr.resumed_from_step, resumed);
    resumed = rr.resumed_from_step;
    EXPECT_TRUE(fs::is_directory(ck / fmt::format("iter_{:07d}", rr.resumed_from_step))) << rr.resumed_from_step;
    EXPECT_GE(rr.time_lost_s, 0);
    timeouts += rr.cause == "communication timeout";
    killed += rr.cause.rfind("a rank was killed", 0) == 0;
    stopped += rr.cause == "stopped by a signal before its last step";
    unresponsive += rr.cause.find("stopped responding (no heartbeat for") != std::string::npos;
  }
  EXPECT_EQ(stopped, 4) << slurp(run / "restarts.jsonl");
  // A frozen rank ends its attempt by its peer's communication timeout, or by the launcher's
  // watchdog when the peer had nothing left to wait for.
  EXPECT_EQ(timeouts + killed + unresponsive, 8) << slurp(run / "restarts.jsonl");
  EXPECT_GE(timeouts, 1) << slurp(run / "restarts.jsonl");
  const std::string html = render_report(run.string());
  EXPECT_NE(html.find("<h2>Restarts</h2>"), std::string::npos);
  EXPECT_NE(html.find("12 automatic restart(s)"), std::string::npos);
}

// A rank frozen while the job starts, before any step (in MPI_Init or the communicators' creation,
// which wait with no timeout of their own), still ends the job: the other rank gives up after
// parallel.timeout_s (at least 30 s there) with one error line, mpirun kills the frozen rank, and
// no process is left.
TEST_F(Restarts, ARankFrozenAtStartUpEndsTheJob) {
  const fs::path cfg = write_config(kSoak);
  const fs::path run = dir_ / "run";
  test::Background job(
      local_sh(fmt::format("2 {} --set train.output_dir={} --set checkpoint.dir={}", cfg.string(), run.string(),
                           (dir_ / "ck").string())),
      dir_ / "log");
  const KillLeftovers leftovers{dir_.string()};
  pid_t frozen = -1;
  const auto t0 = std::chrono::steady_clock::now();
  while ((frozen = find_rank(run.string(), 1)) <= 0) {  // rank 1, as soon as it exists
    ASSERT_FALSE(job.wait(0)) << job.log();
    ASSERT_LT(std::chrono::steady_clock::now() - t0, 60s) << "rank 1 did not start:\n" << job.log();
  }
  kill(frozen, SIGSTOP);
  const std::optional<int> status = job.wait(120);
  ASSERT_TRUE(status.has_value()) << "the job did not end with rank 1 frozen:\n" << job.log();
  EXPECT_NE(*status, 0) << job.log();
  EXPECT_NE(job.log().find("did not complete within"), std::string::npos) << job.log();
  // Nothing outlives the job, the frozen rank included.
  for (int i = 0; i < 50 && !processes_with(dir_.string()).empty(); ++i) std::this_thread::sleep_for(100ms);
  EXPECT_TRUE(processes_with(dir_.string()).empty()) << "left running after the job ended";
}

// A rank frozen after its peer has finished, which no peer can notice (nothing is left to wait
// for) and mpirun would wait for forever: the launcher's watchdog sees its heartbeat stop, kills
// it, and the restart resumes from the last checkpoint and ends the run. Every rank lingers 3 s
// after MPI_Finalize (a test hook), and rank 0 is frozen then.
TEST_F(Restarts, ARankFrozenAfterItsPeerFinishedIsKilledAndTheRunEnds) {
  test::ConfigOverrides short_run = kSoak;
  short_run.push_back({"train.steps", "10"});
  const fs::path cfg = write_config(short_run);
  const fs::path run = dir_ / "run", status = dir_ / "launch_status";
  test::Background job("env TRIPOD_TEST_EXIT_LINGER_MS=3000 TRIPOD_LAUNCH_STATUS=" + status.string() + " " +
                           local_sh(fmt::format("2 {} --max-restarts 1 --restart-backoff 0.2 --set train.output_dir={} "
                                                "--set checkpoint.dir={}",
                                                cfg.string(), run.string(), (dir_ / "ck").string())),
                       dir_ / "log");
  const KillLeftovers leftovers{dir_.string()};
  const auto t0 = std::chrono::steady_clock::now();
  while (slurp(status).find("\"finished\"") == std::string::npos) {
    ASSERT_FALSE(job.wait(0)) << job.log();
    ASSERT_LT(std::chrono::steady_clock::now() - t0, 120s) << "the run did not finish:\n" << job.log();
    std::this_thread::sleep_for(20ms);
  }
  std::this_thread::sleep_for(1s);  // MPI_Finalize is behind both ranks: they linger
  const pid_t frozen = find_rank(run.string(), 0);
  ASSERT_GT(frozen, 0) << job.log();
  kill(frozen, SIGSTOP);
  const std::optional<int> rc = job.wait(120);
  ASSERT_TRUE(rc.has_value()) << "the job did not end with rank 0 frozen:\n" << job.log();
  EXPECT_EQ(*rc, 0) << job.log();
  EXPECT_NE(job.log().find("tripod launch: rank 0 stopped responding (no heartbeat for"), std::string::npos) << job.log();
  const auto restarts = read_restarts((run / "restarts.jsonl").string());
  ASSERT_EQ(restarts.size(), 1u) << slurp(run / "restarts.jsonl");
  EXPECT_EQ(restarts[0].resumed_from_step, 10);
  EXPECT_EQ(restarts[0].cause.rfind("rank 0 stopped responding", 0), 0u) << restarts[0].cause;
  EXPECT_EQ(test::losses(run).size(), 10u);
  EXPECT_FALSE(fs::exists(fs::path(status.string() + ".rank0")));  // the launcher cleans up
}

TEST_F(Restarts, BadInputIsNotRestarted) {
  const fs::path cfg = write_config({{"train.no_such_key", "1"}});
  const auto r = test::run_cmd(local_sh("2 " + cfg.string() + " --max-restarts 3 --restart-backoff 0 --set train.output_dir=" +
                                        (dir_ / "run").string()),
                               120);
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_EQ(test::count_lines_starting(r.err, "error: "), 1) << r.err;
  EXPECT_NE(r.err.find("train.no_such_key"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("bad input (exit status 2): not restarting"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("restart 1 of"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir_ / "run" / "restarts.jsonl"));
}

// slurm.sbatch --max-restarts N --requeue: a failed run asks Slurm to requeue the job (scontrol
// requeue), and the requeued job (SLURM_RESTART_COUNT = 1) resumes from the latest checkpoint
// with the restart's cause passed to the ranks. srun and scontrol are stand-ins that record
// their arguments and environment.
TEST_F(Restarts, SlurmRequeuesAFailedJobAndTheRequeuedJobResumes) {
  const fs::path ck = dir_ / "ck";
  fs::create_directories(ck);
  test::write_file(ck / "latest", "iter_0000005\n");
  test::write_file(dir_ / "c.toml", "[model]\n");
  // srun: records its arguments and TRIPOD_RESTART_*, reports the run's checkpoint folder, and
  // fails on the first job (no restart yet), succeeds on the requeued one.
  test::write_file(dir_ / "srun", fmt::format(R"(#!/bin/sh
echo "args: $*" >> {0}/srun.log
env | grep '^TRIPOD_RESTART_' | sort >> {0}/srun.log
echo '{{"output_dir":"{0}/run","checkpoint_dir":"{1}","state":"running","step":7}}' > "$TRIPOD_LAUNCH_STATUS"
[ -n "$TRIPOD_RESTART_ATTEMPT" ] || exit 1
echo '{{"output_dir":"{0}/run","checkpoint_dir":"{1}","state":"finished","step":9}}' > "$TRIPOD_LAUNCH_STATUS"
)",
                                             dir_.string(), ck.string()));
  test::write_file(dir_ / "scontrol", "#!/bin/sh\necho \"scontrol $*\" >> " + (dir_ / "srun.log").string() + "\n");
  fs::permissions(dir_ / "srun", fs::perms::owner_all);
  fs::permissions(dir_ / "scontrol", fs::perms::owner_all);
  const std::string env = fmt::format(
      "env -u TRIPOD_LAUNCH_STATUS SRUN={0}/srun SCONTROL={0}/scontrol TRIPOD={1} SLURM_JOB_ID=77 SLURM_SUBMIT_DIR={0} "
      "SLURM_JOB_NUM_NODES=1 SLURM_NTASKS_PER_NODE=2 ",
      dir_.string(), test::tripod_bin());
  const std::string sbatch = std::string(TRIPOD_SOURCE_PATH) + "/launch/slurm.sbatch --max-restarts 2 --requeue c.toml";
  auto r = test::run_cmd(env + "SLURM_RESTART_COUNT=0 " + sbatch, 60);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("crash (exit status 1); requeueing job 77 (restart 1 of 2)"), std::string::npos) << r.err;
  std::string log = slurp(dir_ / "srun.log");
  EXPECT_NE(log.find("scontrol requeue 77"), std::string::npos) << log;
  EXPECT_EQ(log.find("checkpoint.load=latest"), std::string::npos) << log;
  r = test::run_cmd(env + "SLURM_RESTART_COUNT=1 " + sbatch, 60);
  EXPECT_EQ(r.status, 0) << r.err;
  log = slurp(dir_ / "srun.log");
  EXPECT_NE(log.find("c.toml --set checkpoint.load=latest"), std::string::npos) << log;
  EXPECT_NE(log.find("TRIPOD_RESTART_ATTEMPT=1"), std::string::npos) << log;
  EXPECT_NE(log.find("TRIPOD_RESTART_CAUSE=crash\n"), std::string::npos) << log;
  EXPECT_EQ(log.find("scontrol requeue 77", log.find("scontrol requeue 77") + 1), std::string::npos) << log;
  // Done: the state kept across requeues is removed.
  EXPECT_FALSE(fs::exists(dir_ / ".tripod_restart.77"));
  EXPECT_FALSE(fs::exists(dir_ / ".tripod_launch.77"));
}

// The launcher's own option errors are bad input too.
TEST_F(Restarts, MaxRestartsMustBeAWholeNumber) {
  const fs::path cfg = write_config();
  const auto r = test::run_cmd(local_sh("2 " + cfg.string() + " --max-restarts many"), 60);
  test::expect_refused(r, "--max-restarts must be a whole number >= 0, got 'many'");
}

}  // namespace
}  // namespace tripod
