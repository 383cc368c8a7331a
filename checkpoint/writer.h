// Saving: a rank's state is first copied to host memory (a Snapshot), then written to its own
// HDF5 file inside ROOT/iter_NNNNNNN.tmp/, then committed collectively: every rank fsyncs its
// file, a barrier, and rank 0 writes metadata.json, renames the directory to iter_NNNNNNN,
// fsyncs the parent and points ROOT/latest at it (temp file + rename). A save killed at any
// moment leaves the previous checkpoint and `latest` untouched; the .tmp directory it leaves is
// never loaded and is removed by the next save.
//
// Who writes what (file pp{PP}_tp{TP}_dp{DP}.h5 of the rank at those coordinates):
// - values: DP rank 0 of each (pp, tp); replicated (non-TP-sharded) parameters from TP rank 0
//   only; tied copies (the embedding on the last stage) never: the owner saves them; under expert
//   parallelism a routed expert's tensors from EDP rank 0 (the DP x CP indices [0, ep), each
//   holding its own experts), the rule of the reduce groups (grad_sync.h);
// - optimizer state (master when separate from the values, m, v): with the distributed optimizer
//   every DP rank its own pieces (flat ranges of the TP-local tensors), else the rank that writes
//   the values.
// So every element of every global tensor and state is stored exactly once.
//
// Asynchronous saves: the snapshot is taken on the calling thread, the file is written on a
// background thread with no MPI in it, and the commit (the only collective part) runs on the
// calling thread at the next save() or at finish(). HDF5 is used by one thread at a time: the
// training loop itself never touches it.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/shard_spec.h"
#include "kernels/op.h"
#include "model/param_registry.h"
#include "parallel/comm/communicator.h"
#include "parallel/data_parallel/grad_reducer.h"
#include "parallel/grid.h"

namespace tripod {

// 2: metadata.json carries metadata_crc32c (version 1 checkpoints still load).
inline constexpr int kCheckpointFormatVersion = 2;

// The optimizer's state over one owned span of the flat buffers (views, not copies).
struct OptimizerShardRef {
  FlatSpan span;
  Tensor master, m, v;  // master undefined when the values are the master
};

// A rank's pieces in host memory.
struct Snapshot {
  std::string file;  // file name in the checkpoint directory; "" when this rank writes none
  std::vector<ShardSpec> specs;
  std::vector<HostFloats> data;
  int64_t bytes() const;
};

// The file of the rank at `c`: "pp00_tp01_dp00.h5".
std::string shard_file_name(const Coords& c);
// The coordinates a rank saves under: its DP x CP index as the data-parallel one (the ranks of a
// DP x CP group hold the same parameters, and the distributed optimizer shards over that group),
// so the files and pieces do not depend on how the sequence was split.
Coords checkpoint_coords(const RankGrid& grid, const Coords& c);
// Whether the rank at `c` (checkpoint_coords) writes a file, under expert parallelism over `ep`.
bool rank_writes_file(const Coords& c, bool distributed_optimizer, bool with_optimizer, int ep = 1);

// Copies this rank's share (see above) of values and optimizer state to host memory.
// `opt` empty: a params-only snapshot. `c`: checkpoint_coords; `ep`: the grid's expert parallelism.
Snapshot take_snapshot(ParamRegistry& reg, Ops& ops, const std::vector<OptimizerShardRef>& opt, const Coords& c,
                       bool distributed_optimizer, int ep = 1);
// Appends FP8 scaling state (model/fp8.h, Fp8Registry::state(): per linear its name and
// (3, 1 + history) floats) to a snapshot, as whole replicated pieces of kind Fp8.
void add_fp8_state(Snapshot& snap, const std::vector<std::pair<std::string, std::vector<float>>>& state);
// The FP8 scaling state a checkpoint holds (CheckpointReader::fp8_state), for Fp8Registry::load_state.
std::vector<std::pair<std::string, std::vector<float>>> read_fp8_state(const std::string& ckpt_dir);
// Writes a snapshot to DIR/snapshot.file (checksums computed here), fsyncs it; returns its bytes.
// Test hook: sleeps `sleep_after_first_ms` after the first tensor, so a test can kill the process
// mid-save (DebugOptions::checkpoint_sleep_ms).
int64_t write_snapshot(Snapshot& snap, const std::string& dir, int sleep_after_first_ms = 0);
// The committed checkpoints in `root` (iter_N directories holding metadata.json): (N, path),
// oldest first; none when `root` does not exist.
std::vector<std::pair<int64_t, std::string>> committed_checkpoints(const std::string& root);
// Rank-0 part of a commit: metadata.json (adding files, sizes and its checksum) into `tmp_dir`,
// fsyncs, renames it to `final_dir` (atomically exchanged with an existing one of the same
// iteration), fsyncs the parent, points ROOT/latest at it unless `latest` names a newer one, then
// deletes this run's (meta's "run_id") older checkpoints beyond `keep` (0: keep all). Used by the
// saver and by `tripod ckpt convert`.
void commit_checkpoint_dir(const std::string& root, const std::string& tmp_dir, const std::string& final_dir,
                           nlohmann::json meta, int keep);

class CheckpointSaver {
 public:
  // `root` is checkpoint.dir. Every rank of `world` constructs one. `test_sleep_ms`: see
  // write_snapshot.
  CheckpointSaver(std::string root, int keep, bool async, Communicator& world, int test_sleep_ms = 0);
  ~CheckpointSaver();  // waits for a running write; an uncommitted save stays a .tmp directory

  // Collective. Commits a pending asynchronous save first. `meta` (rank 0's is used) carries what
  // the caller records: iteration, config, grid, schedule state, RNG; the saver adds format,
  // version and the file list.
  void save(int64_t iteration, Snapshot snap, nlohmann::json meta);
  // Collective: waits for and commits a pending asynchronous save (no-op when none).
  void finish();
  bool pending() const { return pending_; }

 private:
  void commit();
  std::string root_;
  int keep_;
  bool async_;
  Communicator& world_;
  int test_sleep_ms_;
  // The save in flight.
  bool pending_ = false;
  int64_t iteration_ = 0;
  nlohmann::json meta_;
  std::thread thread_;
  std::string error_;  // set by the writer thread
};

}  // namespace tripod
