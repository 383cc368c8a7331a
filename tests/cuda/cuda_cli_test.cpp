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

#include "cli_util.h"
#include "core/error.h"
#include "kernels/op.h"
#include "test_util.h"

namespace tripod {
namespace {

// The executable's combined output and status.
test::CmdResult run(const std::string& args) {
  std::string cmd = "'";  // (built in steps: GCC 12 warns falsely about "'" + std::string)
  cmd += test::tripod_bin();
  cmd += "' ";
  test::CmdResult r = test::run_cmd(cmd + args);
  r.out += r.err;
  return r;
}

std::string source_dir() { return test::source_dir(); }

std::filesystem::path scratch_dir(const char* name) {
  auto dir = test::scratch_dir(name);
  std::filesystem::remove_all(dir);
  return dir;
}

TEST(CudaCli, TrainOnCudaWithoutGpuExitsTwo) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "this machine has a CUDA GPU; the check is for GPU-less machines";
  const auto out = scratch_dir("nogpu");
  test::CmdResult r = run(fmt::format("train --config '{}/configs/tiny.toml' --set train.device=cuda --set train.output_dir='{}'",
                          source_dir(), out.string()));
  EXPECT_EQ(r.status, 2) << r.out;
  // Exactly one line starting "error:", naming the key at fault.
  size_t errors = 0;
  std::string line, error_line;
  std::istringstream lines(r.out);
  while (std::getline(lines, line))
    if (line.rfind("error:", 0) == 0) {
      ++errors;
      error_line = line;
    }
  EXPECT_EQ(errors, 1u) << r.out;
  EXPECT_NE(error_line.find("train.device"), std::string::npos) << error_line;
  EXPECT_FALSE(std::filesystem::exists(out)) << "nothing may be written on a configuration error";
}

TEST(CudaCli, TrainOnCudaRunsATinyModel) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU: the CUDA backend is compiled but cannot run here";
  const auto out = scratch_dir("gpu");
  test::CmdResult r = run(fmt::format("train --config '{}/configs/tiny.toml' --set train.device=cuda --set train.steps=5 "
                          "--set train.log_interval=1 --set train.output_dir='{}'",
                          source_dir(), out.string()));
  EXPECT_EQ(r.status, 0) << r.out;
  std::ifstream metrics(out / "metrics.jsonl");
  std::string line;
  int lines = 0;
  while (std::getline(metrics, line)) ++lines;
  EXPECT_EQ(lines, 5) << r.out;
  std::filesystem::remove_all(out);
}

// MFU's denominator comes from the GPU's name (no GPU needed to check the table).
TEST(GpuPeak, ByNameFromTheDatasheets) {
  ASSERT_EQ(std::getenv("TRIPOD_PEAK_TFLOPS"), nullptr) << "unset TRIPOD_PEAK_TFLOPS for this test";
  EXPECT_EQ(gpu_peak_flops("NVIDIA H100 80GB HBM3"), 989e12);
  EXPECT_EQ(gpu_peak_flops("NVIDIA H100 PCIe"), 756e12);
  EXPECT_EQ(gpu_peak_flops("NVIDIA H100 NVL"), 835e12);
  EXPECT_EQ(gpu_peak_flops("NVIDIA H200"), 989e12);
  EXPECT_EQ(gpu_peak_flops("NVIDIA A100-SXM4-80GB"), 312e12);
  EXPECT_EQ(gpu_peak_flops("NVIDIA L40S"), 362e12);
  EXPECT_EQ(gpu_peak_flops("NVIDIA L4"), 121e12);
  EXPECT_EQ(gpu_peak_flops("Tesla T4"), 0) << "unknown: the caller warns and falls back";
  ::setenv("TRIPOD_PEAK_TFLOPS", "123.5", 1);
  EXPECT_EQ(gpu_peak_flops("NVIDIA H100 80GB HBM3"), 123.5e12);
  ::setenv("TRIPOD_PEAK_TFLOPS", "fast", 1);
  EXPECT_THROW(gpu_peak_flops("NVIDIA H100 80GB HBM3"), InputError);
  ::unsetenv("TRIPOD_PEAK_TFLOPS");
}

}  // namespace
}  // namespace tripod
