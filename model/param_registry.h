// ParamRegistry: every parameter of this rank, registered once with its global name, global
// shape and how it is sharded. The DP reducer, the distributed optimizer, grad-norm clipping and
// checkpoints read this registry; nothing else computes shard shapes.
//
// Values live in one flat buffer in the compute dtype and gradients in one flat f32 buffer, both
// in registration order with each parameter aligned to kAlign elements (except packed ones, which
// follow their predecessor directly), so buckets and optimizer shards are plain ranges of those
// buffers. Buffers (ParamSpec::buffer: state that is not trained, e.g. a router's selection bias)
// are registered alike but kept apart: f32 values in a small buffer of their own, no gradient,
// outside the flat buffers (so no optimizer, reducer or grad norm sees them); checkpoints save and
// load them with the parameters (tensors()).
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/tensor.h"
#include "kernels/op.h"

namespace tripod {

enum class Init { Normal, Zeros, Ones };

struct ParamSpec {
  std::string name;    // global name, e.g. "h.3.attn.qkv.weight"
  Shape global_shape;  // shape of the whole (unsharded) tensor
  int shard_dim = -1;  // dimension split across TP ranks; -1: replicated across TP
  int64_t shard_offset = 0, shard_size = 0;  // this rank's extent along shard_dim
  bool decay = false;                        // AdamW weight decay applies
  // Under sequence parallelism each TP rank's gradient covers only its token slice, so the
  // gradients are summed across TP before use (LayerNorm weights).
  bool sp_partial_grad = false;
  // A copy of a parameter owned by another stage (the tied embedding on the last pipeline
  // stage): kept in sync, but counted in the grad norm and saved by the owner only.
  bool tied_copy = false;
  // For a vocabulary table: rows at or beyond this global index are padding (initialised to zero,
  // never used). -1: not a vocabulary table.
  int64_t vocab_rows = -1;
  Init init = Init::Zeros;
  float stddev = 0.f;
  int chunk = 0;  // the pipeline model chunk (virtual stage) of this rank that owns it
  // Laid out directly after the previously registered parameter, with no alignment gap, so that
  // consecutive packed parameters sharded on dim 0 form one matrix: q, k and v (whose head counts
  // differ under grouped-query attention) are one column-parallel GEMM weight, and so are a
  // SwiGLU's gate and up, while each is still its own tensor (own name, shape and TP shard) for
  // the optimizer and checkpoints.
  bool packed = false;
  // Each TP rank's gradient covers only its own heads (a per-head norm's weight, replicated): the
  // gradients are summed across TP before use, with or without sequence parallelism.
  bool tp_partial_grad = false;
  // Not trained: f32 state changed by the model itself between steps (a router's selection bias),
  // replicated, saved and loaded like a parameter's values. See the file comment.
  bool buffer = false;
  // A routed expert's tensor: the expert's global index (expert parallelism shards experts, and
  // their gradients are reduced over the expert-data-parallel group); -1: not an expert's.
  int expert = -1;

  Shape local_shape() const;
  int64_t local_numel() const { return shape_numel(local_shape()); }
  // Counted in the global grad norm by this rank (replicated copies count once, on tp rank 0).
  bool counts_in_norm(int tp_rank) const { return !tied_copy && !buffer && (shard_dim >= 0 || tp_rank == 0); }
};

struct Param {
  ParamSpec spec;
  int64_t offset = 0;  // into the flat buffers (a buffer's: into the buffers' own storage)
  Tensor value;        // (local shape), compute dtype, a view into the flat values (a buffer's: f32)
  Tensor grad;         // (local shape), f32, a view into the flat gradients (a buffer has none)
  int64_t numel() const { return spec.local_numel(); }
};

class ParamRegistry {
 public:
  static constexpr int64_t kAlign = 64;

  ParamRegistry() = default;
  ParamRegistry(const ParamRegistry&) = delete;  // the name index points into params_
  ParamRegistry& operator=(const ParamRegistry&) = delete;
  ParamRegistry(ParamRegistry&&) = default;  // a deque's elements keep their addresses
  ParamRegistry& operator=(ParamRegistry&&) = default;

  // Registers a parameter (or a buffer, spec.buffer); the returned reference stays valid (tensors
  // bound by allocate()).
  Param& add(ParamSpec spec);
  // Allocates the flat buffers and binds every parameter's views.
  void allocate(Ops& ops);
  bool allocated() const { return values_.defined(); }
  // Fills every parameter from its spec: Normal draws from a counter-based stream keyed by
  // (seed, global name, global element index), so values do not depend on the grid.
  void initialize(Ops& ops, uint64_t seed);
  void zero_grads(Ops& ops) { ops.fill(grads_, 0.f); }

  // The trained parameters, in registration order (buffers are not among them).
  std::deque<Param>& params() { return params_; }
  const std::deque<Param>& params() const { return params_; }
  std::deque<Param>& buffers() { return buffers_; }
  const std::deque<Param>& buffers() const { return buffers_; }
  // Every tensor a checkpoint holds: the parameters, then the buffers.
  std::vector<Param*> tensors();
  // A parameter or buffer by its global name.
  Param* find(const std::string& name);
  // The values (or f32 gradients: `flat` is either buffer) of parameters each packed after the one
  // before, as one (rows, cols) matrix: the sum of their local dim-0 extents by the common
  // remaining extent (cols = 1 for vectors).
  static Tensor packed_view(const Tensor& flat, std::span<Param* const> parts);
  Tensor& flat_values() { return values_; }
  Tensor& flat_grads() { return grads_; }
  int64_t flat_size() const { return size_; }
  // Elements of the buffers' own f32 storage (MemCategory::Params).
  int64_t buffer_size() const { return buffer_size_; }

 private:
  std::deque<Param> params_;                        // a deque: the Param& handed out stay valid
  std::deque<Param> buffers_;
  std::unordered_map<std::string, Param*> by_name_;  // every parameter and buffer by its global name
  int64_t size_ = 0, buffer_size_ = 0;
  Tensor values_, grads_, buffer_values_;
};

// The weight (out, in) and optional bias (out) of a linear layer: one parameter each, or several
// packed ones (q, k, v; gate, up) read as one. The views are valid once the registry is allocated.
struct LinearParams {
  ParamRegistry* reg = nullptr;
  std::vector<Param*> w, b;  // b empty: no bias
  Tensor weight() const { return view(w, false); }
  Tensor weight_grad() const { return view(w, true); }
  Tensor bias() const { return b.empty() ? Tensor{} : view(b, false).view({out_features()}); }
  Tensor bias_grad() const { return b.empty() ? Tensor{} : view(b, true).view({out_features()}); }
  int64_t out_features() const { return weight().size(0); }

 private:
  Tensor view(const std::vector<Param*>& ps, bool grad) const;
};

// Fills `out` (host f32, the spec's local shape) with the initial values of that shard.
void init_shard_values(const ParamSpec& spec, uint64_t seed, float* out);

}  // namespace tripod
