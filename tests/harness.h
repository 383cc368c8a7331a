// Building models and trainers in tests: configs, contexts on MPI sub-grids, weight I/O.
#pragma once

#include <mpi.h>

#include <filesystem>
#include <map>
#include <memory>
#include <sstream>
#include <string>

#include "parallel/comm/mpi_comm.h"
#include "parallel/context.h"
#include "config/config.h"
#include "train/trainer.h"

namespace tripod::test {

// A config for a small GPT on synthetic data (every value spelled out, so tests read clearly).
inline Config tiny_config(int n_layers = 2, int d_model = 32, int n_heads = 4, int seq_len = 16, int vocab = 64) {
  Config c;
  c.model = {.n_layers = n_layers, .n_heads = n_heads, .d_model = d_model, .ffn_hidden = 0, .seq_len = seq_len,
             .max_positions = 0, .vocab_size = vocab};
  c.train.device = Device::CPU;
  c.train.micro_batch_size = 2;
  c.train.global_batch_size = 8;
  c.train.steps = 5;
  c.train.lr = 1e-3;
  c.train.warmup_steps = 0;
  c.train.log_interval = 1000000;
  c.train.output_dir = "";
  c.data.synthetic = true;
  return c;
}

// Turns a config's model into a Llama-family decoder of the same size (RMSNorm, rope with theta
// 500000, SwiGLU, `n_kv_heads` key/value heads, no biases, untied head), as model.arch = Arch::Llama.
inline void make_llama(ModelConfig& m, int n_kv_heads) {
  m.arch = Arch::Llama;
  m.norm = NormKind::RmsNorm;
  m.position = PositionKind::Rope;
  m.rope_theta = 500000.0;
  m.mlp = MlpKind::SwiGlu;
  m.ffn_hidden = 3 * m.d_model;
  m.n_kv_heads = n_kv_heads;
  m.bias = false;
  m.tie_embeddings = false;
}

// The world's ranks [first, first + grid size) form a context for `grid`; ranks outside get none.
// Collective over MPI_COMM_WORLD.
struct SubWorld {
  std::unique_ptr<MpiComm> comm;  // over the member ranks
  std::unique_ptr<ParallelContext> par;
};

inline SubWorld make_subworld(Ops& ops, const RankGrid& grid, bool sequence_parallel = false,
                              CpComm cp_comm = CpComm::Ring, MoeDispatcher dispatcher = MoeDispatcher::AllToAll) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  bool member = rank < grid.world_size();
  MPI_Comm comm;
  MPI_Comm_split(MPI_COMM_WORLD, member ? 0 : MPI_UNDEFINED, rank, &comm);
  SubWorld w;
  if (!member) return w;
  std::vector<int> ranks(grid.world_size());
  for (int i = 0; i < grid.world_size(); ++i) ranks[i] = i;
  w.comm = std::make_unique<MpiComm>(comm, "test", &ops, 120.0, ranks);
  ContextOptions options;
  options.sequence_parallel = sequence_parallel;
  options.cp_comm = cp_comm;
  options.moe_dispatcher = dispatcher;
  w.par = std::make_unique<ParallelContext>(make_parallel_context(*w.comm, grid, options));
  return w;
}

// A (1,1,1) context over this process alone (for serial reference runs inside MPI tests).
inline SubWorld make_selfworld(Ops& ops) {
  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_SELF, &comm);
  SubWorld w;
  w.comm = std::make_unique<MpiComm>(comm, "self", &ops, 120.0, std::vector<int>{0});
  w.par = std::make_unique<ParallelContext>(make_parallel_context(*w.comm, RankGrid(1, 1, 1), {}));
  return w;
}

// A fresh directory every rank of MPI_COMM_WORLD shares, named by rank 0's process id (so two
// test runs on one machine never share one), removed by rank 0 when every rank is done with it.
// Construct and destroy it on every rank together.
class SharedDir {
 public:
  explicit SharedDir(const std::string& name);
  ~SharedDir();
  SharedDir(const SharedDir&) = delete;
  SharedDir& operator=(const SharedDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& leaf) const { return path_ / leaf; }

 private:
  std::filesystem::path path_;
  int rank_ = 0;
};

// How parallel runs are held to the serial one: the loss of every step within 1e-5 relative; all
// weights together within 1e-5 relative (L2); each tensor within 1e-4 relative. The per-tensor
// bound is looser because tensors that start at zero (biases) are made only of Adam updates, and
// Adam passes the relative rounding error of a cancelling gradient sum (~1e-5) straight into them.
inline constexpr double kLossTol = 1e-5, kWeightsTol = 1e-5, kTensorTol = 1e-4;

// Runs `cfg` for cfg.train.steps on the grid of `par`: the loss of every step and the final
// whole parameters (gathered to every rank of the grid).
struct RunResult {
  std::vector<double> losses;
  std::map<std::string, std::vector<float>> params;
};
RunResult run_training(Config cfg, Ops& ops, ParallelContext& par, const SampleSource& data);

// The relative difference ||a - b|| / ||b|| (L2 norms) of all parameters taken together.
double global_relative_difference(const std::map<std::string, std::vector<float>>& a,
                                  const std::map<std::string, std::vector<float>>& b);
// The largest per-tensor relative difference ||a - b|| / ||b|| (L2 norms) over the tensors.
double max_relative_difference(const std::map<std::string, std::vector<float>>& a,
                               const std::map<std::string, std::vector<float>>& b, std::string* worst = nullptr);

// Expects `run` to match `serial` by the tolerances above; prints the figures when `print`.
void expect_matches(const RunResult& run, const RunResult& serial, const std::string& label, bool print);

// The full (global) value of every parameter, gathered to every rank of the grid as host f32
// vectors keyed by name (TP shards concatenated along their shard dim, PP stages merged).
std::map<std::string, std::vector<float>> gather_global_params(ParamRegistry& reg, ParallelContext& par, Ops& ops,
                                                               bool grads = false);

// The inverse of gather_global_params: sets every parameter of `reg` (allocated) to its shard of
// the whole tensors in `global` (as gather_global_params returns them; vocabulary padding rows
// become zero), so any grid can hold exactly the weights another grid trained.
void set_global_params(const std::map<std::string, std::vector<float>>& global, ParamRegistry& reg, Ops& ops);

}  // namespace tripod::test
