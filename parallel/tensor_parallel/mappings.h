// The conjugate communication pairs of Megatron-style tensor parallelism, named for the region
// boundary they sit on. Tokens are the first dimension of every tensor here: (N, C) for the whole
// micro-batch, or (N/tp, C) for this rank's slice under sequence parallelism (SP), where the
// slice of TP rank r is tokens [r*N/tp, (r+1)*N/tp) of the flattened (B*T) tokens.
//
//                      forward                        backward
//  enter (f)  no SP:   identity                       all-reduce
//             SP:      all-gather (N/tp -> N)         reduce-scatter (N -> N/tp)
//  exit  (g)  no SP:   all-reduce                     identity
//             SP:      reduce-scatter (N -> N/tp)     all-gather (N/tp -> N)
//
// "enter" precedes column-parallel linears and the vocabulary-parallel head (every rank needs the
// whole input); "exit" follows row-parallel linears and the vocabulary-parallel embedding (the
// ranks hold partial sums). With tp = 1 all four are the identity.
#pragma once

#include "kernels/op.h"
#include "parallel/context.h"

namespace tripod {

// Returns the full (N, C) input; a new tensor charged to `category` under SP, else x itself.
Tensor enter_tp_forward(Ops& ops, const ParallelContext& par, const Tensor& x, MemCategory category);
// dx_full (N, C) -> gradient of the region's input: dx_full reduced in place (no SP) or a new
// (N/tp, C) reduce-scattered tensor charged to `category` (SP).
Tensor enter_tp_backward(Ops& ops, const ParallelContext& par, Tensor& dx_full,
                         MemCategory category = MemCategory::Workspace);
// partial (N, C) -> the summed output: partial reduced in place (no SP) or a new (N/tp, C) slice.
Tensor exit_tp_forward(Ops& ops, const ParallelContext& par, Tensor& partial, MemCategory category);
// dy as this rank holds it -> the full (N, C) gradient of the partial sums.
Tensor exit_tp_backward(Ops& ops, const ParallelContext& par, const Tensor& dy);

// Whether the token dimension is split across TP ranks (sequence parallelism with tp > 1).
bool sequence_parallel(const ParallelContext& par);
// Tokens of this rank's slice: N / tp under SP, N otherwise.
int64_t local_tokens(const ParallelContext& par, int64_t n_tokens);

}  // namespace tripod
