// The safetensors format, written and read here (no library): 8 bytes little-endian header
// length N, N bytes of JSON {name: {"dtype", "shape", "data_offsets": [begin, end]}, ...,
// "__metadata__": {string: string}}, padded with spaces to a multiple of 8, then the raw
// little-endian tensor bytes (offsets relative to the end of the header).
#pragma once

#include <nlohmann/json.hpp>

#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace tripod {

struct NamedTensor {
  std::string name;
  Shape shape;
  std::vector<float> data;
};

struct SafetensorsFile {
  std::vector<NamedTensor> tensors;  // in file order
  std::map<std::string, std::string> metadata;
};

// Writes F32 tensors (atomically: OUT.tmp, fsync, rename). Throws Error on I/O failure.
void write_safetensors(const std::string& path, const SafetensorsFile& f);
// Reads F32, F16 and BF16 tensors as f32. InputError naming the file and what is wrong.
SafetensorsFile read_safetensors(const std::string& path);

// A Hugging Face model folder: config.json, and the weights in model.safetensors or in the
// shards that model.safetensors.index.json's weight_map names.
struct SafetensorsFolder {
  SafetensorsFile weights;  // every tensor of every shard (names unique), shard by shard
  nlohmann::json config;    // config.json
};
// InputError naming the file and what is wrong (missing files, a tensor in two shards or not
// where the index says, invalid JSON).
SafetensorsFolder read_safetensors_folder(const std::string& dir);
// Writes `dir` (which must not exist) with config.json and model.safetensors, atomically: into
// dir.tmp, then renamed.
void write_safetensors_folder(const std::string& dir, const SafetensorsFile& weights, const nlohmann::json& config);

}  // namespace tripod
