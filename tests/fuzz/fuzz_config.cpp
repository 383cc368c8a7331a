// Fuzzes the TOML config: parsing, every section's validation, the grid checks for a world of
// 1 to 8 ranks (the first byte), and the resolved config written back, which must parse to the
// same config.
#include "tests/fuzz/fuzz_util.h"
#include "config/config.h"

using namespace tripod;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int world = 1 + data[0] % 8;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  fuzz::expect_only_input_errors([&] {
    Config c = parse_config(text, "fuzz.toml");
    const std::string resolved = config_to_toml(c);
    if (config_to_toml(parse_config(resolved, "resolved.toml")) != resolved) std::abort();
    validate_layout(c, world);
  });
  return 0;
}
