// Resharding: a rank's parameters and optimizer state filled from a checkpoint written under any
// grid. The targets are the rank's TP-local tensors (values) and the flat ranges of them its
// optimizer owns (all of them, or its DP slice with the distributed optimizer); each is
// assembled from whichever stored pieces overlap it (checkpoint/reader.h).
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "checkpoint/load.h"
#include "checkpoint/shard_spec.h"
#include "checkpoint/writer.h"
#include "parallel/comm/communicator.h"

namespace tripod {

// The saved geometry of a parameter's TP-local tensor: vocabulary padding rows cut off (so the
// box can be shorter than the local tensor, never longer).
PieceGeom saved_geometry(const ParamSpec& spec);

struct LoadResult {
  nlohmann::json metadata;
  bool optimizer_loaded = false;  // false: a params-only checkpoint, the optimizer starts fresh
};

// Collective over `world`: loads values and (when the checkpoint has it) optimizer state into
// this rank's registry and optimizer shards. Everything is read and checked into host memory
// first (a piece that fills a target exactly is checked where it lies, in a read-only mapping of
// its file, and copied from there; resharded pieces are assembled into staging buffers); only
// when every rank succeeded is anything changed. Otherwise every rank throws
// InputError; the lowest failing rank's carries the message, the others' are empty (main prints
// nothing for them).
LoadResult load_checkpoint(const std::string& ckpt_dir, ParamRegistry& reg, Ops& ops,
                           const std::vector<OptimizerShardRef>& opt, Communicator& world);

}  // namespace tripod
