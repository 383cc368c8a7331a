// Loading parameter values from a checkpoint into any grid (for eval, generate and tests).
#pragma once

#include <string>

#include "kernels/op.h"
#include "model/param_registry.h"

namespace tripod {

// The checkpoint directory that `load` names: "latest" -> the one named in DIR/latest (`dir` is
// checkpoint.dir); a checkpoint directory (holding metadata.json) -> itself; a checkpoint root
// (holding `latest`), or its `latest` file itself -> the one it names. InputError when there is none.
std::string resolve_checkpoint(const std::string& load, const std::string& dir);

// Fills the values of every parameter of `reg` (allocated) from the checkpoint at `ckpt_dir` (an
// iter_NNNNNNN directory, see resolve_checkpoint), whatever grid wrote it: each parameter's TP
// shard is assembled from the stored pieces that overlap it (the master weights when saved,
// else the values); vocabulary padding rows become zero. Not collective: every rank reads what
// it needs. InputError (nothing changed) when a tensor is missing or has another shape, or a
// file is missing, truncated or damaged. Returns the checkpoint's iteration.
int64_t load_param_values(const std::string& ckpt_dir, ParamRegistry& reg, Ops& ops);

}  // namespace tripod
