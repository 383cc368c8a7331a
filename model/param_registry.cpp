// Parameter registration, flat buffers and grid-independent initialisation.
#include "model/param_registry.h"

#include <omp.h>

#include "core/rng.h"

namespace tripod {

Shape ParamSpec::local_shape() const {
  Shape s = global_shape;
  if (shard_dim >= 0) s.at(shard_dim) = shard_size;
  return s;
}

Param& ParamRegistry::add(ParamSpec spec) {
  TRIPOD_CHECK(!values_.defined(), "parameter {} registered after allocation", spec.name);
  TRIPOD_CHECK(!by_name_.contains(spec.name), "parameter {} registered twice", spec.name);
  if (spec.shard_dim >= 0)
    TRIPOD_CHECK(spec.shard_dim < static_cast<int>(spec.global_shape.size()) && spec.shard_size > 0 &&
                     spec.shard_offset + spec.shard_size <= spec.global_shape[spec.shard_dim],
                 "parameter {}: shard [{}, +{}) of dim {} of {}", spec.name, spec.shard_offset, spec.shard_size,
                 spec.shard_dim, shape_str(spec.global_shape));
  if (spec.buffer) {
    TRIPOD_CHECK(!spec.packed && spec.shard_dim < 0, "buffer {} must be replicated and not packed", spec.name);
    Param& b = buffers_.emplace_back();
    b.spec = std::move(spec);
    b.offset = buffer_size_;
    buffer_size_ += b.spec.local_numel();
    by_name_.emplace(b.spec.name, &b);
    return b;
  }
  TRIPOD_CHECK(!spec.packed || !params_.empty(), "parameter {} is packed but has no predecessor", spec.name);
  const int64_t at = spec.packed ? params_.back().offset + params_.back().numel() : size_;
  Param& p = params_.emplace_back();
  p.spec = std::move(spec);
  p.offset = at;
  int64_t end = at + p.spec.local_numel();
  size_ = (end + kAlign - 1) / kAlign * kAlign;
  by_name_.emplace(p.spec.name, &p);
  return p;
}

void ParamRegistry::allocate(Ops& ops) {
  values_ = ops.empty({size_}, ops.compute_dtype(), MemCategory::Params);
  grads_ = ops.empty({size_}, DType::F32, MemCategory::Grads);
  ops.fill(values_, 0.f);  // the alignment gaps stay zero
  ops.fill(grads_, 0.f);
  for (Param& p : params_) {
    int64_t n = p.spec.local_numel();
    p.value = values_.flat(p.offset, p.offset + n).view(p.spec.local_shape());
    p.grad = grads_.flat(p.offset, p.offset + n).view(p.spec.local_shape());
  }
  if (buffers_.empty()) return;
  buffer_values_ = ops.empty({buffer_size_}, DType::F32, MemCategory::Params);
  for (Param& b : buffers_)
    b.value = buffer_values_.flat(b.offset, b.offset + b.spec.local_numel()).view(b.spec.local_shape());
}

std::vector<Param*> ParamRegistry::tensors() {
  std::vector<Param*> out;
  for (Param& p : params_) out.push_back(&p);
  for (Param& b : buffers_) out.push_back(&b);
  return out;
}

Param* ParamRegistry::find(const std::string& name) {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

Tensor ParamRegistry::packed_view(const Tensor& flat, std::span<Param* const> parts) {
  const Param& first = *parts.front();
  const Shape local = first.spec.local_shape();
  const int64_t cols = local.size() > 1 ? first.numel() / local[0] : 1;
  int64_t end = first.offset;
  for (const Param* p : parts) {
    TRIPOD_CHECK(p->offset == end && p->numel() % cols == 0, "parameter {} is not packed after {}", p->spec.name,
                 first.spec.name);
    end += p->numel();
  }
  return flat.flat(first.offset, end).view({(end - first.offset) / cols, cols});
}

Tensor LinearParams::view(const std::vector<Param*>& ps, bool grad) const {
  if (ps.size() == 1) {
    const Tensor& t = grad ? ps[0]->grad : ps[0]->value;
    const int64_t cols = t.dim() > 1 ? t.size(-1) : 1;
    return t.view({t.numel() / cols, cols});
  }
  return ParamRegistry::packed_view(grad ? reg->flat_grads() : reg->flat_values(), ps);
}

void init_shard_values(const ParamSpec& spec, uint64_t seed, float* out) {
  const Shape local = spec.local_shape();
  const int64_t n = shape_numel(local);
  if (spec.init == Init::Zeros || spec.init == Init::Ones) {
    std::fill(out, out + n, spec.init == Init::Ones ? 1.f : 0.f);
    return;
  }
  // Map each local element to its global flat index. Row-major strides of the global shape.
  const Shape& g = spec.global_shape;
  const int nd = static_cast<int>(g.size());
  std::vector<int64_t> gstride(nd, 1);
  for (int d = nd - 2; d >= 0; --d) gstride[d] = gstride[d + 1] * g[d + 1];
  const int64_t row_stride = nd > 1 ? gstride[0] : 1;  // elements per global row (dim 0)
  const CounterRng rng(seed, hash_name(spec.name));
  // Each value depends only on its global index, so threads take contiguous ranges (a billion
  // values take minutes on one core).
#pragma omp parallel
  {
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t begin = n * t / threads, end = n * (t + 1) / threads;
    std::vector<int64_t> idx(nd, 0);  // the local multi-index of element `begin`
    for (int64_t d = nd - 1, rest = begin; d >= 0; --d) {
      idx[d] = rest % local[d];
      rest /= local[d];
    }
    for (int64_t i = begin; i < end; ++i) {
      int64_t flat = 0;
      for (int d = 0; d < nd; ++d) {
        int64_t gi = idx[d] + (d == spec.shard_dim ? spec.shard_offset : 0);
        flat += gi * gstride[d];
      }
      bool padding = spec.vocab_rows >= 0 && flat / row_stride >= spec.vocab_rows;
      out[i] = padding ? 0.f : static_cast<float>(rng.normal(static_cast<uint64_t>(flat)) * spec.stddev);
      for (int d = nd - 1; d >= 0; --d) {  // advance the local multi-index
        if (++idx[d] < local[d]) break;
        idx[d] = 0;
      }
    }
  }
}

void ParamRegistry::initialize(Ops& ops, uint64_t seed) {
  CpuAllocator host;
  for (Param* pp : tensors()) {
    Param& p = *pp;
    Tensor h = Tensor::empty(host, p.spec.local_shape(), DType::F32, MemCategory::Workspace);
    init_shard_values(p.spec, seed, h.data<float>());
    ops.copy(h, p.value);
  }
}

}  // namespace tripod
