// `tripod calibrate`'s measurements: GEMM, attention and memory-bound rates of this rank's
// backend (OpenBLAS/OpenMP on CPUs; cuBLASLt, cuDNN and CUDA kernels on GPUs), and collectives
// and point-to-point transfers over the world communicator (MPI, or NCCL with one rank per GPU),
// written into a Hardware whose tables the cost model then interpolates. Every call is timed at
// the size training runs it at: the sizes that fill the device (default_grid) or one model's
// exact shapes (model_grid).
#pragma once

#include <vector>

#include "kernels/op.h"
#include "model/config.h"
#include "parallel/comm/communicator.h"
#include "plan/hardware.h"

namespace tripod {

// One memory-bound call: `rows` x `width` elements. width: the model width of the norms, the
// residual add and the embedding (whose table has `vocab` rows), the vocabulary shard of the
// cross-entropy's logits, SwiGLU's hidden width (its input is twice that), the rotated heads x
// `head_dim` of rope (rows: tokens, positions restarting every `seq`); 1 for GELU's and AdamW's
// flat elements.
struct ElementwiseShape {
  Elementwise op = Elementwise::Add;
  int64_t rows = 0, width = 1, vocab = 0, head_dim = 0, seq = 0;
  int64_t elements() const { return rows * width; }
};

// One attention call as training makes it: `batch` sequences x `heads` query heads of length t
// and head dimension d over `kv_heads` key/value heads (0: as many; qkv (batch, t, heads + 2
// kv_heads, d)); the file records batch x heads as its pairs.
struct AttentionShape {
  int64_t t = 0, d = 0, batch = 1, heads = 1, kv_heads = 0;
  int64_t pairs() const { return batch * heads; }
  int64_t kv() const { return kv_heads > 0 ? kv_heads : heads; }
};

struct CalibrateGrid {
  std::vector<GemmPoint> gemm;                  // (m, n, k) shapes
  std::vector<AttentionShape> attention;        // calls
  std::vector<ElementwiseShape> elementwise;    // memory-bound calls
  std::vector<int64_t> message_bytes;           // collectives and point-to-point
  int64_t cache_bytes = 0;                      // last-level cache: the calls' tensors rotate through twice it
  int repeats = 5;                              // timings per point; the median is kept
  double min_time_s = 0.05;                     // each timing loops the operation at least this long
};

// The sizes that fill `device` (`info`: its memory and last-level cache; 0 fields: unknown):
//   GEMMs    m (tokens of a micro-batch) 2048 .. 131072 on GPUs (256 .. 4096 on CPUs) with every
//            n and k of 512 .. 16384 (64 .. 1024): transformer layers' shapes up to a micro-batch
//            of 128 sequences of 1024 tokens;
//   attention  per sequence length and head dimension, calls of 1, 4, 16, ... (sequence, head)
//            pairs (micro-batch x heads: up to 16 heads, then sequences) up to
//            `attention_tokens(device)` / t pairs: what a micro-batch holds;
//   memory-bound ops  calls of 4^k elements from a launch's latency (2^16 on GPUs, 2^12 on
//            CPUs) up to 8x the last-level cache (at least 2^28 elements on GPUs, 2^24 on CPUs);
//   messages  64 KiB .. 256 MiB (4 KiB .. 16 MiB on CPUs).
// Each backward call (GEMM, attention, layer norm, GELU) and collective is timed on the next of
// as many copies of its tensors as span twice the last-level cache (at most 64), as training
// finds them: out of cache.
// Shapes whose tensors would take more than a quarter of the device's memory are left out.
// GPUs loop each timing for 10 ms, CPUs (shared machines) for 50 ms.
CalibrateGrid default_grid(Device device, const Ops::DeviceInfo& info = {});
// (sequence, head) pairs x tokens of the largest attention call of the default grid.
int64_t attention_tokens(Device device);
// Exactly the shapes of one model, for every tp (dividing the heads, at most `max_tp`) and
// micro-batch size: its layers' and head's GEMMs, its attention over micro-batch x heads/tp
// (with its key/value heads: a grouped-query call as the model makes it),
// its norms (LayerNorm or RMSNorm), residual adds, GELU or SwiGLU, rope (its query and key heads),
// embedding and cross-entropy at their tensors' sizes (the
// sequence-parallel slices too), AdamW and an add (the gradients' zeroing and norm) over its
// parameters per tp (and halves of them, as pipeline stages and the distributed optimizer shard
// them), and its activation messages and gradient buckets of `bucket_bytes` (parallel.bucket_mb;
// 0: none) added to the default message sizes. `info` as for default_grid.
CalibrateGrid model_grid(Device device, const ModelConfig& model, int max_tp, const std::vector<int>& micro_batches,
                         int64_t bucket_bytes = 0, const Ops::DeviceInfo& info = {});

// Measures into `hw` (which keeps its other fields: capacity, the inter-node link, ...). Every
// rank measures at once, as in training (they share the machine), and every rank's `hw` gets
// each point's slowest rank's median (ranks in lockstep move at the slowest's pace). `world`
// may be null (one rank: no collectives).
void calibrate(Ops& ops, Communicator* world, const CalibrateGrid& grid, Hardware& hw);
// Every measured time of `hw` (GEMM, attention, memory-bound and collective points) becomes the
// largest over the ranks of `world`: the slowest rank's.
void keep_slowest(Communicator& world, Hardware& hw);

}  // namespace tripod
