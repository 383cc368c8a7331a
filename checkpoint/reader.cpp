// Checkpoint directories: metadata, piece index, slice assembly.
#include "checkpoint/reader.h"

#include <filesystem>
#include <fstream>
#include <future>

#include "checkpoint/crc32c.h"
#include "checkpoint/metadata.h"
#include "checkpoint/writer.h"
#include "core/error.h"

namespace fs = std::filesystem;

namespace tripod {

CheckpointReader::CheckpointReader(const std::string& dir) : dir_(dir) {
  const fs::path meta_path = fs::path(dir) / "metadata.json";
  TRIPOD_INPUT_CHECK(fs::is_directory(dir), "checkpoint {} does not exist or is not a directory", dir);
  TRIPOD_INPUT_CHECK(fs::exists(meta_path),
                     "checkpoint {} is incomplete: it has no metadata.json (a save that did not finish?)", dir);
  std::ifstream in(meta_path);
  try {
    meta_ = nlohmann::json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    throw InputError(fmt::format("checkpoint file {} is not valid JSON (at byte {}; damaged?)", meta_path.string(),
                                 e.byte));
  } catch (const nlohmann::json::exception&) {
    throw InputError(fmt::format("checkpoint file {} holds a number out of range (damaged?)", meta_path.string()));
  }
  validate_metadata(meta_, meta_path.string());
  for (const auto& f : meta_["files"]) {
    const fs::path p = fs::path(dir) / f["name"].get<std::string>();
    TRIPOD_INPUT_CHECK(fs::is_regular_file(p), "checkpoint file {} is missing (listed in {})", p.string(),
                       meta_path.string());
    const auto size = static_cast<int64_t>(fs::file_size(p));
    const int64_t want = f["bytes"].get<int64_t>();
    TRIPOD_INPUT_CHECK(size == want, "checkpoint file {} has {} bytes but {} were written (truncated or damaged)",
                       p.string(), size, want);
  }
}

CheckpointReader::~CheckpointReader() = default;

int64_t CheckpointReader::iteration() const { return meta_["iteration"].get<int64_t>(); }

H5Reader& CheckpointReader::file(const std::string& path) {
  auto& f = files_[path];
  if (!f) f = std::make_unique<H5Reader>(path);
  return *f;
}

const std::vector<StoredPiece>& CheckpointReader::index() {
  if (indexed_) return index_;
  for (const auto& f : meta_["files"]) {
    std::string path = (fs::path(dir_) / f["name"].get<std::string>()).string();
    for (auto& p : file(path).index()) index_.push_back(std::move(p));
  }
  for (const StoredPiece& p : index_) {
    if (p.spec.kind == StateKind::Fp8) continue;  // scaling state, not a tensor of the model
    auto [it, fresh] = tensors_.emplace(p.spec.name, p.spec.geom.global_shape);
    TRIPOD_INPUT_CHECK(fresh || it->second == p.spec.geom.global_shape,
                       "checkpoint file {}: tensor {} is {} in dataset {} but {} elsewhere", p.file, p.spec.name,
                       shape_str(p.spec.geom.global_shape), p.dataset, shape_str(it->second));
  }
  indexed_ = true;
  return index_;
}

const std::map<std::string, Shape>& CheckpointReader::tensors() {
  index();
  return tensors_;
}

bool CheckpointReader::has_kind(StateKind kind) {
  for (const StoredPiece& p : index())
    if (p.spec.kind == kind) return true;
  return false;
}

std::vector<float> CheckpointReader::read_piece(const StoredPiece& p) {
  std::vector<float> data(p.spec.geom.numel());
  read_piece_into(p, data.data());
  return data;
}

void CheckpointReader::read_piece_into(const StoredPiece& p, float* data) { check_crc(p, file(p.file).read(p, data)); }

void CheckpointReader::check_crc(const StoredPiece& p, uint32_t crc) const {
  TRIPOD_INPUT_CHECK(crc == p.spec.crc,
                     "checkpoint file {}: dataset {} (tensor {}, {}) fails its checksum (crc32c {:08x}, stored {:08x}): "
                     "the file is damaged",
                     p.file, p.dataset, p.spec.name, state_kind_name(p.spec.kind), crc, p.spec.crc);
}

namespace {

// CRC32C of a large buffer in two halves on two threads (one core's crc32 streams fall short of
// the memory bandwidth), combined.
uint32_t crc32c_2threads(const float* data, int64_t n) {
  const auto* p = reinterpret_cast<const char*>(data);
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  if (bytes < (8u << 20)) return crc32c(p, bytes);
  const size_t half = bytes / 2;
  auto second = std::async(std::launch::async, [&] { return crc32c(p + half, bytes - half); });
  const uint32_t first = crc32c(p, half);
  return crc32c_combine(first, second.get(), bytes - half);
}

}  // namespace

std::vector<std::pair<std::string, std::vector<float>>> CheckpointReader::fp8_state() {
  std::vector<std::pair<std::string, std::vector<float>>> out;
  for (const StoredPiece& p : index()) {
    if (p.spec.kind != StateKind::Fp8) continue;
    const Shape& g = p.spec.geom.global_shape;
    TRIPOD_INPUT_CHECK(g.size() == 2 && g[0] == 3 && g[1] >= 2 && p.spec.geom.shard_dim < 0 && p.spec.geom.whole_box() &&
                           p.spec.geom.box_size == g[0],
                       "checkpoint file {}: dataset {} (FP8 state of {}) is {}, not one whole (3, 1 + history) piece",
                       p.file, p.dataset, p.spec.name, shape_str(g));
    for (const auto& [name, v] : out)
      TRIPOD_INPUT_CHECK(name != p.spec.name, "checkpoint {}: the FP8 state of {} is stored twice (in {})", dir_,
                         name, p.file);
    out.emplace_back(p.spec.name, read_piece(p));
  }
  return out;
}

void CheckpointReader::assemble(const std::string& name, StateKind kind, const std::vector<Target>& targets) {
  auto t = tensors().find(name);
  TRIPOD_INPUT_CHECK(t != tensors_.end(), "checkpoint {} has no tensor {}", dir_, name);
  std::vector<int64_t> covered(targets.size(), 0);
  for (const StoredPiece& p : index()) {
    if (p.spec.name != name || p.spec.kind != kind) continue;
    int needed = 0, same = -1;
    for (size_t i = 0; i < targets.size(); ++i)
      if (overlap_count(p.spec.geom, targets[i].geom) > 0) {
        ++needed;
        if (p.spec.geom == targets[i].geom) same = static_cast<int>(i);
      }
    if (needed == 0) continue;
    if (needed == 1 && same >= 0) {  // the same grid's piece: viewed in the mapping, or read straight into the target
      if (const float* m = targets[same].view ? file(p.file).map(p) : nullptr) {
        check_crc(p, crc32c_2threads(m, p.spec.geom.numel()));
        *targets[same].view = m;
      } else {
        read_piece_into(p, targets[same].out);
      }
      covered[same] += p.spec.geom.numel();
      continue;
    }
    std::vector<float> data = read_piece(p);
    for (size_t i = 0; i < targets.size(); ++i)
      covered[i] += copy_overlap(p.spec.geom, data.data(), targets[i].geom, targets[i].out);
  }
  for (size_t i = 0; i < targets.size(); ++i)
    TRIPOD_INPUT_CHECK(covered[i] == targets[i].geom.numel(),
                       "checkpoint {} lacks part of tensor {} ({}): {} of the {} elements needed here are stored "
                       "(a shard file is missing or was not written)",
                       dir_, name, state_kind_name(kind), covered[i], targets[i].geom.numel());
}

}  // namespace tripod
