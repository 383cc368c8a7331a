// Launching: the scripts under launch/ (arguments, the mpirun/srun command they build, a real
// one-node run), and a multi-host run on one machine: two network namespaces as hosts, Open MPI
// over TCP between them, a (dp, pp, tp) = (2, 2, 2) training whose losses match one process's.
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <sched.h>
#include <unistd.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "cli_util.h"

namespace tripod {
namespace {

namespace fs = std::filesystem;
using test::run_cmd;

const char* kTiny = R"([model]
n_layers = 4
n_heads = 4
d_model = 32
seq_len = 16
vocab_size = 64
[train]
micro_batch_size = 2
global_batch_size = 8
steps = 3
log_interval = 1
lr = 1e-3
[data]
synthetic = true
)";

std::string script(const std::string& name) { return std::string(TRIPOD_SOURCE_PATH) + "/launch/" + name; }

// `env` without the MPI variables of this (singleton MPI) test process, plus `vars`.
std::string clean_env(const std::string& vars = "") {
  std::string unset;
  for (char** e = environ; *e; ++e) {
    std::string kv(*e);
    for (const char* p : {"OMPI_", "PMIX_", "ORTE_", "OPAL_", "SLURM_", "NCCL_", "TRIPOD_"})
      if (kv.rfind(p, 0) == 0) unset += " -u " + kv.substr(0, kv.find('='));
  }
  return "env" + unset + " TRIPOD=" + test::tripod_bin() + " " + vars + " ";
}

std::vector<double> losses(const fs::path& metrics) {
  std::vector<double> out;
  std::ifstream in(metrics);
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line).at("loss").get<double>());
  return out;
}

int cpus() {
  cpu_set_t set;
  return sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
}

TEST(Launch, HelpAndBadArgumentsFailWithOneErrorLine) {
  auto dir = test::scratch_dir("launch_args");
  test::write_file(dir / "c.toml", kTiny);
  test::write_file(dir / "hosts", "# nodes\nnode01 slots=8\nnode02 slots=8");  // no final newline
  test::write_file(dir / "empty", "# no hosts yet\n\n");
  const std::string cfg = (dir / "c.toml").string(), hosts = (dir / "hosts").string();
  for (const char* s : {"local.sh", "multinode.sh", "slurm.sbatch"}) {
    auto r = run_cmd(clean_env() + script(s) + " --help");
    EXPECT_EQ(r.status, 0) << s << ": " << r.err;
    EXPECT_NE(r.out.find("usage: "), std::string::npos) << s << ": " << r.out;
  }
  struct Case {
    std::string cmd, expect;
  };
  for (const Case& c : std::vector<Case>{
           {script("local.sh"), "expected NPROCS and CONFIG"},
           {script("local.sh") + " two " + cfg, "NPROCS must be a whole number >= 1, got 'two'"},
           {script("local.sh") + " 0 " + cfg, "NPROCS must be a whole number >= 1, got '0'"},
           {script("local.sh") + " 2 " + (dir / "missing.toml").string(), "config file '" + (dir / "missing.toml").string() + "' does not exist"},
           {"THREADS_PER_RANK=x " + script("local.sh") + " 2 " + cfg, "THREADS_PER_RANK must be a whole number"},
           {"TRIPOD_COMMAND=report " + script("local.sh") + " 2 " + cfg, "TRIPOD_COMMAND must be train, eval or generate, got 'report'"},
           {"TRIPOD=" + (dir / "nope").string() + " " + script("local.sh") + " 2 " + cfg, "tripod executable '" + (dir / "nope").string() + "' not found"},
           {script("multinode.sh") + " " + hosts + " 4", "expected HOSTFILE, NPROCS and CONFIG"},
           {script("multinode.sh") + " " + (dir / "nohosts").string() + " 4 " + cfg, "hostfile '" + (dir / "nohosts").string() + "' does not exist"},
           {script("multinode.sh") + " " + hosts + " 4x " + cfg, "NPROCS must be a whole number >= 1, got '4x'"},
           {script("multinode.sh") + " " + hosts + " 4 " + (dir / "missing.toml").string(), "config file"},
           {script("multinode.sh") + " " + hosts + " 17 " + cfg, "NPROCS = 17 exceeds the 16 slots (GPUs) of the 2 host(s)"},
           {script("multinode.sh") + " " + (dir / "empty").string() + " 1 " + cfg, "names no host"},
           {script("multinode.sh") + " " + cfg + " 1 " + cfg, "line 1: '[model] ' is not 'HOST [slots=N] [max_slots=N]'"},
           {script("slurm.sbatch") + " " + cfg, "not inside a Slurm job"},
           {script("slurm.sbatch"), "expected CONFIG"},
           {"SLURM_JOB_ID=7 SLURM_SUBMIT_DIR=" + dir.string() + " " + script("slurm.sbatch") + " missing.toml", "config file 'missing.toml' does not exist"},
           {"SLURM_JOB_ID=7 SLURM_SUBMIT_DIR=" + dir.string() + " SLURM_JOB_NUM_NODES=2 " + script("slurm.sbatch") + " c.toml", "no tasks per node from Slurm"},
       }) {
    // `env` applies the leading VAR=value words.
    auto r = run_cmd(clean_env() + c.cmd);
    EXPECT_EQ(r.status, 2) << c.cmd << ": " << r.err;
    EXPECT_EQ(test::count_lines_starting(r.err, "error: "), 1) << c.cmd << ": " << r.err;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << c.cmd << ": " << r.err;
  }
  fs::remove_all(dir);
}

TEST(Launch, LocalSizesThreadsAndBindingToTheCores) {
  auto dir = test::scratch_dir("launch_local");
  test::write_file(dir / "c.toml", kTiny);
  const std::string cfg = (dir / "c.toml").string();
  const int n = cpus();
  const bool root = ::geteuid() == 0;
  // As many ranks as cores: one thread each, each bound to its own.
  auto r = run_cmd(clean_env("TRIPOD_LAUNCH_ECHO=1") + script("local.sh") + fmt::format(" {} ", n) + cfg +
                   " --set train.steps=2");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 mpirun -np " + std::to_string(n)), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("--map-by slot:PE=1 --bind-to hwthread"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("--oversubscribe"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("--allow-run-as-root") != std::string::npos, root) << r.out;
  EXPECT_NE(r.out.find(test::tripod_bin() + " train --config " + cfg + " --set train.steps=2"), std::string::npos)
      << r.out;
  // One rank: every core.
  r = run_cmd(clean_env("TRIPOD_LAUNCH_ECHO=1") + script("local.sh") + " 1 " + cfg);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find(fmt::format("OMP_NUM_THREADS={} ", n)), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(fmt::format("--map-by slot:PE={} ", n)), std::string::npos) << r.out;
  // More ranks than cores: oversubscribed, unbound, one thread each.
  r = run_cmd(clean_env("TRIPOD_LAUNCH_ECHO=1") + script("local.sh") + fmt::format(" {} ", 2 * n + 1) + cfg);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("OMP_NUM_THREADS=1 "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--oversubscribe --bind-to none"), std::string::npos) << r.out;
  fs::remove_all(dir);
}

TEST(Launch, LocalRunsAPipelineTraining) {
  auto dir = test::scratch_dir("launch_run");
  test::write_file(dir / "c.toml", kTiny);
  auto r = run_cmd(clean_env() + script("local.sh") + " 2 " + (dir / "c.toml").string() +
                   " --set parallel.pp=2 --set train.output_dir=" + (dir / "run").string());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("grid (dp=1, pp=2, tp=1)"), std::string::npos) << r.err;
  EXPECT_EQ(losses(dir / "run" / "metrics.jsonl").size(), 3u);
  // A bad config still fails the tripod way through the launcher.
  r = run_cmd(clean_env() + script("local.sh") + " 2 " + (dir / "c.toml").string() + " --set parallel.tp=3");
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_EQ(test::count_lines_starting(r.err, "error: "), 1) << r.err;
  fs::remove_all(dir);
}

TEST(Launch, MultinodeMapsRanksToSlotsAndPassesTheEnvironment) {
  auto dir = test::scratch_dir("launch_multi");
  test::write_file(dir / "c.toml", kTiny);
  test::write_file(dir / "hosts", "node01 slots=8\nnode02 slots=8\n");
  auto r = run_cmd(clean_env("TRIPOD_LAUNCH_ECHO=1 NCCL_DEBUG=INFO NCCL_IB_HCA=mlx5 CUDA_VISIBLE_DEVICES=0,1 "
                             "TRIPOD_IFACE=ib0") +
                   script("multinode.sh") + " " + (dir / "hosts").string() + " 16 " + (dir / "c.toml").string() +
                   " --set parallel.pp=2");
  ASSERT_EQ(r.status, 0) << r.err;
  for (const char* want : {"--hostfile ", " -np 16 --map-by slot --bind-to none", "--mca btl_tcp_if_include ib0",
                           "--mca oob_tcp_if_include ib0", "-x NCCL_DEBUG", "-x NCCL_IB_HCA", "-x NCCL_SOCKET_IFNAME",
                           "-x CUDA_VISIBLE_DEVICES", "-x OMP_NUM_THREADS", "-x OPENBLAS_NUM_THREADS", "-x PATH",
                           " train --config "})
    EXPECT_NE(r.out.find(want), std::string::npos) << want << " missing in " << r.out;
  EXPECT_NE(r.out.find("--set parallel.pp=2"), std::string::npos) << r.out;
  // A subnet restricts MPI only: NCCL takes interface names.
  r = run_cmd(clean_env("TRIPOD_LAUNCH_ECHO=1 TRIPOD_IFACE=10.0.0.0/16") + script("multinode.sh") + " " +
              (dir / "hosts").string() + " 8 " + (dir / "c.toml").string());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("--mca btl_tcp_if_include 10.0.0.0/16"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("NCCL_SOCKET_IFNAME"), std::string::npos) << r.out;
  fs::remove_all(dir);
}

TEST(Launch, SlurmTakesNodesTasksAndGpusFromSlurm) {
  auto dir = test::scratch_dir("launch_slurm");
  test::write_file(dir / "c.toml", kTiny);
  std::ifstream in(script("slurm.sbatch"));
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_NE(text.str().find("\n#SBATCH --signal=USR1@120\n"), std::string::npos);
  const std::string slurm = "TRIPOD_LAUNCH_ECHO=1 SLURM_JOB_ID=42 SLURM_SUBMIT_DIR=" + dir.string() +
                            " SLURM_JOB_NUM_NODES=4 SLURM_CPUS_PER_TASK=12 ";
  auto r = run_cmd(clean_env(slurm + "SLURM_NTASKS_PER_NODE=8 SLURM_GPUS_ON_NODE=8") + script("slurm.sbatch") +
                   " c.toml --set parallel.pp=4");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("srun --mpi=pmix --nodes=4 --ntasks=32 --ntasks-per-node=8 --kill-on-bad-exit=1"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find(test::tripod_bin() + " train --config c.toml --set parallel.pp=4"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("4 node(s) x 8 task(s) = 32 ranks, 8 GPU(s) per node"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("warning"), std::string::npos) << r.err;
  // Slurm's other spellings: "8(x4)" tasks, typed GPUs; a task count that misses the GPUs warns.
  r = run_cmd(clean_env(slurm + "SLURM_TASKS_PER_NODE='4(x4)' SLURM_GPUS_PER_NODE=h100:8") + script("slurm.sbatch") +
              " c.toml");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("--ntasks=16 --ntasks-per-node=4"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("warning: 4 tasks per node but 8 GPUs per node"), std::string::npos) << r.err;
  fs::remove_all(dir);
}

// Two hosts made of network namespaces; skips where namespaces cannot be made (not root, no
// iproute2, a container without CAP_NET_ADMIN).
TEST(MultiHost, TrainsAcrossTwoNamespacesOverTcpLikeOneProcess) {
  auto dir = test::scratch_dir("multihost");
  test::write_file(dir / "c.toml", kTiny);
  const std::string cfg = (dir / "c.toml").string();
  auto r = run_cmd(clean_env() + std::string(TRIPOD_SOURCE_PATH) + "/tests/e2e/multihost_netns.sh " + dir.string() +
                   " 8 " + cfg + " --set parallel.tp=2 --set parallel.pp=2 --set train.output_dir=" +
                   (dir / "multi").string());
  if (r.status == 77) {
    fs::remove_all(dir);
    GTEST_SKIP() << "network namespaces unavailable: " << r.err;
  }
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_LT(r.seconds, 60.0);
  // The map: ranks 0-3 on host a (where mpirun runs, named by its hostname), 4-7 on host b.
  const std::string all = r.out + r.err;
  EXPECT_NE(all.find(" Data for node: mh-host-a\tNum slots: 4\tMax slots: 0\tNum procs: 4"), std::string::npos) << all;
  EXPECT_NE(all.find(" Data for node: 198.18.0.2\tNum slots: 4\tMax slots: 0\tNum procs: 4"), std::string::npos) << all;
  EXPECT_EQ(test::count_lines_starting(all, " Data for node: "), 2) << all;
  EXPECT_NE(r.err.find("grid (dp=2, pp=2, tp=2)"), std::string::npos) << r.err;
  // Activations, gradients and the loss crossed the veth link (pipeline stage 0 on host a,
  // stage 1 on host b).
  auto pos = r.out.find("veth bytes: ");
  ASSERT_NE(pos, std::string::npos) << r.out;
  EXPECT_GT(std::stoll(r.out.substr(pos + 12)), 100000) << r.out;
  // Nothing left behind.
  auto ls = run_cmd("ip netns list");
  EXPECT_EQ(ls.out.find(fmt::format("tripodmh")), std::string::npos) << ls.out;

  r = run_cmd(clean_env() + test::tripod_bin() + " train --config " + cfg + " --set train.output_dir=" +
              (dir / "single").string());
  ASSERT_EQ(r.status, 0) << r.err;
  auto multi = losses(dir / "multi" / "metrics.jsonl"), single = losses(dir / "single" / "metrics.jsonl");
  ASSERT_EQ(single.size(), 3u);
  ASSERT_EQ(multi.size(), single.size());
  for (size_t i = 0; i < single.size(); ++i)
    EXPECT_NEAR(multi[i], single[i], 1e-5 * std::fabs(single[i])) << "step " << i + 1;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tripod
