// `tripod train` with train.device = "cuda": on a machine without a GPU it stops with one
// "error:" line naming train.device and exit status 2, writing nothing; with a GPU a tiny run
// trains and logs its metrics.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "kernels/op.h"

namespace tripod {
namespace {

struct RunResult {
  int status = -1;
  std::string output;  // stdout and stderr
};

RunResult run(const std::string& args) {
  const char* bin = std::getenv("TRIPOD_BIN");
  if (!bin) bin = TRIPOD_BIN_PATH;
  RunResult r;
  std::string cmd = std::string("'") + bin + "' " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.output.append(buf, n);
  int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

std::string source_dir() {
  const char* s = std::getenv("TRIPOD_SOURCE_DIR");
  return s ? s : TRIPOD_SOURCE_PATH;
}

std::filesystem::path scratch_dir(const char* name) {
  auto dir = std::filesystem::temp_directory_path() / fmt::format("tripod_{}_{}", name, getpid());
  std::filesystem::remove_all(dir);
  return dir;
}

TEST(CudaCli, TrainOnCudaWithoutGpuExitsTwo) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "this machine has a CUDA GPU; the check is for GPU-less machines";
  const auto out = scratch_dir("nogpu");
  RunResult r = run(fmt::format("train --config '{}/configs/tiny.toml' --set train.device=cuda --set train.output_dir='{}'",
                          source_dir(), out.string()));
  EXPECT_EQ(r.status, 2) << r.output;
  // Exactly one line starting "error:", naming the key at fault.
  size_t errors = 0;
  std::string line, error_line;
  std::istringstream lines(r.output);
  while (std::getline(lines, line))
    if (line.rfind("error:", 0) == 0) {
      ++errors;
      error_line = line;
    }
  EXPECT_EQ(errors, 1u) << r.output;
  EXPECT_NE(error_line.find("train.device"), std::string::npos) << error_line;
  EXPECT_FALSE(std::filesystem::exists(out)) << "nothing may be written on a configuration error";
}

TEST(CudaCli, TrainOnCudaRunsATinyModel) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU: the CUDA backend is compiled but cannot run here";
  const auto out = scratch_dir("gpu");
  RunResult r = run(fmt::format("train --config '{}/configs/tiny.toml' --set train.device=cuda --set train.steps=5 "
                          "--set train.log_interval=1 --set train.output_dir='{}'",
                          source_dir(), out.string()));
  EXPECT_EQ(r.status, 0) << r.output;
  std::ifstream metrics(out / "metrics.jsonl");
  std::string line;
  int lines = 0;
  while (std::getline(metrics, line)) ++lines;
  EXPECT_EQ(lines, 5) << r.output;
  std::filesystem::remove_all(out);
}

}  // namespace
}  // namespace tripod
