// safetensors, by hand.
#include "checkpoint/safetensors.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "checkpoint/hdf5_file.h"
#include "core/error.h"

namespace fs = std::filesystem;

namespace tripod {

void write_safetensors(const std::string& path, const SafetensorsFile& f) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!f.metadata.empty()) header["__metadata__"] = f.metadata;
  uint64_t off = 0;
  for (const NamedTensor& t : f.tensors) {
    TRIPOD_CHECK(static_cast<int64_t>(t.data.size()) == shape_numel(t.shape), "tensor {}: {} values for shape {}",
                 t.name, t.data.size(), shape_str(t.shape));
    uint64_t n = t.data.size() * sizeof(float);
    header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {off, off + n}}};
    off += n;
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    TRIPOD_CHECK(out.good(), "cannot create {}", tmp);
    uint64_t len = h.size();
    unsigned char le[8];
    for (int i = 0; i < 8; ++i) le[i] = static_cast<unsigned char>(len >> (8 * i));
    out.write(reinterpret_cast<const char*>(le), 8);
    out.write(h.data(), static_cast<std::streamsize>(h.size()));
    for (const NamedTensor& t : f.tensors)  // f32 is little-endian on every target tripod builds for
      out.write(reinterpret_cast<const char*>(t.data.data()), static_cast<std::streamsize>(t.data.size() * 4));
    out.close();
    TRIPOD_CHECK(out.good(), "writing {}", tmp);
  }
  fsync_path(tmp);
  fs::rename(tmp, path);
}

namespace {

float half_to_float(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        man <<= 1;
      } while (!(man & 0x400));
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (man & 0x3FF) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7F800000u | man << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | man << 13;
  }
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

}  // namespace

SafetensorsFile read_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TRIPOD_INPUT_CHECK(in.good(), "safetensors file {} cannot be read (missing or not readable)", path);
  const uint64_t size = fs::file_size(path);
  unsigned char le[8];
  in.read(reinterpret_cast<char*>(le), 8);
  TRIPOD_INPUT_CHECK(in.good() && size >= 8, "{} is not a safetensors file (shorter than its 8-byte header length)", path);
  uint64_t len = 0;
  for (int i = 0; i < 8; ++i) len |= static_cast<uint64_t>(le[i]) << (8 * i);
  TRIPOD_INPUT_CHECK(len <= size - 8 && len < (100u << 20), "{} is not a safetensors file (header length {} for a "
                     "file of {} bytes)", path, len, size);
  std::string h(len, '\0');
  in.read(h.data(), static_cast<std::streamsize>(len));
  nlohmann::ordered_json header;
  try {
    header = nlohmann::ordered_json::parse(h);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(fmt::format("{}: the safetensors header is not valid JSON: {}", path, e.what()));
  }
  TRIPOD_INPUT_CHECK(header.is_object(), "{}: the safetensors header is not a JSON object", path);
  const uint64_t data_size = size - 8 - len;
  SafetensorsFile f;
  for (auto& [name, e] : header.items()) {
    if (name == "__metadata__") {
      if (e.is_object())
        for (auto& [k, v] : e.items())
          if (v.is_string()) f.metadata[k] = v.get<std::string>();
      continue;
    }
    TRIPOD_INPUT_CHECK(e.is_object() && e.contains("dtype") && e.contains("shape") && e.contains("data_offsets"),
                       "{}: tensor {} lacks dtype, shape or data_offsets", path, name);
    NamedTensor t;
    t.name = name;
    const std::string dt = e["dtype"].get<std::string>();
    for (auto& d : e["shape"]) t.shape.push_back(d.get<int64_t>());
    const uint64_t b = e["data_offsets"][0].get<uint64_t>(), end = e["data_offsets"][1].get<uint64_t>();
    const int64_t n = shape_numel(t.shape);
    const uint64_t elem = dt == "F32" ? 4 : (dt == "F16" || dt == "BF16") ? 2 : 0;
    TRIPOD_INPUT_CHECK(elem > 0, "{}: tensor {} has dtype {} (tripod reads F32, F16 and BF16)", path, name, dt);
    TRIPOD_INPUT_CHECK(b <= end && end <= data_size && end - b == static_cast<uint64_t>(n) * elem,
                       "{}: tensor {} has data_offsets [{}, {}) that do not fit its shape {} and dtype {} within the "
                       "file's {} data bytes (truncated?)", path, name, b, end, shape_str(t.shape), dt, data_size);
    std::vector<unsigned char> raw(end - b);
    in.seekg(static_cast<std::streamoff>(8 + len + b));
    in.read(reinterpret_cast<char*>(raw.data()), static_cast<std::streamsize>(raw.size()));
    TRIPOD_INPUT_CHECK(in.good(), "{}: tensor {} cannot be read (truncated?)", path, name);
    t.data.resize(n);
    for (int64_t i = 0; i < n; ++i) {
      if (elem == 4) {
        std::memcpy(&t.data[i], raw.data() + 4 * i, 4);
      } else {
        uint16_t v = static_cast<uint16_t>(raw[2 * i] | raw[2 * i + 1] << 8);
        if (dt == "BF16") {
          uint32_t bits = static_cast<uint32_t>(v) << 16;
          std::memcpy(&t.data[i], &bits, 4);
        } else {
          t.data[i] = half_to_float(v);
        }
      }
    }
    f.tensors.push_back(std::move(t));
  }
  return f;
}

namespace {

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  TRIPOD_INPUT_CHECK(in.good(), "{} cannot be read (missing or not readable)", path.string());
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(fmt::format("{} is not valid JSON: {}", path.string(), e.what()));
  }
}

}  // namespace

SafetensorsFolder read_safetensors_folder(const std::string& dir) {
  const fs::path root(dir);
  SafetensorsFolder out;
  out.config = read_json(root / "config.json");
  TRIPOD_INPUT_CHECK(out.config.is_object(), "{}: config.json is not a JSON object", dir);
  const fs::path index = root / "model.safetensors.index.json";
  if (!fs::exists(index)) {
    out.weights = read_safetensors((root / "model.safetensors").string());
    return out;
  }
  const nlohmann::json idx = read_json(index);
  TRIPOD_INPUT_CHECK(idx.is_object() && idx.contains("weight_map") && idx["weight_map"].is_object(),
                     "{} has no weight_map object", index.string());
  std::map<std::string, std::string> where;  // tensor -> shard file
  std::vector<std::string> files;
  for (auto& [name, file] : idx["weight_map"].items()) {
    TRIPOD_INPUT_CHECK(file.is_string(), "{}: weight_map[{}] is not a file name", index.string(), name);
    const std::string f = file.get<std::string>();
    TRIPOD_INPUT_CHECK(f.find('/') == std::string::npos, "{}: weight_map[{}] = {} is not a file in {}",
                       index.string(), name, f, dir);
    where[name] = f;
    if (std::find(files.begin(), files.end(), f) == files.end()) files.push_back(f);
  }
  std::map<std::string, std::string> seen;
  for (const std::string& f : files) {
    SafetensorsFile shard = read_safetensors((root / f).string());
    for (NamedTensor& t : shard.tensors) {
      auto it = where.find(t.name);
      TRIPOD_INPUT_CHECK(it != where.end() && it->second == f, "{}: tensor {} is in {} but {} says {}", dir, t.name,
                         f, index.filename().string(), it == where.end() ? "nothing of it" : it->second);
      TRIPOD_INPUT_CHECK(seen.emplace(t.name, f).second, "{}: tensor {} is in {} and in {}", dir, t.name,
                         seen[t.name], f);
      out.weights.tensors.push_back(std::move(t));
    }
  }
  for (const auto& [name, f] : where)
    TRIPOD_INPUT_CHECK(seen.count(name), "{}: {} names tensor {} in {}, which lacks it", dir,
                       index.filename().string(), name, f);
  return out;
}

void write_safetensors_folder(const std::string& dir, const SafetensorsFile& weights, const nlohmann::json& config) {
  TRIPOD_INPUT_CHECK(!fs::exists(dir), "output {} exists; refusing to overwrite it (remove it or pick another name)",
                     dir);
  const fs::path tmp = dir + ".tmp";
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  write_safetensors((tmp / "model.safetensors").string(), weights);
  {
    std::ofstream out(tmp / "config.json");
    out << config.dump(2) << "\n";
    out.close();
    TRIPOD_CHECK(out.good(), "writing {}", (tmp / "config.json").string());
  }
  fsync_path((tmp / "config.json").string());
  fs::rename(tmp, dir);
}

}  // namespace tripod
