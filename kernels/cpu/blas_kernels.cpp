// Choosing OpenBLAS's kernels where its CPU detection fails (see select_cpu_blas_kernels).
#include <cblas.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "kernels/op.h"

namespace tripod {

void select_cpu_blas_kernels(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE")) return;  // chosen by the user, or by us before the exec
  const std::string core = openblas_get_corename();
  // The fallbacks of OpenBLAS's dynamic detection on an unrecognised x86-64 model.
  if (core != "Prescott" && core != "Core2" && core != "Nehalem" && core != "Sandybridge") return;
  __builtin_cpu_init();
  const char* want = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") ? "SKYLAKEX"
                     : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")     ? "HASWELL"
                                                                                            : nullptr;
  if (!want) return;
  setenv("OPENBLAS_CORETYPE", want, 1);
  execv("/proc/self/exe", argv);  // only returns on failure: carry on with the slow kernels
}

}  // namespace tripod
