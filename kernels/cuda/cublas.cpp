#include "kernels/cuda/cublas.h"

#include <dlfcn.h>

#include <string>

#include "core/error.h"

namespace tripod::cuda {

namespace {

Cublas load() {
  const std::string so = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
  void* lib = ::dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) TRIPOD_FAIL("cannot load {} (cuBLAS, for the experts' grouped GEMMs): {}", so, ::dlerror());
  Cublas f;
#define TRIPOD_CUBLAS_LOAD(name)                                                       \
  f.name = reinterpret_cast<decltype(f.name)>(::dlsym(lib, "cublas" #name));           \
  if (!f.name) TRIPOD_FAIL("{} has no function cublas" #name " ({})", so, ::dlerror());
  TRIPOD_CUBLAS_FUNCTIONS(TRIPOD_CUBLAS_LOAD)
#undef TRIPOD_CUBLAS_LOAD
  return f;  // the library stays loaded for the life of the process
}

}  // namespace

const Cublas& cublas() {
  static const Cublas f = load();
  return f;
}

}  // namespace tripod::cuda
