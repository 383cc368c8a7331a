// One checkpoint file (HDF5, serial driver): datasets /<kind>/<global name> holding f32 pieces,
// each with attributes that describe it (see shard_spec.h):
//   name (string), kind (string), dtype ("f32"), global_shape (int64[]), shard_dim (int64),
//   box_offset, box_size (int64: the TP slice along the box dim), global_offset (int64[]: the
//   global index of the box's first element), flat_begin, flat_end (int64: the elements of the
//   box this piece holds, row-major), crc32c (uint32 of the data), attributes_crc32c (uint32 of
//   the other attributes; absent in checkpoints of format 1).
// A whole box is stored with the box's shape; a flat piece of one as a 1-D dataset.
// HDF5 is not thread-safe in this build: one thread at a time may use these classes.
#pragma once

#include <string>
#include <vector>

#include "checkpoint/shard_spec.h"

namespace tripod {

// A piece as found in a file.
struct StoredPiece {
  ShardSpec spec;
  std::string file;     // path
  std::string dataset;  // path inside the file
  int64_t offset = -1;  // where its raw f32 bytes start in the file when they are stored contiguously,
                        // unfiltered and little-endian (read with pread); -1: read through HDF5
};

class H5Writer {
 public:
  // Creates (truncates) `path`. Throws Error on failure.
  explicit H5Writer(const std::string& path);
  ~H5Writer();
  H5Writer(const H5Writer&) = delete;
  H5Writer& operator=(const H5Writer&) = delete;
  // Writes spec.geom.numel() floats; spec.crc must already be set.
  void write(const ShardSpec& spec, const float* data);
  // Closes the file and fsyncs it. Returns its size in bytes.
  int64_t close();

 private:
  std::string path_;
  long long file_ = -1;  // hid_t
  std::vector<std::string> used_;
};

class H5Reader {
 public:
  // Opens `path` read-only. Throws InputError naming the file when it is not a readable HDF5 file.
  explicit H5Reader(const std::string& path);
  ~H5Reader();
  H5Reader(const H5Reader&) = delete;
  H5Reader& operator=(const H5Reader&) = delete;
  // Every piece in the file, from the attributes. Throws InputError naming file and dataset.
  std::vector<StoredPiece> index();
  // Reads a piece's p.spec.geom.numel() floats into `out` and returns their CRC32C (computed as
  // they arrive, while in cache). Throws InputError naming the file and dataset.
  uint32_t read(const StoredPiece& p, float* out);
  // A contiguous piece's floats in a read-only private mapping of the file (valid while this
  // reader lives; tripod never rewrites a checkpoint file), or nullptr when the piece is read
  // through HDF5. The checksum is not checked here. Throws InputError when the file is too short.
  const float* map(const StoredPiece& p);

 private:
  std::string path_;
  long long file_ = -1;
  int fd_ = -1;  // the same file, for pread and mmap of contiguous datasets
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
};

// Silences HDF5's own error printing (errors surface as tripod exceptions). Idempotent.
void quiet_hdf5();
// fsync a file or directory by path; throws Error.
void fsync_path(const std::string& path);

}  // namespace tripod
