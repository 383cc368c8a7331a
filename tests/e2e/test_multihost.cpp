// Launching: the scripts under launch/ (arguments, the mpirun/srun command they build, a real
// one-node run), and a multi-host run on one machine: two network namespaces as hosts, Open MPI
// over TCP between them, a (dp, pp, tp) = (2, 2, 2) training whose losses match one process's.
#include <fmt/format.h>
#include <sched.h>
#include <unistd.h>

#include <cmath>

#include "e2e_test.h"

namespace tripod {
namespace {

namespace fs = std::filesystem;
using test::run_cmd;

// Four layers, so that the (2, 2, 2) grid has a pipeline of two stages of two.
const test::ConfigOverrides kConfig = {{"model.n_layers", "4"}, {"train.lr", "1e-3"}};

class Launch : public test::E2eTest {
 protected:
  void SetUp() override {
    E2eTest::SetUp();
    cfg_ = write_config(kConfig).string();
  }
  std::string cfg_;
};
using MultiHost = Launch;

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

int cpus() {
  cpu_set_t set;
  return sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
}

TEST_F(Launch, HelpAndBadArgumentsFailWithOneErrorLine) {
  test::write_file(dir_ / "hosts", "# nodes\nnode01 slots=8\nnode02 slots=8");  // no final newline
  test::write_file(dir_ / "empty", "# no hosts yet\n\n");
  const std::string hosts = (dir_ / "hosts").string();
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
           {script("local.sh") + " two " + cfg_, "NPROCS must be a whole number >= 1, got 'two'"},
           {script("local.sh") + " 0 " + cfg_, "NPROCS must be a whole number >= 1, got '0'"},
           {script("local.sh") + " 2 " + (dir_ / "missing.toml").string(),
            "config file '" + (dir_ / "missing.toml").string() + "' does not exist"},
           {"THREADS_PER_RANK=x " + script("local.sh") + " 2 " + cfg_, "THREADS_PER_RANK must be a whole number"},
           {"TRIPOD_COMMAND=report " + script("local.sh") + " 2 " + cfg_,
            "TRIPOD_COMMAND must be train, eval or generate, got 'report'"},
           {"TRIPOD=" + (dir_ / "nope").string() + " " + script("local.sh") + " 2 " + cfg_,
            "tripod executable '" + (dir_ / "nope").string() + "' not found"},
           {script("multinode.sh") + " " + hosts + " 4", "expected HOSTFILE, NPROCS and CONFIG"},
           {script("multinode.sh") + " " + (dir_ / "nohosts").string() + " 4 " + cfg_,
            "hostfile '" + (dir_ / "nohosts").string() + "' does not exist"},
           {script("multinode.sh") + " " + hosts + " 4x " + cfg_, "NPROCS must be a whole number >= 1, got '4x'"},
           {script("multinode.sh") + " " + hosts + " 4 " + (dir_ / "missing.toml").string(), "config file"},
           {script("multinode.sh") + " " + hosts + " 17 " + cfg_,
            "NPROCS = 17 exceeds the 16 slots (GPUs) of the 2 host(s)"},
           {script("multinode.sh") + " " + (dir_ / "empty").string() + " 1 " + cfg_, "names no host"},
           {script("multinode.sh") + " " + cfg_ + " 1 " + cfg_,
            "line 1: '[model] ' is not 'HOST [slots=N] [max_slots=N]'"},
           {script("slurm.sbatch") + " " + cfg_, "not inside a Slurm job"},
           {script("slurm.sbatch"), "expected CONFIG"},
           {"SLURM_JOB_ID=7 SLURM_SUBMIT_DIR=" + dir_.string() + " " + script("slurm.sbatch") + " missing.toml",
            "config file 'missing.toml' does not exist"},
           {"SLURM_JOB_ID=7 SLURM_SUBMIT_DIR=" + dir_.string() + " SLURM_JOB_NUM_NODES=2 " + script("slurm.sbatch") +
                " c.toml",
            "no tasks per node from Slurm"},
       }) {
    SCOPED_TRACE(c.cmd);
    test::expect_refused(run_cmd(clean_env() + c.cmd), c.expect);  // `env` applies the leading VAR=value words
  }
}

TEST_F(Launch, LocalSizesThreadsAndBindingToTheCores) {
  const int n = cpus();
  const bool root = ::geteuid() == 0;
  // As many ranks as cores: one thread each, each bound to its own.
  auto r = run_cmd(clean_env("TRIPOD_LAUNCH_ECHO=1") + script("local.sh") + fmt::format(" {} ", n) + cfg_ +
                   " --set train.steps=2");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 mpirun -np " + std::to_string(n)), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("--map-by slot:PE=1 --bind-to hwthread"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("--oversubscribe"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("--allow-run-as-root") != std::string::npos, root) << r.out;
  EXPECT_NE(r.out.find(test::tripod_bin() + " train --config " + cfg_ + " --set train.steps=2"), std::string::npos)
      << r.out;
  // One rank: every core.
  r = run_cmd(clean_env("TRIPOD_LAUNCH_ECHO=1") + script("local.sh") + " 1 " + cfg_);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find(fmt::format("OMP_NUM_THREADS={} ", n)), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(fmt::format("--map-by slot:PE={} ", n)), std::string::npos) << r.out;
  // More ranks than cores: oversubscribed, unbound, one thread each.
  r = run_cmd(clean_env("TRIPOD_LAUNCH_ECHO=1") + script("local.sh") + fmt::format(" {} ", 2 * n + 1) + cfg_);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("OMP_NUM_THREADS=1 "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--oversubscribe --bind-to none"), std::string::npos) << r.out;
}

TEST_F(Launch, LocalRunsAPipelineTraining) {
  auto r = run_cmd(clean_env() + script("local.sh") + " 2 " + cfg_ +
                   " --set parallel.pp=2 --set train.output_dir=" + (dir_ / "run").string());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("grid (dp=1, pp=2, tp=1)"), std::string::npos) << r.err;
  EXPECT_EQ(test::losses(dir_ / "run").size(), 3u);
  // A bad config still fails the tripod way through the launcher.
  r = run_cmd(clean_env() + script("local.sh") + " 2 " + cfg_ + " --set parallel.tp=3");
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_EQ(test::count_lines_starting(r.err, "error: "), 1) << r.err;
}

TEST_F(Launch, MultinodeMapsRanksToSlotsAndPassesTheEnvironment) {
  test::write_file(dir_ / "hosts", "node01 slots=8\nnode02 slots=8\n");
  auto r = run_cmd(clean_env("TRIPOD_LAUNCH_ECHO=1 NCCL_DEBUG=INFO NCCL_IB_HCA=mlx5 CUDA_VISIBLE_DEVICES=0,1 "
                             "TRIPOD_IFACE=ib0") +
                   script("multinode.sh") + " " + (dir_ / "hosts").string() + " 16 " + cfg_ + " --set parallel.pp=2");
  ASSERT_EQ(r.status, 0) << r.err;
  for (const char* want : {"--hostfile ", " -np 16 --map-by slot --bind-to none", "--mca btl_tcp_if_include ib0",
                           "--mca oob_tcp_if_include ib0", "-x NCCL_DEBUG", "-x NCCL_IB_HCA", "-x NCCL_SOCKET_IFNAME",
                           "-x CUDA_VISIBLE_DEVICES", "-x OMP_NUM_THREADS", "-x OPENBLAS_NUM_THREADS", "-x PATH",
                           " train --config "})
    EXPECT_NE(r.out.find(want), std::string::npos) << want << " missing in " << r.out;
  EXPECT_NE(r.out.find("--set parallel.pp=2"), std::string::npos) << r.out;
  // A subnet restricts MPI only: NCCL takes interface names.
  r = run_cmd(clean_env("TRIPOD_LAUNCH_ECHO=1 TRIPOD_IFACE=10.0.0.0/16") + script("multinode.sh") + " " +
              (dir_ / "hosts").string() + " 8 " + cfg_);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("--mca btl_tcp_if_include 10.0.0.0/16"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("NCCL_SOCKET_IFNAME"), std::string::npos) << r.out;
}

TEST_F(Launch, SlurmTakesNodesTasksAndGpusFromSlurm) {
  std::ifstream in(script("slurm.sbatch"));
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_NE(text.str().find("\n#SBATCH --signal=USR1@120\n"), std::string::npos);
  const std::string slurm = "TRIPOD_LAUNCH_ECHO=1 SLURM_JOB_ID=42 SLURM_SUBMIT_DIR=" + dir_.string() +
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
}

// Two hosts made of network namespaces; skips where namespaces cannot be made (not root, no
// iproute2, a container without CAP_NET_ADMIN).
TEST_F(MultiHost, TrainsAcrossTwoNamespacesOverTcpLikeOneProcess) {
  auto r =
      run_cmd(clean_env() + std::string(TRIPOD_SOURCE_PATH) + "/tests/e2e/multihost_netns.sh " + dir_.string() + " 8 " +
              cfg_ + " --set parallel.tp=2 --set parallel.pp=2 --set train.output_dir=" + (dir_ / "multi").string());
  if (r.status == 77) GTEST_SKIP() << "network namespaces unavailable: " << r.err;
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

  r = run_cmd(clean_env() + test::tripod_bin() + " train --config " + cfg_ +
              " --set train.output_dir=" + (dir_ / "single").string());
  ASSERT_EQ(r.status, 0) << r.err;
  auto multi = test::losses(dir_ / "multi"), single = test::losses(dir_ / "single");
  ASSERT_EQ(single.size(), 3u);
  ASSERT_EQ(multi.size(), single.size());
  for (const auto& [step, loss] : single) EXPECT_NEAR(multi[step], loss, 1e-5 * std::fabs(loss)) << "step " << step;
}

}  // namespace
}  // namespace tripod
