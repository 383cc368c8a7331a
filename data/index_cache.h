// Cached sample indices: a file holding named int64 arrays and a description of every parameter
// they were built from. A file whose description, sizes, header or payload checksum differ is
// never trusted, and its users range-check every array (load_or_build_cache's `check`) before
// any of it is used: a damaged cache is rebuilt.
//
// Layout (little-endian): "TRIPODIX", u32 version, u32 array count k, u64 description bytes,
// u64 total file bytes, u64 hash_bytes() of everything after the header, then k entries
// {char name[24], u64 count, u64 offset}, the description, and the arrays, each at an 8-aligned
// offset.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "data/mapped_file.h"

namespace tripod {

class Communicator;

struct CacheArray {
  std::string name;  // at most 23 characters
  std::vector<int64_t> values;
};

class IndexCache {
 public:
  // The cache at `path` when it holds exactly `description`; null otherwise, with the reason
  // (missing, stale, foreign, truncated) in `why`.
  static std::unique_ptr<IndexCache> load(const std::string& path, const std::string& description, std::string& why);
  // Writes the arrays to `path` (a temporary name, then renamed) and returns them loaded. When
  // the file cannot be written (a read-only directory) the cache lives in memory, with a warning.
  static std::unique_ptr<IndexCache> create(const std::string& path, const std::string& description,
                                            const std::vector<CacheArray>& arrays);

  // The named array; an empty span when there is none (a check refuses that).
  std::span<const int64_t> array(std::string_view name) const;
  bool in_memory() const { return !image_.empty(); }

 private:
  IndexCache() = default;
  bool parse(const std::string& description, std::string& why);
  MappedFile file_;
  std::vector<uint8_t> image_;  // the file's bytes, when it could not be written
  const uint8_t* base_ = nullptr;
  int64_t size_ = 0;
  std::vector<std::pair<std::string, std::span<const int64_t>>> arrays_;
};

// Range checks of a loaded cache's arrays: "" when every entry is usable, else what is wrong.
using CacheCheck = std::function<std::string(const IndexCache&)>;

// The cache at `path` for `description`, built by `build` when missing, stale or damaged (failing
// `check`). With `sync`, rank 0 builds it while the others wait at a barrier, then loads it; a
// rank that still cannot read it (no shared file system) builds its own. `built` tells whether
// this rank built it.
std::unique_ptr<IndexCache> load_or_build_cache(const std::string& path, const std::string& description,
                                                Communicator* sync,
                                                const std::function<std::vector<CacheArray>()>& build,
                                                const CacheCheck& check, bool* built = nullptr);

}  // namespace tripod
