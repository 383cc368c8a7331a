// The backend factory: the one place that knows which backends this build has; GPU peaks by name.
#include <cstdlib>
#include <string>
#include <utility>

#include "core/error.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/op.h"
#ifdef TRIPOD_HAVE_CUDA
#include "kernels/cuda/cuda_ops.h"
#endif

namespace tripod {

std::unique_ptr<Ops> make_ops(Device device, int device_index) {
  if (device == Device::CPU) return std::make_unique<cpu::CpuOps>();
#ifdef TRIPOD_HAVE_CUDA
  int n = cuda::device_count();
  TRIPOD_INPUT_CHECK(n > 0, "train.device = \"cuda\" but no CUDA GPU is visible on this machine (valid here: \"cpu\")");
  TRIPOD_INPUT_CHECK(device_index < n, "this rank wants GPU {} but only {} are visible", device_index, n);
  return cuda::make_cuda_ops(device_index);
#else
  throw InputError("train.device = \"cuda\" but this build has no CUDA backend (rebuild with nvcc and "
                   "-DTRIPOD_CUDA=ON; valid here: \"cpu\")");
#endif
}

int cuda_device_count() {
#ifdef TRIPOD_HAVE_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

double gpu_peak_flops(std::string_view name) {
  if (const char* env = std::getenv("TRIPOD_PEAK_TFLOPS")) {
    char* end = nullptr;
    const double tf = std::strtod(env, &end);
    TRIPOD_INPUT_CHECK(end != env && *end == '\0' && tf > 0, "TRIPOD_PEAK_TFLOPS='{}': a positive number expected",
                       env);
    return tf * 1e12;
  }
  // Dense (no sparsity) bf16 with f32 accumulation, TFLOP/s. More specific names come first.
  static constexpr std::pair<std::string_view, double> kPeaks[] = {
      {"H100 PCIe", 756}, {"H100 NVL", 835}, {"H100", 989}, {"H800 PCIe", 756}, {"H800", 989},
      {"H200 NVL", 835},  {"H200", 989},     {"H20", 148},  {"GB200", 2500},    {"B200", 2250},
      {"A100", 312},      {"A800", 312},     {"L40S", 362}, {"L40", 181},       {"L4", 121}};
  for (const auto& [key, tf] : kPeaks)
    if (name.find(key) != std::string_view::npos) return tf * 1e12;
  return 0;
}

}  // namespace tripod
