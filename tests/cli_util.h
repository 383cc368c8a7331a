// Running the tripod executable (alone or under mpirun) from tests.
#pragma once

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

namespace tripod::test {

struct CmdResult {
  int status = -1;
  std::string out, err;
  double seconds = 0;
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

// The whole of a file ("" when it cannot be read).
inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline CmdResult run_cmd(const std::string& cmd) {
  auto dir = std::filesystem::temp_directory_path() / ("tripod_cmd_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::string o = (dir / "out").string(), e = (dir / "err").string();
  auto t0 = std::chrono::steady_clock::now();
  int raw = std::system((cmd + " >" + o + " 2>" + e).c_str());
  CmdResult r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  r.out = slurp(o);
  r.err = slurp(e);
  std::filesystem::remove_all(dir);
  return r;
}

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
