// FP8 linear layers (train.precision = "fp8"): the QKV, attention projection and MLP GEMMs of a
// transformer layer run with FP8 operands (kernels/fp8.h): the input and the weight in e4m3 in the
// forward, the output gradient in e5m2 in the backward (Transformer Engine's HYBRID format):
//   forward   y (N, O)  = x (N, I) w^T + b      fp8_gemm(x_q, w_q)          (e4m3 x e4m3)
//   input     dx (N, I) = dy (N, O) w            fp8_gemm(dy_q, w_q^T)       (e5m2 x e4m3)
//   weight    dw (O, I) += dy^T x                fp8_gemm(dy_q^T, x_q^T)     (e5m2 x e4m3)
//   bias      db (O) += sum_n dy                 from the high-precision dy
// Each operand tensor has one scale (per tensor, per use): q = fp8(x * s).
//   tensorwise: s from the tensor's own amax when it is cast (the max taken over the TP ranks
//               holding parts of it, and over the CP ranks holding parts of its tokens), so every
//               rank computes exactly the numbers of the one-rank run.
//   delayed:    s from the max of the last train.fp8_amax_history steps' amaxes of that operand,
//               fixed for a step (Transformer Engine's DelayedScaling, amax_compute_algo "max");
//               each step's amax is the max over every rank (TP, CP and DP), so every rank holds
//               the same history and scales, which are saved in checkpoints once per layer and
//               load under any grid.
// Both: s = (max of the format / amax) / 2^train.fp8_margin; a zero or non-finite amax keeps the
// previous scale (1 at first). The weight is cast once per step (kept with its transpose) and the
// cast is invalidated when the optimizer changes the weights. The weight gradient's operands are
// cast again from the tensors the backward keeps anyway (bf16), with the same scales, so FP8
// keeps no activation of its own; what it holds persistently (the weights' casts and the scaling
// state) is charged to parameters (fp8_persistent_bytes).
//
// Collectives: tensorwise all-reduces (max) one amax per TP-sharded operand cast, over TP, and per
// activation cast over CP, inside the layer (so every rank of a TP or CP group casts in the same
// order: they run the same schedule); delayed all-reduces the step's amaxes once per step, over TP
// and DP x CP (Fp8Registry::end_step). Tensor-parallel activations and their collectives stay in
// bf16.
#pragma once

#include <array>
#include <deque>
#include <string>
#include <vector>

#include "kernels/op.h"
#include "model/config.h"
#include "parallel/context.h"

namespace tripod {

struct ChunkLayout;
class Fp8Registry;

// The three operands of a linear layer's GEMMs, and the forward output (amax only).
enum class Fp8Operand { X = 0, W = 1, DY = 2 };
inline constexpr int kFp8Operands = 3;
inline constexpr int kFp8Amaxes = 4;  // x, w, dy, and the forward output y

// One linear layer's FP8 GEMMs and the scaling of their operands. Owned by the Fp8Registry.
class Fp8Linear {
 public:
  // y (N, O) = x (N, I) w^T + b (O, optional).
  void forward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y);
  // dx (N, I) = dy (N, O) w.
  void backward_input(const Tensor& dy, const Tensor& w, Tensor& dx);
  // dw (O, I) f32 += dy^T x; db (O) f32 += sum_n dy (skipped when undefined). Given the tensor
  // backward_input had (its bytes unchanged since), it reuses that call's cast of dy.
  void backward_weight(const Tensor& dy, const Tensor& x, Tensor& dw, Tensor& db);
  const std::string& name() const { return name_; }

 private:
  friend class Fp8Registry;
  struct Cast {
    Tensor q, qt, scale;  // scale (2) f32 = {s, 1/s}
  };
  // Casts x (R, C) for `op` into q and/or its transpose. record: the cast's amax is kept (max over
  // the step) and, with `count`, its clipped elements are counted.
  Cast cast(Fp8Operand op, const Tensor& x, bool want_q, bool want_qt, bool count);
  // The weight's cast of this step (made at its first use).
  void ensure_weight(const Tensor& w);
  // Whether operand `op` of this layer is split over TP (its amax is reduced there) and whether
  // this rank counts its clipped elements (each element counted on one rank).
  bool tp_sharded(Fp8Operand op) const;
  bool counts(Fp8Operand op) const;
  Tensor slot(const Tensor& t, int index, int width) const;
  Tensor step_amax(Fp8Operand op) const;  // (1) f32: this step's amax of `op`

  Fp8Registry* reg_ = nullptr;
  std::string name_;
  int index_ = 0;            // among the registry's layers
  int global_ = 0;           // 4 * layer + kind: the layer's place in the whole model
  bool row_parallel_ = false;  // input split over TP (attention and MLP projections)
  Tensor wq_, wqt_;          // (O, I), (I, O) e4m3: the weight's cast of this step
  bool weight_valid_ = false;
  // The output gradient's transposed cast from backward_input, for the backward_weight that
  // follows with the very same tensor (the usual backward; a zero-bubble W often gets a copy or a
  // re-gathered one, and casts again): the tensor's bytes (weakly) and the cast.
  struct DyCast {
    std::weak_ptr<const Storage> storage;
    const void* data = nullptr;
    Shape shape;
    Cast cast;
  } dy_cast_;
};

// Per-layer FP8 figures of one step for the report (metrics.jsonl "fp8"): the scales the step
// used (tensorwise: the smallest over its casts), the amaxes (of x, w, dy, and the forward output
// y: cuBLASLt's amax of D, for a row-parallel linear under TP that of its partial sums, before the
// all-reduce) and the clipped (saturated) counts, summed and maxed over every rank.
struct Fp8Stats {
  int64_t step = 0;
  std::vector<std::string> names;  // "h.3.attn.qkv": the model's FP8 GEMMs, by layer
  std::vector<std::array<double, kFp8Operands>> scale, saturated;
  std::vector<std::array<double, kFp8Amaxes>> amax;
};

// The FP8 state of every FP8 linear layer of this rank: scales, this step's amaxes and clipped
// counts on the device (one flat buffer each, so a step's reductions are one collective each),
// the delayed recipe's histories on the host, and the weights' casts.
class Fp8Registry {
 public:
  Fp8Registry(Ops& ops, const ParallelContext& par, const Fp8Config& cfg, int n_layers);
  Fp8Registry(const Fp8Registry&) = delete;
  Fp8Registry& operator=(const Fp8Registry&) = delete;

  const Fp8Config& config() const { return cfg_; }
  // Whether layer `layer` runs in FP8 (train.fp8_bf16_layers keep the ends in bf16).
  bool fp8_layer(int layer) const { return cfg_.fp8_layer(layer, n_layers_); }
  // Registers linear `kind` (0 qkv, 1 attention projection, 2 MLP input, 3 MLP projection) of
  // `layer`, named e.g. "h.3.attn.qkv", with its TP-local weight (out, in). Its weight cast is
  // allocated here; the scaling state by allocate().
  Fp8Linear* add(const std::string& name, int layer, int kind, bool row_parallel, int64_t out, int64_t in);
  // Allocates the scaling state (after every add) and sets every scale to 1.
  void allocate();
  int size() const { return static_cast<int>(linears_.size()); }

  // Step boundaries (collective over the world, in the same order on every rank): begin_step
  // zeroes the step's amaxes and counts; end_step (delayed, after the step's loss is known)
  // reduces the amaxes over TP and DP x CP, pushes them into the histories and computes the next
  // step's scales (a skipped step leaves the state as it was); weights_changed invalidates the
  // weight casts (after the optimizer's update, a checkpoint load).
  void begin_step();
  void end_step(bool skipped);
  void weights_changed();

  // Collective over the world: this step's figures of the whole model, on world rank 0 (others
  // get an empty names list).
  Fp8Stats gather_stats(int64_t step, Communicator& world);

  // The delayed recipe's state of each FP8 linear as (3, 1 + history) floats: per operand its
  // scale, then its amax history, newest first. Identical on every rank holding the layer.
  std::vector<std::pair<std::string, std::vector<float>>> state() const;
  // Restores the state of the linears named in `saved` (a history of another length is cut or
  // padded with zeros); those not named keep a fresh state. Returns how many were restored.
  int load_state(const std::vector<std::pair<std::string, std::vector<float>>>& saved);

 private:
  friend class Fp8Linear;
  void upload_scales();

  Ops& ops_;
  const ParallelContext& par_;
  Fp8Config cfg_;
  int n_layers_;
  std::deque<Fp8Linear> linears_;
  // Device: scales_ (G * 3, 2) = {s, 1/s} per operand; amax_ (G * 4); saturated_ (G * 3).
  Tensor scales_, amax_, saturated_;
  // Host: the delayed recipe's scales and histories (G * 3, history), newest first.
  std::vector<float> host_scales_, history_;
  std::vector<float> used_scales_;  // the scales of the step just ended (for the report)
};

// The linear layer through `fp8` when it runs in FP8, else through the backend's own GEMMs.
void linear_forward(Ops& ops, Fp8Linear* fp8, const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y);
void linear_backward_input(Ops& ops, Fp8Linear* fp8, const Tensor& dy, const Tensor& w, Tensor& dx);
void linear_backward_weight(Ops& ops, Fp8Linear* fp8, const Tensor& dy, const Tensor& x, Tensor& dw, Tensor& db);

// "12 linears in FP8 (layers 0-3 of 4); in the 2 mixture-of-experts layers among them the
// attention's only (...)": what the start-up log and --dry-run say.
std::string fp8_summary(const ModelConfig& cfg, const Fp8Config& fp8);

// The FP8 linears of a rank holding `chunks` (Fp8Config::linears of each layer): what its
// Fp8Registry holds once the model is built.
int fp8_linear_count(const ModelConfig& cfg, const Fp8Config& fp8, const std::vector<ChunkLayout>& chunks);

// The bytes FP8 keeps on a rank holding `chunks` (charged to MemCategory::Params): the weights'
// casts (two bytes per weight element of every FP8 linear) and the scaling state (52 bytes per
// linear). What plan_rank_memory adds to the parameters.
int64_t fp8_persistent_bytes(const ModelConfig& cfg, const Fp8Config& fp8, int tp,
                             const std::vector<ChunkLayout>& chunks);

}  // namespace tripod
