// Running commands from tests: the tripod executable alone or under mpirun, any shell command,
// to the end (with a timeout) or in the background.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>

namespace tripod::test {

struct CmdResult {
  int status = -1;  // the exit status (-1 when a signal ended the shell)
  std::string out, err;
  double seconds = 0;
  bool timed_out = false;
};

inline std::string tripod_bin() {
  const char* b = std::getenv("TRIPOD_BIN");
  return b ? b : TRIPOD_BIN_PATH;
}

// mpirun with the flags a root-run container needs; `np` ranks. The test process is itself an
// MPI singleton, so its Open MPI / PMIx variables are dropped from the child's environment, except
// those that say where Open MPI and PMIx are installed (a relocated bundle sets OPAL_PREFIX,
// OPAL_LIBDIR, PMIX_PKGLIBDIR, ... and PMIX_MCA_mca_base_component_path).
inline std::string mpirun(int np) {
  std::string unset;
  for (char** e = environ; *e; ++e) {
    const std::string kv(*e), name = kv.substr(0, kv.find('='));
    const bool location = (name.rfind("OPAL_", 0) == 0 || name.rfind("PMIX_", 0) == 0) &&
                          ((name.ends_with("DIR") && !name.ends_with("TMPDIR")) || name.ends_with("_PREFIX") ||
                           name == "PMIX_MCA_mca_base_component_path");
    if (location) continue;
    for (const char* p : {"OMPI_", "PMIX_", "ORTE_", "OPAL_"})
      if (name.rfind(p, 0) == 0) unset += " -u " + name;
  }
  return "env" + unset + " OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 mpirun --allow-run-as-root --oversubscribe "
         "--bind-to none -np " + std::to_string(np) + " ";
}

// How to run tripod: on `np` processes (under mpirun when more than one; one BLAS and OpenMP
// thread each either way), with `env` (VAR=value words) added to its environment, for at most
// `timeout_s` seconds (run_tripod; a background run has no limit).
struct RunOptions {
  int np = 1;
  std::string env = "";
  int timeout_s = 300;
};

// The shell command for `tripod ARGS`.
inline std::string tripod_cmd(const std::string& args, const RunOptions& o = {}) {
  const std::string launcher = o.np > 1 ? mpirun(o.np) : "env OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 ";
  return (o.env.empty() ? "" : "env " + o.env + " ") + launcher + tripod_bin() + " " + args;
}

// The whole of a file ("" when it cannot be read).
inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// `s` as one word for sh.
inline std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Runs a shell command to its end, or until `timeout_s` seconds have passed (then it and every
// process it started are ended, SIGTERM then SIGKILL, and err says so).
inline CmdResult run_cmd(const std::string& cmd, int timeout_s = RunOptions{}.timeout_s) {
  auto dir = std::filesystem::temp_directory_path() / ("tripod_cmd_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::string o = (dir / "out").string(), e = (dir / "err").string();
  auto t0 = std::chrono::steady_clock::now();
  int raw = std::system(
      ("timeout -k 5 " + std::to_string(timeout_s) + " sh -c " + shell_quote(cmd) + " >" + o + " 2>" + e).c_str());
  CmdResult r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  r.out = slurp(o);
  r.err = slurp(e);
  r.timed_out = (r.status == 124 || r.status == 137) && r.seconds >= timeout_s;
  if (r.timed_out) r.err += "\n[timed out after " + std::to_string(timeout_s) + " s: " + cmd + "]\n";
  std::filesystem::remove_all(dir);
  return r;
}

inline CmdResult run_tripod(const std::string& args, const RunOptions& o = {}) {
  return run_cmd(tripod_cmd(args, o), o.timeout_s);
}

// A command running in the background (sh execs it, so pid() is the command's own), its stdout and
// stderr into `log`. Killed (SIGKILL) when destroyed while it still runs.
class Background {
 public:
  Background(const std::string& cmd, std::filesystem::path log) : log_(std::move(log)) {
    pid_ = fork();
    if (pid_ == 0) {
      const std::string c = "exec " + cmd + " >" + log_.string() + " 2>&1";
      execl("/bin/sh", "sh", "-c", c.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
  }
  ~Background() {
    if (pid_ > 0 && !wait(0)) {
      kill(pid_, SIGKILL);
      wait(60);
    }
  }
  Background(const Background&) = delete;
  Background& operator=(const Background&) = delete;

  pid_t pid() const { return pid_; }
  std::string log() const { return slurp(log_); }
  // Waits up to `seconds` for the command to end: its exit status, or -N when signal N ended it;
  // nullopt while it still runs.
  std::optional<int> wait(double seconds) {
    const auto t0 = std::chrono::steady_clock::now();
    while (!status_) {
      int raw = 0;
      if (waitpid(pid_, &raw, WNOHANG) == pid_)
        status_ = WIFEXITED(raw) ? WEXITSTATUS(raw) : -WTERMSIG(raw);
      else if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() >= seconds)
        break;
      else
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return status_;
  }

 private:
  std::filesystem::path log_;
  pid_t pid_ = -1;
  std::optional<int> status_;
};

// Lines of `text` starting with `prefix`.
inline int count_lines_starting(const std::string& text, const std::string& prefix) {
  std::istringstream in(text);
  std::string line;
  int n = 0;
  while (std::getline(in, line))
    if (line.rfind(prefix, 0) == 0) ++n;
  return n;
}

// A fresh directory for one test's files.
inline std::filesystem::path scratch_dir(const std::string& name) {
  auto d = std::filesystem::temp_directory_path() / ("tripod_test_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

inline void write_file(const std::filesystem::path& p, const std::string& text) { std::ofstream(p) << text; }

}  // namespace tripod::test
