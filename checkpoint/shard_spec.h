// Checkpoint shards describe themselves: which global tensor, which state (value, master, Adam
// m or v), and which elements. A piece is a flat range [flat_begin, flat_end) of a *box* of the
// global tensor: the box is the slice [box_offset, box_offset + box_size) along box_dim() (the
// TP shard; the whole tensor for a replicated parameter), laid out row-major. A TP shard of
// values is a whole box; a distributed-optimizer piece is a flat range of the TP-local tensor.
//
// Worked example: h.0.attn.qkv.weight, global (3, 64, 64), tp = 2, shard_dim 1. TP rank 1's box
// is rows [32, 64) of dim 1: local shape (3, 32, 64), 6144 elements. With dp = 2 and the
// distributed optimizer, DP rank 1 may own flat [3072, 6144) of it: the piece covers local
// (1..2, 16..31, 0..63), i.e. global (1..2, 48..63, :) after adding the box offset to dim 1.
//
// Vocabulary tables are saved with their real rows only (global_shape[0] = vocab_size, not the
// padded size), so a checkpoint loads under a tp whose padding differs; padding rows load as 0.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace tripod {

// Host f32 buffers whose elements are not zero-filled on allocation (they are written right
// after: snapshots and load staging of hundreds of MB).
template <class T> struct UninitAllocator : std::allocator<T> {
  template <class U> struct rebind {
    using other = UninitAllocator<U>;
  };
  UninitAllocator() = default;
  template <class U> UninitAllocator(const UninitAllocator<U>&) {}
  template <class U, class... Args> void construct(U* p, Args&&... args) {
    if constexpr (sizeof...(Args) == 0)
      ::new (static_cast<void*>(p)) U;
    else
      ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};
using HostFloats = std::vector<float, UninitAllocator<float>>;

// Value, Master, M, V: a parameter's values and optimizer state. Fp8: not a parameter's, the
// scaling state of one FP8 linear (delayed recipe, model/fp8.h), named after the linear
// ("h.3.attn.qkv"), one whole replicated piece of (3, 1 + history) floats.
enum class StateKind { Value, Master, M, V, Fp8 };
inline constexpr StateKind kAllStateKinds[] = {StateKind::Value, StateKind::Master, StateKind::M, StateKind::V,
                                               StateKind::Fp8};
const char* state_kind_name(StateKind k);  // "value", "master", "m", "v", "fp8"
StateKind parse_state_kind(const std::string& s);  // throws InputError

// Where a piece lies in its global tensor (no data, no file).
struct PieceGeom {
  Shape global_shape;   // as saved: vocabulary tables without padding rows
  int shard_dim = -1;   // the TP split dimension; -1: replicated (the box is the whole tensor)
  int64_t box_offset = 0, box_size = 0;  // along box_dim()
  int64_t flat_begin = 0, flat_end = 0;  // within the box, row-major

  // The whole of a tensor of shape `shape` as one piece (a converted or verified tensor).
  static PieceGeom whole(const Shape& shape) {
    return {.global_shape = shape, .shard_dim = -1, .box_offset = 0, .box_size = shape.at(0), .flat_begin = 0,
            .flat_end = shape_numel(shape)};
  }
  int box_dim() const { return shard_dim < 0 ? 0 : shard_dim; }
  int64_t numel() const { return flat_end - flat_begin; }
  int64_t box_numel() const { return outer() * box_size * inner(); }
  int64_t outer() const;  // product of the global dims before box_dim()
  int64_t inner() const;  // product of the global dims after box_dim()
  Shape box_shape() const;
  bool whole_box() const { return flat_begin == 0 && flat_end == box_numel(); }
  bool operator==(const PieceGeom&) const = default;
  // Checks the geometry against the global shape; returns "" or what is wrong.
  std::string check() const;
};

// A stored piece: geometry plus identity and checksum.
struct ShardSpec {
  std::string name;  // global name, e.g. "h.3.attn.qkv.weight"
  StateKind kind = StateKind::Value;
  PieceGeom geom;
  uint32_t crc = 0;  // CRC32C of the f32 data
};

// Calls fn(a_index, b_index, length) for each run of elements that pieces `a` and `b` of the same
// global tensor share, indices relative to each piece's first element. For each outer index the
// global rows both boxes hold are contiguous in both layouts ((outer, row, inner) row-major), so
// a run is those rows clipped to both flat ranges. Pieces split along different dims meet only
// when one of them is a whole box of the whole tensor (e.g. converted weights); otherwise
// InputError.
template <class Fn> int64_t for_each_overlap(const PieceGeom& a, const PieceGeom& b, Fn&& fn);

// Copies the elements that `src` and `dst` (pieces of the same global tensor) share, from
// `src_data` (src.numel() floats) into `dst_data` (dst.numel() floats). Returns how many.
int64_t copy_overlap(const PieceGeom& src, const float* src_data, const PieceGeom& dst, float* dst_data);
// How many elements `a` and `b` share (the same walk without copying).
int64_t overlap_count(const PieceGeom& a, const PieceGeom& b);

// "iter_0000042" (7 digits).
std::string iter_dir_name(int64_t iteration);
// The iteration of a directory named iter_NNNNNNN, or -1 for any other name (".tmp" included).
int64_t parse_iter_dir_name(const std::string& name);

// A whole-tensor box re-expressed along `dim` (same elements, same row-major layout).
PieceGeom along_dim(const PieceGeom& g, int dim);  // InputError unless g covers the whole tensor's box

template <class Fn> int64_t for_each_overlap(const PieceGeom& a_in, const PieceGeom& b_in, Fn&& fn) {
  const bool same = a_in.box_dim() == b_in.box_dim();
  const bool a_whole = a_in.box_offset == 0 && a_in.box_size == a_in.global_shape[a_in.box_dim()];
  const PieceGeom a = same || !a_whole ? a_in : along_dim(a_in, b_in.box_dim());
  const PieceGeom b = same || a_whole ? b_in : along_dim(b_in, a_in.box_dim());
  const int64_t g0 = std::max(a.box_offset, b.box_offset);
  const int64_t g1 = std::min(a.box_offset + a.box_size, b.box_offset + b.box_size);
  if (g0 >= g1 || a.numel() == 0 || b.numel() == 0) return 0;
  const int64_t inner = a.inner(), outer = a.outer();
  const int64_t a_row = a.box_size * inner, b_row = b.box_size * inner;  // elements per outer index
  // Only the outer indices that both flat ranges reach.
  const int64_t o_lo = std::max(a.flat_begin / a_row, b.flat_begin / b_row);
  const int64_t o_hi = std::min((a.flat_end - 1) / a_row, (b.flat_end - 1) / b_row);
  int64_t total = 0;
  for (int64_t o = o_lo; o <= o_hi && o < outer; ++o) {
    const int64_t ta = (o * a.box_size + (g0 - a.box_offset)) * inner;  // run start in a's box
    const int64_t tb = (o * b.box_size + (g0 - b.box_offset)) * inner;
    const int64_t len = (g1 - g0) * inner;
    const int64_t lo = std::max<int64_t>({0, a.flat_begin - ta, b.flat_begin - tb});
    const int64_t hi = std::min<int64_t>({len, a.flat_end - ta, b.flat_end - tb});
    if (lo >= hi) continue;
    fn(ta + lo - a.flat_begin, tb + lo - b.flat_begin, hi - lo);
    total += hi - lo;
  }
  return total;
}

}  // namespace tripod
