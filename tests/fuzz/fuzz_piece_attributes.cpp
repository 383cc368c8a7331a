// Fuzzes the attributes of checkpoint pieces: an HDF5 file is written with one dataset per piece
// whose attributes (name, kind, dtype, global shape, shard dim, box, flat range, checksums) and
// element count come from the input; the reader must index it, read every piece it accepts and
// reshard it into a fixed target without touching memory outside either.
#include <fuzzer/FuzzedDataProvider.h>
#include <hdf5.h>

#include <limits>
#include <vector>

#include "checkpoint/crc32c.h"
#include "checkpoint/hdf5_file.h"
#include "checkpoint/shard_spec.h"
#include "tests/fuzz/fuzz_util.h"

using namespace tripod;

namespace {

void attr_str(hid_t d, const char* name, const std::string& s) {
  hid_t type = H5Tcopy(H5T_C_S1);
  H5Tset_size(type, std::max<size_t>(1, s.size()));
  hid_t space = H5Screate(H5S_SCALAR);
  hid_t a = H5Acreate2(d, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
  std::string buf = s.empty() ? std::string(1, '\0') : s;
  H5Awrite(a, type, buf.data());
  H5Aclose(a), H5Sclose(space), H5Tclose(type);
}

void attr_i64s(hid_t d, const char* name, const std::vector<int64_t>& v) {
  hsize_t n = v.size();
  hid_t space = n == 0 ? H5Screate(H5S_NULL) : H5Screate_simple(1, &n, nullptr);
  hid_t a = H5Acreate2(d, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
  if (n) H5Awrite(a, H5T_NATIVE_INT64, v.data());
  H5Aclose(a), H5Sclose(space);
}

void attr_u32(hid_t d, const char* name, uint32_t v) {
  hid_t space = H5Screate(H5S_SCALAR);
  hid_t a = H5Acreate2(d, name, H5T_STD_U32LE, space, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(a, H5T_NATIVE_UINT32, &v);
  H5Aclose(a), H5Sclose(space);
}

// A small integer most of the time (so that geometries are often possible), any value sometimes.
int64_t pick(FuzzedDataProvider& in) {
  return in.ConsumeBool() ? in.ConsumeIntegralInRange<int64_t>(-2, 12) : in.ConsumeIntegral<int64_t>();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  quiet_hdf5();
  const std::string path = (fuzz::scratch() / "piece.h5").string();
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (f < 0) return 0;
  const int pieces = in.ConsumeIntegralInRange(1, 3);
  for (int i = 0; i < pieces; ++i) {
    const char* kinds[] = {"value", "master", "m", "v"};
    const std::string group = std::string("/") + kinds[in.ConsumeIntegralInRange(0, 3)];
    if (H5Lexists(f, group.c_str(), H5P_DEFAULT) <= 0) H5Gclose(H5Gcreate2(f, group.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    const hsize_t n = in.ConsumeIntegralInRange<hsize_t>(0, 64);
    std::vector<float> values(n);
    for (auto& v : values) v = in.ConsumeFloatingPoint<float>();
    hid_t space = H5Screate_simple(1, &n, nullptr);
    const std::string ds = group + "/t" + std::to_string(i);
    hid_t d = H5Dcreate2(f, ds.c_str(), H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (n) H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data());
    ShardSpec s;
    s.name = in.ConsumeBool() ? "w" : in.ConsumeRandomLengthString(16);
    std::vector<int64_t> shape(in.ConsumeIntegralInRange(0, 4));
    for (auto& x : shape) x = pick(in);
    s.geom.global_shape = shape;
    s.geom.shard_dim = static_cast<int>(pick(in));
    s.geom.box_offset = pick(in);
    s.geom.box_size = pick(in);
    s.geom.flat_begin = pick(in);
    const bool fits = s.geom.flat_begin <= std::numeric_limits<int64_t>::max() - static_cast<int64_t>(n);
    s.geom.flat_end = in.ConsumeBool() && fits ? s.geom.flat_begin + static_cast<int64_t>(n) : pick(in);
    s.crc = in.ConsumeBool() ? crc32c(values.data(), n * 4) : in.ConsumeIntegral<uint32_t>();
    attr_str(d, "name", s.name);
    attr_str(d, "kind", in.ConsumeBool() ? group.substr(1) : in.ConsumeRandomLengthString(8));
    attr_str(d, "dtype", in.ConsumeBool() ? "f32" : in.ConsumeRandomLengthString(8));
    attr_i64s(d, "global_shape", shape);
    attr_i64s(d, "shard_dim", {s.geom.shard_dim});
    attr_i64s(d, "box_offset", {s.geom.box_offset});
    attr_i64s(d, "box_size", {s.geom.box_size});
    attr_i64s(d, "flat_begin", {s.geom.flat_begin});
    attr_i64s(d, "flat_end", {s.geom.flat_end});
    attr_u32(d, "crc32c", s.crc);
    H5Dclose(d), H5Sclose(space);
  }
  H5Fclose(f);
  fuzz::expect_only_input_errors([&] {
    H5Reader r(path);
    for (const StoredPiece& p : r.index()) {
      std::vector<float> buf(static_cast<size_t>(p.spec.geom.numel()));
      r.read(p, buf.data());
      if (const float* m = r.map(p)) (void)m[p.spec.geom.numel() - 1];
      // Reshard into the whole tensor when it is small.
      PieceGeom whole{.global_shape = p.spec.geom.global_shape, .shard_dim = -1, .box_offset = 0,
                      .box_size = p.spec.geom.global_shape[0], .flat_begin = 0,
                      .flat_end = shape_numel(p.spec.geom.global_shape)};
      if (whole.numel() > (1 << 16)) continue;
      std::vector<float> out(static_cast<size_t>(whole.numel()));
      copy_overlap(p.spec.geom, buf.data(), whole, out.data());
    }
  });
  return 0;
}
