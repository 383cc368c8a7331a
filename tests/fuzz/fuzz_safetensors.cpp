// Fuzzes the safetensors reader (the header's JSON: dtypes, shapes, offsets; the data).
#include "checkpoint/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

using namespace tripod;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::write_file("in.safetensors", {reinterpret_cast<const char*>(data), size});
  fuzz::expect_only_input_errors([&] {
    SafetensorsFile f = read_safetensors(path);
    for (const NamedTensor& t : f.tensors)
      if (static_cast<int64_t>(t.data.size()) != shape_numel(t.shape)) std::abort();
  });
  return 0;
}
