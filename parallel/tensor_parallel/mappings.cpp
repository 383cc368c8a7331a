// Tensor-parallel region boundaries.
#include "parallel/tensor_parallel/mappings.h"

namespace tripod {

namespace {
bool sp(const ParallelContext& par) { return sequence_parallel(par); }

Shape with_rows(const Tensor& t, int64_t rows) {
  Shape s = t.shape();
  s[0] = rows;
  return s;
}
}  // namespace

bool sequence_parallel(const ParallelContext& par) { return par.sequence_parallel && par.grid.tp() > 1; }

int64_t local_tokens(const ParallelContext& par, int64_t n_tokens) {
  return sp(par) ? n_tokens / par.grid.tp() : n_tokens;
}

Tensor enter_tp_forward(Ops& ops, const ParallelContext& par, const Tensor& x, MemCategory category) {
  if (!sp(par)) return x;
  Tensor full = ops.empty(with_rows(x, x.size(0) * par.grid.tp()), x.dtype(), category);
  par.tp->all_gather(x, full);
  return full;
}

Tensor enter_tp_backward(Ops& ops, const ParallelContext& par, Tensor& dx_full, MemCategory category) {
  if (par.grid.tp() == 1) return dx_full;
  if (!sp(par)) {
    par.tp->all_reduce(dx_full);
    return dx_full;
  }
  Tensor slice = ops.empty(with_rows(dx_full, dx_full.size(0) / par.grid.tp()), dx_full.dtype(), category);
  par.tp->reduce_scatter(dx_full, slice);
  return slice;
}

Tensor exit_tp_forward(Ops& ops, const ParallelContext& par, Tensor& partial, MemCategory category) {
  if (par.grid.tp() == 1) return partial;
  if (!sp(par)) {
    par.tp->all_reduce(partial);
    return partial;
  }
  Tensor slice = ops.empty(with_rows(partial, partial.size(0) / par.grid.tp()), partial.dtype(), category);
  par.tp->reduce_scatter(partial, slice);
  return slice;
}

Tensor exit_tp_backward(Ops& ops, const ParallelContext& par, const Tensor& dy) {
  if (!sp(par)) return dy;
  Tensor full = ops.empty(with_rows(dy, dy.size(0) * par.grid.tp()), dy.dtype(), MemCategory::Workspace);
  par.tp->all_gather(dy, full);
  return full;
}

}  // namespace tripod
