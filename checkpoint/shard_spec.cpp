// Piece geometry and the overlap walk that resharding is made of.
#include "checkpoint/shard_spec.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace tripod {

const char* state_kind_name(StateKind k) {
  switch (k) {
    case StateKind::Value: return "value";
    case StateKind::Master: return "master";
    case StateKind::M: return "m";
    case StateKind::V: return "v";
    case StateKind::Fp8: return "fp8";
  }
  return "?";
}

StateKind parse_state_kind(const std::string& s) {
  for (StateKind k : kAllStateKinds)
    if (s == state_kind_name(k)) return k;
  throw InputError(fmt::format("unknown state kind '{}' (valid: value, master, m, v, fp8)", s));
}

int64_t PieceGeom::outer() const {
  int64_t n = 1;
  for (int d = 0; d < box_dim(); ++d) n *= global_shape[d];
  return n;
}

int64_t PieceGeom::inner() const {
  int64_t n = 1;
  for (size_t d = box_dim() + 1; d < global_shape.size(); ++d) n *= global_shape[d];
  return n;
}

Shape PieceGeom::box_shape() const {
  Shape s = global_shape;
  s[box_dim()] = box_size;
  return s;
}

std::string PieceGeom::check() const {
  if (global_shape.empty()) return "an empty global shape";
  int64_t numel = 1;  // at most 2^53, so that no product of dims below overflows (fuzzing found it)
  for (int64_t d : global_shape) {
    if (d <= 0) return fmt::format("global shape {} has a non-positive dimension", shape_str(global_shape));
    if (numel > (int64_t{1} << 53) / d)
      return fmt::format("global shape {} has too many elements", shape_str(global_shape));
    numel *= d;
  }
  if (shard_dim >= static_cast<int>(global_shape.size()) || shard_dim < -1)
    return fmt::format("shard_dim {} for global shape {}", shard_dim, shape_str(global_shape));
  if (shard_dim < 0 && (box_offset != 0 || box_size != global_shape[0]))
    return fmt::format("a replicated tensor with box [{}, +{})", box_offset, box_size);
  if (box_offset < 0 || box_size < 0 || box_offset > global_shape[box_dim()] ||
      box_size > global_shape[box_dim()] - box_offset)
    return fmt::format("box [{}, +{}) outside dim {} of {}", box_offset, box_size, box_dim(), shape_str(global_shape));
  if (flat_begin < 0 || flat_end < flat_begin || flat_end > box_numel())
    return fmt::format("flat range [{}, {}) outside the box of {} elements", flat_begin, flat_end, box_numel());
  return "";
}

PieceGeom along_dim(const PieceGeom& g, int dim) {
  const bool whole_tensor = g.box_offset == 0 && g.box_size == g.global_shape[g.box_dim()];
  if (!whole_tensor || dim < 0 || dim >= static_cast<int>(g.global_shape.size()))
    throw InputError(fmt::format("a piece split along dim {} of {} cannot meet one split along dim {}", g.box_dim(),
                                 shape_str(g.global_shape), dim));
  PieceGeom out = g;
  out.shard_dim = dim;
  out.box_offset = 0;
  out.box_size = g.global_shape[dim];
  return out;
}

int64_t copy_overlap(const PieceGeom& src, const float* src_data, const PieceGeom& dst, float* dst_data) {
  return for_each_overlap(src, dst, [&](int64_t si, int64_t di, int64_t n) {
    std::memcpy(dst_data + di, src_data + si, static_cast<size_t>(n) * sizeof(float));
  });
}

int64_t overlap_count(const PieceGeom& a, const PieceGeom& b) {
  return for_each_overlap(a, b, [](int64_t, int64_t, int64_t) {});
}

std::string iter_dir_name(int64_t iteration) { return fmt::format("iter_{:07d}", iteration); }

int64_t parse_iter_dir_name(const std::string& name) {
  if (name.size() < 12 || name.size() > 5 + 18 || name.rfind("iter_", 0) != 0) return -1;  // 18 digits fit int64
  int64_t v = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

}  // namespace tripod
