// HDF5 files of checkpoint pieces, through the C API.
#include "checkpoint/hdf5_file.h"

#include <fcntl.h>
#include <hdf5.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <future>

#include "checkpoint/crc32c.h"
#include "core/error.h"

namespace tripod {

void quiet_hdf5() {
  static bool done = [] {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    return true;
  }();
  (void)done;
}

void fsync_path(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) TRIPOD_FAIL("cannot open {} to fsync it: {}", path, std::strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) TRIPOD_FAIL("fsync {} failed: {}", path, std::strerror(err));
}

namespace {

// Why writing under `path` failed, when the failing call was HDF5's (which keeps errno but not
// its meaning): errno when it names an I/O cause, else what the file system says now.
std::string io_cause(int err, const std::string& path) {
  for (int e : {ENOSPC, EDQUOT, EROFS, EACCES, EPERM, EIO, EFBIG, ENOENT})
    if (err == e) return std::strerror(err);
  const std::string dir = std::filesystem::path(path).parent_path().string();
  struct statvfs fs{};
  if (::statvfs(dir.empty() ? "." : dir.c_str(), &fs) == 0) {
    if (fs.f_flag & ST_RDONLY) return std::strerror(EROFS);
    if (fs.f_bavail == 0) return std::strerror(ENOSPC);
  }
  return err ? std::strerror(err) : "cause unknown";
}

// RAII for HDF5 handles.
struct Hid {
  hid_t id = -1;
  herr_t (*closer)(hid_t) = nullptr;
  Hid(hid_t i, herr_t (*c)(hid_t)) : id(i), closer(c) {}
  ~Hid() {
    if (id >= 0 && closer) closer(id);
  }
  Hid(const Hid&) = delete;
  Hid& operator=(const Hid&) = delete;
  operator hid_t() const { return id; }
};

void attr_i64s(hid_t obj, const char* name, const std::vector<int64_t>& v) {
  hsize_t n = v.size();
  Hid space(H5Screate_simple(1, &n, nullptr), H5Sclose);
  Hid a(H5Acreate2(obj, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  TRIPOD_CHECK(a.id >= 0 && H5Awrite(a, H5T_NATIVE_INT64, v.data()) >= 0, "writing attribute {}", name);
}

void attr_i64(hid_t obj, const char* name, int64_t v) {
  Hid space(H5Screate(H5S_SCALAR), H5Sclose);
  Hid a(H5Acreate2(obj, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  TRIPOD_CHECK(a.id >= 0 && H5Awrite(a, H5T_NATIVE_INT64, &v) >= 0, "writing attribute {}", name);
}

void attr_u32(hid_t obj, const char* name, uint32_t v) {
  Hid space(H5Screate(H5S_SCALAR), H5Sclose);
  Hid a(H5Acreate2(obj, name, H5T_STD_U32LE, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  TRIPOD_CHECK(a.id >= 0 && H5Awrite(a, H5T_NATIVE_UINT32, &v) >= 0, "writing attribute {}", name);
}

void attr_str(hid_t obj, const char* name, const std::string& s) {
  Hid type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type, std::max<size_t>(1, s.size()));
  H5Tset_strpad(type, H5T_STR_NULLPAD);
  Hid space(H5Screate(H5S_SCALAR), H5Sclose);
  Hid a(H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  std::string buf = s.empty() ? std::string(1, '\0') : s;
  TRIPOD_CHECK(a.id >= 0 && H5Awrite(a, type, buf.data()) >= 0, "writing attribute {}", name);
}

// Reading attributes: false when missing or of the wrong kind.
bool read_i64s(hid_t obj, const char* name, std::vector<int64_t>& out) {
  if (H5Aexists(obj, name) <= 0) return false;
  Hid a(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  Hid space(H5Aget_space(a), H5Sclose);
  hssize_t n = H5Sget_simple_extent_npoints(space);
  if (a.id < 0 || n < 0 || n > 64) return false;
  out.resize(n);
  return H5Aread(a, H5T_NATIVE_INT64, out.data()) >= 0;
}

bool read_i64(hid_t obj, const char* name, int64_t& out) {
  std::vector<int64_t> v;
  if (!read_i64s(obj, name, v) || v.size() != 1) return false;
  out = v[0];
  return true;
}

bool read_u32(hid_t obj, const char* name, uint32_t& out) {
  if (H5Aexists(obj, name) <= 0) return false;
  Hid a(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  return a.id >= 0 && H5Aread(a, H5T_NATIVE_UINT32, &out) >= 0;
}

bool read_str(hid_t obj, const char* name, std::string& out) {
  if (H5Aexists(obj, name) <= 0) return false;
  Hid a(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  Hid type(H5Aget_type(a), H5Tclose);
  if (a.id < 0 || H5Tget_class(type) != H5T_STRING || H5Tis_variable_str(type) > 0) return false;
  size_t n = H5Tget_size(type);
  if (n == 0 || n > (1 << 20)) return false;
  std::string buf(n, '\0');
  if (H5Aread(a, type, buf.data()) < 0) return false;
  out = buf.substr(0, buf.find('\0'));
  return true;
}

// The checksum of a piece's attributes (all but itself): a damaged attribute that still makes a
// possible geometry would otherwise place the data elsewhere.
uint32_t attributes_crc(const ShardSpec& s) {
  const PieceGeom& g = s.geom;
  const std::string text = fmt::format("{}|{}|{}|{}|{}|{}|{}|{}|{:08x}", s.name, state_kind_name(s.kind),
                                       shape_str(g.global_shape), g.shard_dim, g.box_offset, g.box_size,
                                       g.flat_begin, g.flat_end, s.crc);
  return crc32c(text.data(), text.size());
}

// Where dataset d's `n` floats start in the file when they lie there as plain little-endian f32
// (contiguous layout, no filters, allocated); -1 otherwise.
int64_t raw_offset(hid_t d, int64_t n) {
  if constexpr (std::endian::native != std::endian::little) return -1;
  Hid dcpl(H5Dget_create_plist(d), H5Pclose);
  Hid type(H5Dget_type(d), H5Tclose);
  if (dcpl.id < 0 || type.id < 0 || H5Pget_layout(dcpl) != H5D_CONTIGUOUS || H5Pget_nfilters(dcpl) != 0 ||
      H5Tequal(type, H5T_IEEE_F32LE) <= 0)
    return -1;
  const haddr_t off = H5Dget_offset(d);
  if (off == HADDR_UNDEF || H5Dget_storage_size(d) != static_cast<hsize_t>(n) * sizeof(float)) return -1;
  return static_cast<int64_t>(off);
}

}  // namespace

H5Writer::H5Writer(const std::string& path) : path_(path) {
  quiet_hdf5();
  errno = 0;
  file_ = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (file_ < 0) TRIPOD_FAIL("cannot create checkpoint file {}: {}", path, io_cause(errno, path));
}

H5Writer::~H5Writer() {
  if (file_ >= 0) H5Fclose(file_);
}

void H5Writer::write(const ShardSpec& spec, const float* data) {
  const PieceGeom& g = spec.geom;
  const char* kind = state_kind_name(spec.kind);
  std::string group = std::string("/") + kind;
  if (H5Lexists(file_, group.c_str(), H5P_DEFAULT) <= 0) {
    Hid gr(H5Gcreate2(file_, group.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Gclose);
    TRIPOD_CHECK(gr.id >= 0, "creating group {} in {}", group, path_);
  }
  std::string ds = group + "/" + spec.name;
  for (int k = 1; std::find(used_.begin(), used_.end(), ds) != used_.end(); ++k)
    ds = group + "/" + spec.name + "#" + std::to_string(k);
  used_.push_back(ds);
  std::vector<hsize_t> dims;
  if (g.whole_box())
    for (int64_t d : g.box_shape()) dims.push_back(static_cast<hsize_t>(d));
  else
    dims.push_back(static_cast<hsize_t>(g.numel()));
  Hid space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose);
  Hid dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER);  // every element is written right away
  Hid d(H5Dcreate2(file_, ds.c_str(), H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT), H5Dclose);
  if (d.id < 0) TRIPOD_FAIL("creating dataset {} in checkpoint file {}: {}", ds, path_, io_cause(errno, path_));
  errno = 0;
  if (g.numel() > 0 && H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0)
    TRIPOD_FAIL("writing dataset {} to checkpoint file {}: {}", ds, path_, io_cause(errno, path_));
  attr_str(d, "name", spec.name);
  attr_str(d, "kind", kind);
  attr_str(d, "dtype", "f32");
  attr_i64s(d, "global_shape", g.global_shape);
  attr_i64(d, "shard_dim", g.shard_dim);
  attr_i64(d, "box_offset", g.box_offset);
  attr_i64(d, "box_size", g.box_size);
  std::vector<int64_t> goff(g.global_shape.size(), 0);
  goff[g.box_dim()] = g.box_offset;
  attr_i64s(d, "global_offset", goff);
  attr_i64(d, "flat_begin", g.flat_begin);
  attr_i64(d, "flat_end", g.flat_end);
  attr_u32(d, "crc32c", spec.crc);
  attr_u32(d, "attributes_crc32c", attributes_crc(spec));
}

int64_t H5Writer::close() {
  if (file_ >= 0) {
    errno = 0;
    herr_t rc = H5Fclose(file_);
    file_ = -1;
    if (rc < 0) TRIPOD_FAIL("writing checkpoint file {} (closing it): {}", path_, io_cause(errno, path_));
  }
  fsync_path(path_);
  return static_cast<int64_t>(std::filesystem::file_size(path_));
}

H5Reader::H5Reader(const std::string& path) : path_(path) {
  quiet_hdf5();
  file_ = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (file_ < 0) throw InputError(fmt::format("checkpoint file {} is not a readable HDF5 file (damaged?)", path));
  fd_ = ::open(path.c_str(), O_RDONLY);
  // Ask the kernel to read the whole file ahead: the disk streams while pieces are checked (they
  // are visited by tensor, not in file order).
  if (fd_ >= 0) ::posix_fadvise(fd_, 0, 0, POSIX_FADV_WILLNEED);
}

H5Reader::~H5Reader() {
  if (file_ >= 0) H5Fclose(file_);
  if (map_) ::munmap(map_, map_bytes_);
  if (fd_ >= 0) ::close(fd_);
}

const float* H5Reader::map(const StoredPiece& p) {
  if (p.offset < 0 || fd_ < 0) return nullptr;
  if (!map_) {
    struct stat st;
    if (::fstat(fd_, &st) != 0 || st.st_size <= 0) return nullptr;
    void* m = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd_, 0);
    if (m == MAP_FAILED) return nullptr;
    ::madvise(m, static_cast<size_t>(st.st_size), MADV_WILLNEED);
    map_ = m;
    map_bytes_ = static_cast<size_t>(st.st_size);
  }
  const size_t bytes = static_cast<size_t>(p.spec.geom.numel()) * sizeof(float);
  if (static_cast<size_t>(p.offset) > map_bytes_ || bytes > map_bytes_ - static_cast<size_t>(p.offset))
    throw InputError(fmt::format("checkpoint file {}: dataset {} cannot be read (truncated or damaged): it ends "
                                 "past the end of the file", path_, p.dataset));
  return reinterpret_cast<const float*>(static_cast<const char*>(map_) + p.offset);
}

std::vector<StoredPiece> H5Reader::index() {
  std::vector<StoredPiece> out;
  for (StateKind kind : kAllStateKinds) {
    std::string group = std::string("/") + state_kind_name(kind);
    if (H5Lexists(file_, group.c_str(), H5P_DEFAULT) <= 0) continue;
    Hid gr(H5Gopen2(file_, group.c_str(), H5P_DEFAULT), H5Gclose);
    H5G_info_t info;
    if (gr.id < 0 || H5Gget_info(gr, &info) < 0)
      throw InputError(fmt::format("checkpoint file {}: group {} is unreadable (damaged?)", path_, group));
    for (hsize_t i = 0; i < info.nlinks; ++i) {
      char name[4096];
      ssize_t len = H5Lget_name_by_idx(gr, ".", H5_INDEX_NAME, H5_ITER_INC, i, name, sizeof name, H5P_DEFAULT);
      if (len < 0 || len >= static_cast<ssize_t>(sizeof name))
        throw InputError(fmt::format("checkpoint file {}: entry {} of {} is unreadable (damaged?)", path_, i, group));
      StoredPiece p;
      p.file = path_;
      p.dataset = group + "/" + name;
      Hid d(H5Dopen2(file_, p.dataset.c_str(), H5P_DEFAULT), H5Dclose);
      std::string kind_s, dtype;
      PieceGeom& g = p.spec.geom;
      int64_t shard_dim = 0;
      bool ok = d.id >= 0 && read_str(d, "name", p.spec.name) && read_str(d, "kind", kind_s) &&
                read_str(d, "dtype", dtype) && read_i64s(d, "global_shape", g.global_shape) &&
                read_i64(d, "shard_dim", shard_dim) && read_i64(d, "box_offset", g.box_offset) &&
                read_i64(d, "box_size", g.box_size) && read_i64(d, "flat_begin", g.flat_begin) &&
                read_i64(d, "flat_end", g.flat_end) && read_u32(d, "crc32c", p.spec.crc);
      if (!ok)
        throw InputError(fmt::format("checkpoint file {}: dataset {} lacks its attributes (damaged or not a tripod "
                                     "checkpoint)", path_, p.dataset));
      g.shard_dim = static_cast<int>(shard_dim);
      if (kind_s != state_kind_name(kind) || dtype != "f32")
        throw InputError(fmt::format("checkpoint file {}: dataset {} has kind '{}' and dtype '{}' (expected {} and f32)",
                                     path_, p.dataset, kind_s, dtype, state_kind_name(kind)));
      p.spec.kind = kind;
      uint32_t attrs_crc = 0;  // absent in checkpoints of format 1
      if (H5Aexists(d, "attributes_crc32c") > 0 &&
          (!read_u32(d, "attributes_crc32c", attrs_crc) || attrs_crc != attributes_crc(p.spec)))
        throw InputError(fmt::format("checkpoint file {}: dataset {} ({}): its attributes fail their checksum "
                                     "(attributes_crc32c): the file is damaged", path_, p.dataset, p.spec.name));
      std::string bad = g.check();
      if (!bad.empty())
        throw InputError(fmt::format("checkpoint file {}: dataset {} ({}) has an impossible geometry: {}", path_,
                                     p.dataset, p.spec.name, bad));
      Hid space(H5Dget_space(d), H5Sclose);
      if (H5Sget_simple_extent_npoints(space) != g.numel())
        throw InputError(fmt::format("checkpoint file {}: dataset {} ({}) holds {} elements but its attributes say {}",
                                     path_, p.dataset, p.spec.name, H5Sget_simple_extent_npoints(space), g.numel()));
      p.offset = raw_offset(d, g.numel());
      out.push_back(std::move(p));
    }
  }
  return out;
}

uint32_t H5Reader::read(const StoredPiece& p, float* out) {
  const int64_t n = p.spec.geom.numel();
  if (p.offset >= 0 && fd_ >= 0) {
    // Plain pread of the raw bytes, a cache-sized chunk at a time, each checksummed while hot;
    // a large piece in two halves on two threads (copying out of the page cache and the
    // checksum are bound by one core's memory bandwidth), their checksums combined.
    auto* dst = reinterpret_cast<char*>(out);
    auto read_range = [&](size_t begin, size_t end) {
      constexpr size_t kChunk = 1 << 20;
      uint32_t crc = 0;
      for (size_t at = begin; at < end;) {
        const ssize_t got = ::pread(fd_, dst + at, std::min(kChunk, end - at), p.offset + static_cast<int64_t>(at));
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0)
          throw InputError(fmt::format("checkpoint file {}: dataset {} cannot be read (truncated or damaged): {}",
                                       path_, p.dataset, got < 0 ? std::strerror(errno) : "unexpected end of file"));
        crc = crc32c(dst + at, static_cast<size_t>(got), crc);
        at += static_cast<size_t>(got);
      }
      return crc;
    };
    const size_t bytes = static_cast<size_t>(n) * sizeof(float);
    if (bytes < (8u << 20)) return read_range(0, bytes);
    const size_t half = bytes / 2 / 4096 * 4096;
    auto second = std::async(std::launch::async, read_range, half, bytes);
    const uint32_t first = read_range(0, half);
    return crc32c_combine(first, second.get(), bytes - half);
  }
  Hid d(H5Dopen2(file_, p.dataset.c_str(), H5P_DEFAULT), H5Dclose);
  if (d.id < 0) throw InputError(fmt::format("checkpoint file {}: dataset {} cannot be opened", path_, p.dataset));
  Hid space(H5Dget_space(d), H5Sclose);
  if (H5Sget_simple_extent_npoints(space) != n)
    throw InputError(fmt::format("checkpoint file {}: dataset {} does not hold {} elements", path_, p.dataset, n));
  if (n > 0 && H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, out) < 0)
    throw InputError(fmt::format("checkpoint file {}: dataset {} cannot be read (truncated or damaged)", path_,
                                 p.dataset));
  return crc32c(out, static_cast<size_t>(n) * sizeof(float));
}

}  // namespace tripod
