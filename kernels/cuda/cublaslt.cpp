#include "kernels/cuda/cublaslt.h"

#include <dlfcn.h>

#include <string>

#include "core/error.h"

namespace tripod::cuda {

namespace {

CublasLt load() {
  const std::string so = "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);
  void* lib = ::dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) TRIPOD_FAIL("cannot load {} (cuBLASLt, for the GPU's GEMMs): {}", so, ::dlerror());
  CublasLt f;
#define TRIPOD_CUBLASLT_LOAD(name)                                                             \
  f.name = reinterpret_cast<decltype(f.name)>(::dlsym(lib, "cublasLt" #name));                 \
  if (!f.name) TRIPOD_FAIL("{} has no function cublasLt" #name " ({})", so, ::dlerror());
  TRIPOD_CUBLASLT_FUNCTIONS(TRIPOD_CUBLASLT_LOAD)
#undef TRIPOD_CUBLASLT_LOAD
  return f;  // the library stays loaded for the life of the process
}

}  // namespace

const CublasLt& cublaslt() {
  static const CublasLt f = load();
  return f;
}

}  // namespace tripod::cuda
