// A machine as the planner sees it: datasheet rates (configs/hardware/*.toml) and, when
// `tripod calibrate` measured them, tables of kernel and collective times that replace the
// datasheet figures wherever they cover a shape. Times are seconds, sizes bytes, rates per second.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/device.h"

namespace tripod {

// One link class (inside a node, or between nodes), per GPU and direction.
struct Link {
  double bandwidth = 0;  // bytes/s
  double latency = 0;    // seconds per message (or per ring step)
};

// A measured GEMM y (m, n) = x (m, k) w (n, k)^T: forward, and its two backward GEMMs together
// (dx = dy w and dw = dy^T x, with the bias gradient).
struct GemmPoint {
  int64_t m = 0, n = 0, k = 0;
  double forward_s = 0, backward_s = 0;
};

// One call of causal attention over `pairs` (sequence, head) pairs (micro-batch x heads) of
// length t and head dimension d: the call's forward and backward times. Files written before
// calibration recorded `pairs` hold per-pair times, read as calls of one pair.
struct AttentionPoint {
  int64_t t = 0, d = 0;
  double forward_s = 0, backward_s = 0;
  int64_t pairs = 1;
  // The call's nominal FLOPs: QK^T and PV over the causal lower triangle (backward: 2.5x).
  double flops(bool backward) const { return 2.0 * t * t * d * pairs * (backward ? 2.5 : 1.0); }
};

// Memory-bound op families: forward and backward of each. Llama's RMSNorm, SwiGLU and rotary
// embedding have their own (SwiGLU reads two inputs per output, rope computes its angles).
enum class Elementwise { LayerNorm, Gelu, Add, CrossEntropy, Embedding, AdamW, RmsNorm, SwiGlu, Rope, Count };
const char* elementwise_name(Elementwise e);
// A per-element time at no recorded size (the [elementwise] table of files written before
// calibration recorded sizes).
struct ElementwiseRate {
  double forward_s = 0, backward_s = 0;  // seconds per element; 0: not measured
};
// One call of a memory-bound op over `elements` elements (logits for the cross-entropy,
// parameters for AdamW, outputs for SwiGLU, rotated values for rope, tokens x width for the
// rest): the call's forward and backward times.
struct ElementwisePoint {
  Elementwise op = Elementwise::Add;
  int64_t elements = 0;
  double forward_s = 0, backward_s = 0;
};

enum class Collective { AllReduce, AllGather, ReduceScatter, SendRecv, Count };
const char* collective_name(Collective c);
// One measured collective over `ranks` ranks of one node; bytes: the full tensor (all-reduce,
// the gathered output of all-gather, the input of reduce-scatter, the message of send/recv).
struct CollectivePoint {
  Collective op = Collective::AllReduce;
  int ranks = 2;
  int64_t bytes = 0;
  double seconds = 0;
};

struct Hardware {
  std::string name;
  Device device = Device::CUDA;     // what tripod computes on: CUDA (bf16) or the CPU (f32)
  double peak_flops = 0;            // dense, in the compute dtype (bf16 on GPUs, f32 on CPUs)
  double peak_flops_f32 = 0;        // dense f32 (informative on GPUs)
  double memory_bandwidth = 0;      // bytes/s
  double memory_capacity = 0;       // bytes per device
  double reserved_memory = 0;       // bytes not available to tripod: CUDA context, library workspaces
  int gpus_per_node = 1;
  Link intra, inter;
  // When no GEMM table covers a shape: peak * gemm_efficiency * d / (d + gemm_half_dim), d the
  // smallest of (m, n, k): thin GEMMs run further below peak.
  double gemm_efficiency = 0.8, gemm_half_dim = 128;
  double attention_efficiency = 0.5;  // fraction of peak reached by fused attention
  double memory_efficiency = 0.8;     // fraction of memory_bandwidth reached by elementwise kernels
  double collective_efficiency = 0.8; // fraction of link bandwidth reached by collectives
  // Whether bucketed DP reductions run while the backward computes (NCCL on its own stream:
  // yes; MPI on CPUs progresses only inside MPI calls: no).
  bool overlap_dp = true;

  std::vector<GemmPoint> gemm;
  std::vector<AttentionPoint> attention;
  std::vector<ElementwisePoint> elementwise_points;
  ElementwiseRate elementwise[static_cast<int>(Elementwise::Count)];  // where no point was measured
  std::vector<CollectivePoint> collectives;
  // What a reader should know about the file (a calibration of an older tripod, sized for no
  // device): load_hardware logs them as warnings.
  std::vector<std::string> warnings;

  bool bf16() const { return device == Device::CUDA; }
  int64_t act_bytes() const { return bf16() ? 2 : 4; }

  // Kernel times. gemm_time: forward (backward = false) or both backward GEMMs. attention_time:
  // one call over `pairs` (sequence, head) pairs, at the rate measured calls of the same total
  // FLOPs reach (by sequence length, at the nearest head dimension). elementwise_time: one call
  // over `elements`, at the per-element time of measured calls of that size.
  double gemm_time(int64_t m, int64_t n, int64_t k, bool backward) const;
  double attention_time(int64_t pairs, int64_t t, int64_t d, bool backward) const;
  double elementwise_time(Elementwise e, int64_t elements, bool backward) const;
  // A collective over `ranks` ranks (inside one node when `intra_node`).
  double collective_time(Collective op, int ranks, int64_t bytes, bool intra_node) const;
};

// Reads a hardware file. Unknown keys or sections, missing required keys and impossible values
// are InputErrors naming the file and key. load_hardware logs the file's warnings (an older
// calibration: attention points without `pairs`, per-element times without sizes).
Hardware load_hardware(const std::string& path);
Hardware parse_hardware(const std::string& text, const std::string& origin);
std::string hardware_to_toml(const Hardware& hw);
// Datasheet figures for a device when no hardware file is given (what layers_per_stage = "auto"
// balances a training run with): configs/hardware/h100_sxm.toml's for cuda; for cpu a 16-core
// AVX2 server (1 TFLOP/s f32, 100 GB/s, one rank per node).
Hardware default_hardware(Device device);

}  // namespace tripod
