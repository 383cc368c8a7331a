// A read-only memory map of a whole file, and little-endian loads from unaligned bytes.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace tripod {

class MappedFile {
 public:
  MappedFile() = default;
  // Maps `path` read-only. A missing or unreadable file is an InputError naming it; an empty
  // file maps to size 0 with a null data pointer.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  int64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void release();
  std::string path_;
  const uint8_t* data_ = nullptr;
  int64_t size_ = 0;
};

// Loads a T stored at `p` (any alignment; the files are little-endian like every host we run on).
template <typename T>
inline T load_unaligned(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

}  // namespace tripod
