// Fuzzes checkpoint metadata.json: parsing, validate_metadata (every field's type and range, the
// checksum), then what loads read from valid metadata (iteration, files, grid, the model record
// compared with a run's model). The input's "metadata_crc32c", when it is 8 characters, is
// replaced by the right checksum so that the checks behind it are reached.
#include <nlohmann/json.hpp>

#include "checkpoint/metadata.h"
#include "checkpoint/reader.h"
#include "tests/fuzz/fuzz_util.h"
#include "config/config.h"

using namespace tripod;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nlohmann::json meta = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (meta.is_discarded()) return 0;
  if (meta.is_object() && meta.contains("metadata_crc32c") && meta["metadata_crc32c"].is_string() &&
      meta["metadata_crc32c"].get<std::string>().size() == 8)
    meta["metadata_crc32c"] = metadata_checksum(meta);
  // Through the reader, as every load does: a directory with this metadata.json and no files.
  const auto dir = fuzz::scratch() / "iter_0000001";
  std::filesystem::create_directories(dir);
  fuzz::write_file("iter_0000001/metadata.json", meta.dump());
  fuzz::expect_only_input_errors([&] {
    validate_metadata(meta, "metadata.json");
    (void)meta["iteration"].get<int64_t>();
    for (const auto& f : meta["files"]) (void)(f["name"].get<std::string>().size() + f["bytes"].get<int64_t>());
    for (const char* k : {"dp", "pp", "tp"}) (void)meta["grid"][k].get<int>();
    ModelConfig m{.n_layers = 2, .n_heads = 2, .d_model = 8, .seq_len = 8, .vocab_size = 64};
    if (meta.contains("model")) check_model_record(meta["model"], model_to_json(m), "ckpt");
    CheckpointReader r(dir.string());
    (void)r.iteration();
  });
  return 0;
}
