// Index cache files.
#include "data/index_cache.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "data/hash.h"
#include "parallel/comm/communicator.h"

namespace tripod {

namespace {

constexpr char kMagic[8] = {'T', 'R', 'I', 'P', 'O', 'D', 'I', 'X'};
constexpr uint32_t kVersion = 2;
constexpr int64_t kHeaderBytes = 40, kEntryBytes = 40, kNameBytes = 24;

int64_t align8(int64_t x) { return (x + 7) & ~int64_t{7}; }

std::vector<uint8_t> make_image(const std::string& description, const std::vector<CacheArray>& arrays) {
  const int64_t k = static_cast<int64_t>(arrays.size());
  int64_t offset = align8(kHeaderBytes + kEntryBytes * k + static_cast<int64_t>(description.size()));
  std::vector<int64_t> offsets;
  for (const auto& a : arrays) {
    TRIPOD_CHECK(a.name.size() < kNameBytes, "cache array name '{}' is too long", a.name);
    offsets.push_back(offset);
    offset += 8 * static_cast<int64_t>(a.values.size());
  }
  std::vector<uint8_t> img(static_cast<size_t>(offset), 0);
  auto put = [&](int64_t at, const void* p, size_t n) { std::memcpy(img.data() + at, p, n); };
  put(0, kMagic, 8);
  uint32_t version = kVersion, count = static_cast<uint32_t>(k);
  uint64_t dbytes = description.size(), total = static_cast<uint64_t>(offset);
  put(8, &version, 4);
  put(12, &count, 4);
  put(16, &dbytes, 8);
  put(24, &total, 8);
  for (int64_t i = 0; i < k; ++i) {
    int64_t e = kHeaderBytes + kEntryBytes * i;
    put(e, arrays[i].name.data(), arrays[i].name.size());
    uint64_t n = arrays[i].values.size(), off = static_cast<uint64_t>(offsets[i]);
    put(e + kNameBytes, &n, 8);
    put(e + kNameBytes + 8, &off, 8);
    put(offsets[i], arrays[i].values.data(), 8 * n);
  }
  put(kHeaderBytes + kEntryBytes * k, description.data(), description.size());
  const uint64_t payload = hash_bytes(img.data() + kHeaderBytes, img.size() - kHeaderBytes);
  put(32, &payload, 8);
  return img;
}

}  // namespace

bool IndexCache::parse(const std::string& description, std::string& why) {
  if (size_ < kHeaderBytes || std::memcmp(base_, kMagic, 8) != 0) {
    why = "not an index cache";
    return false;
  }
  uint32_t version = load_unaligned<uint32_t>(base_ + 8), k = load_unaligned<uint32_t>(base_ + 12);
  uint64_t dbytes = load_unaligned<uint64_t>(base_ + 16), total = load_unaligned<uint64_t>(base_ + 24);
  if (version != kVersion) {
    why = fmt::format("cache version {}, want {}", version, kVersion);
    return false;
  }
  if (total != static_cast<uint64_t>(size_)) {
    why = fmt::format("{} bytes but its header says {} (truncated?)", size_, total);
    return false;
  }
  if (load_unaligned<uint64_t>(base_ + 32) != hash_bytes(base_ + kHeaderBytes, size_ - kHeaderBytes)) {
    why = "its contents fail their checksum (damaged)";
    return false;
  }
  const int64_t desc_at = kHeaderBytes + kEntryBytes * static_cast<int64_t>(k);
  if (k > 64 || dbytes != description.size() || desc_at + static_cast<int64_t>(dbytes) > size_ ||
      std::memcmp(base_ + desc_at, description.data(), dbytes) != 0) {
    why = "built from other parameters or data (stale or foreign)";
    return false;
  }
  for (uint32_t i = 0; i < k; ++i) {
    const uint8_t* e = base_ + kHeaderBytes + kEntryBytes * i;
    std::string name(reinterpret_cast<const char*>(e), strnlen(reinterpret_cast<const char*>(e), kNameBytes));
    uint64_t n = load_unaligned<uint64_t>(e + kNameBytes), off = load_unaligned<uint64_t>(e + kNameBytes + 8);
    if (off % 8 != 0 || off > static_cast<uint64_t>(size_) || n > (static_cast<uint64_t>(size_) - off) / 8) {
      why = fmt::format("array '{}' lies outside the file", name);
      return false;
    }
    arrays_.emplace_back(name, std::span<const int64_t>(reinterpret_cast<const int64_t*>(base_ + off), n));
  }
  return true;
}

std::unique_ptr<IndexCache> IndexCache::load(const std::string& path, const std::string& description,
                                             std::string& why) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    why = "not built yet";
    return nullptr;
  }
  std::unique_ptr<IndexCache> c(new IndexCache());
  try {
    c->file_ = MappedFile(path);
  } catch (const InputError& e) {
    why = e.what();
    return nullptr;
  }
  c->base_ = c->file_.data();
  c->size_ = c->file_.size();
  if (!c->parse(description, why)) return nullptr;
  return c;
}

std::unique_ptr<IndexCache> IndexCache::create(const std::string& path, const std::string& description,
                                               const std::vector<CacheArray>& arrays) {
  std::vector<uint8_t> img = make_image(description, arrays);
  const std::string tmp = fmt::format("{}.tmp-{}", path, ::getpid());
  std::string failure;
  if (std::FILE* f = std::fopen(tmp.c_str(), "wb")) {
    bool ok = std::fwrite(img.data(), 1, img.size(), f) == img.size();
    ok = (std::fclose(f) == 0) && ok;
    std::error_code ec;
    if (ok) std::filesystem::rename(tmp, path, ec);
    if (!ok || ec) {
      failure = ok ? ec.message() : std::strerror(errno);
      std::filesystem::remove(tmp, ec);
    }
  } else {
    failure = std::strerror(errno);
  }
  std::string why;
  if (failure.empty())
    if (auto c = load(path, description, why)) return c;
  spdlog::warn("{}: cannot write the index cache ({}); keeping it in memory", path, failure.empty() ? why : failure);
  std::unique_ptr<IndexCache> c(new IndexCache());
  c->image_ = std::move(img);
  c->base_ = c->image_.data();
  c->size_ = static_cast<int64_t>(c->image_.size());
  TRIPOD_CHECK(c->parse(description, why), "in-memory index cache does not parse: {}", why);
  return c;
}

std::span<const int64_t> IndexCache::array(std::string_view name) const {
  for (const auto& [n, a] : arrays_)
    if (n == name) return a;
  return {};
}

std::unique_ptr<IndexCache> load_or_build_cache(const std::string& path, const std::string& description,
                                                Communicator* sync,
                                                const std::function<std::vector<CacheArray>()>& build,
                                                const CacheCheck& check, bool* built) {
  if (built) *built = false;
  std::unique_ptr<IndexCache> cache;
  std::string why;
  auto build_here = [&] {
    spdlog::info("building {} ({})", path, why);
    cache = IndexCache::create(path, description, build());
    const std::string bad = check(*cache);
    TRIPOD_CHECK(bad.empty(), "{}: the index just built fails its checks: {}", path, bad);
    if (built) *built = true;
  };
  // A cache that loads but fails the range checks is damaged: rebuilt like a stale one.
  auto load_checked = [&] {
    cache = IndexCache::load(path, description, why);
    if (cache && !(why = check(*cache)).empty()) {
      spdlog::warn("{}: damaged index cache ({}); rebuilding it", path, why);
      cache.reset();
    }
  };
  if (!sync || sync->rank() == 0) {
    load_checked();
    if (!cache) build_here();
  }
  if (sync) sync->barrier();
  if (!cache) {
    load_checked();
    if (!cache) {
      spdlog::warn("{}: not readable after rank 0 built it ({}); building it on this rank", path, why);
      build_here();
    }
  }
  return cache;
}

}  // namespace tripod
