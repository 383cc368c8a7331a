// Reading a checkpoint directory: metadata, the index of pieces in every file, and assembling
// any slice of any global tensor from the pieces that overlap it (resharding). Every piece read
// is checked against its CRC32C. Bad input (a missing or truncated file, a damaged dataset, a
// checksum failure, a piece missing, a format from the future) is an InputError naming the file
// and the tensor.
#pragma once

#include <nlohmann/json.hpp>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/hdf5_file.h"
#include "checkpoint/shard_spec.h"

namespace tripod {

class CheckpointReader {
 public:
  // Opens a complete checkpoint (ROOT/iter_NNNNNNN): metadata.json parsed and its format checked,
  // every file it lists present with the size it records.
  explicit CheckpointReader(const std::string& dir);
  ~CheckpointReader();

  const std::string& dir() const { return dir_; }
  const nlohmann::json& metadata() const { return meta_; }
  int64_t iteration() const;
  // The pieces of every file (their attributes; read on first use).
  const std::vector<StoredPiece>& index();
  // Global tensors: name -> global shape as saved (the model's: FP8 scaling state is not among
  // them). InputError when pieces disagree.
  const std::map<std::string, Shape>& tensors();
  // The FP8 scaling state (StateKind::Fp8) of every FP8 linear saved, read and checked: (name,
  // (3, 1 + history) floats). InputError on a damaged or malformed piece.
  std::vector<std::pair<std::string, std::vector<float>>> fp8_state();
  bool has_kind(StateKind kind);

  // One slice to fill: a piece geometry of tensor `name` and where its numel() floats go.
  // With `view` set, a target that one stored piece covers exactly may instead be answered with
  // *view = that piece's checked floats in the file's mapping (valid while this reader lives;
  // `out` then stays unwritten).
  struct Target {
    PieceGeom geom;
    float* out;
    const float** view = nullptr;
  };
  // Fills every target from the stored pieces of (name, kind) that overlap it, reading each such
  // piece once and checking its checksum. InputError when a target element is not stored.
  void assemble(const std::string& name, StateKind kind, const std::vector<Target>& targets);
  // Reads one stored piece and checks its checksum.
  std::vector<float> read_piece(const StoredPiece& p);
  // Reads one stored piece into `out` (p.spec.geom.numel() floats) and checks its checksum.
  void read_piece_into(const StoredPiece& p, float* out);

 private:
  H5Reader& file(const std::string& path);
  void check_crc(const StoredPiece& p, uint32_t crc) const;
  std::string dir_;
  nlohmann::json meta_;
  bool indexed_ = false;
  std::vector<StoredPiece> index_;
  std::map<std::string, Shape> tensors_;
  std::map<std::string, std::unique_ptr<H5Reader>> files_;
};

}  // namespace tripod
