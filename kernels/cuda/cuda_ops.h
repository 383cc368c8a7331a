// The CUDA backend: bf16 weights and activations, f32 gradients, master weights and Adam states;
// GEMMs on cuBLASLt (bias and GELU fused in epilogues), causal attention through cuDNN's fused
// scaled-dot-product attention, own kernels for the rest. One instance per rank and GPU.
//
// Streams: every op runs on the compute stream, in issue order. NCCL transfers run on each
// communicator's own stream, which waits for the compute stream before each transfer and is
// waited for by it afterwards (parallel/comm/nccl_comm.cpp), so communication overlaps compute.
// The host waits for the GPU only where a number is asked for on the host (sum, sum_squares,
// copies to host memory) and in synchronize().
//
// Debug switches (DebugOptions): the attention kernels (attention_runner.h) and per-op-family GPU
// time (cuda_timing, see take_times()).
#pragma once

#include <cuda_runtime_api.h>

#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/debug_options.h"
#include "kernels/cuda/allocators.h"
#include "kernels/cuda/kernels.h"
#include "kernels/op.h"

struct cublasContext;  // cublasHandle_t's (kernels/cuda/cublas.h)

namespace tripod::cuda {

// Number of usable CUDA devices; 0 (never an exception) without a driver or a GPU.
int device_count();
// The backend on GPU `index` (which must be < device_count()).
std::unique_ptr<Ops> make_cuda_ops(int index, const DebugOptions& debug);

class GemmRunner;       // gemm.cpp
class AttentionRunner;  // attention.cpp

class CudaOps final : public Ops {
 public:
  explicit CudaOps(int device_index, const DebugOptions& debug = {});
  ~CudaOps() override;
  CudaOps(const CudaOps&) = delete;
  CudaOps& operator=(const CudaOps&) = delete;

  Device device() const override { return Device::CUDA; }
  DType compute_dtype() const override { return DType::BF16; }
  Allocator& allocator() override { return device_alloc_; }
  Allocator& host_allocator() override { return pinned_alloc_; }
  // This GPU's dense bf16 peak: DebugOptions::peak_tflops when set, else from its name
  // (gpu_peak_flops; 989 TFLOP/s, H100 SXM, with a warning when the name is unknown), DESIGN.md's
  // MFU denominator.
  double peak_flops() override { return peak_flops_; }
  DeviceInfo device_info() const override { return info_; }
  void synchronize() override;

  void fill(Tensor& t, float value) override;
  void copy(const Tensor& src, Tensor& dst) override;
  void add(const Tensor& a, const Tensor& b, Tensor& out) override;
  void accumulate(Tensor& dst, const Tensor& src) override;
  void scale(Tensor& t, float s) override;
  double sum_squares(const Tensor& t, std::span<const FlatRange> ranges) override;
  double sum(const Tensor& t) override;

  void embedding_forward(const Tensor& tokens, const Tensor& wte, int64_t vocab_start, const Tensor& wpe, int64_t T,
                         Tensor& out) override;
  void embedding_backward(const Tensor& tokens, const Tensor& dout, int64_t vocab_start, Tensor& dwte, Tensor& dwpe,
                          int64_t T) override;
  void embedding_forward_positions(const Tensor& tokens, const Tensor& wte, int64_t vocab_start, const Tensor& wpe,
                                   const Tensor& positions, Tensor& out) override;
  void embedding_backward_positions(const Tensor& tokens, const Tensor& dout, int64_t vocab_start, Tensor& dwte,
                                    Tensor& dwpe, const Tensor& positions) override;

  void layernorm_forward(const Tensor& x, const Tensor& w, const Tensor& b, float eps, Tensor& y, Tensor& mean,
                         Tensor& rstd) override;
  void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                          Tensor& dx, Tensor& dw, Tensor& db) override;
  void rmsnorm_forward(const Tensor& x, const Tensor& w, float eps, Tensor& y, Tensor& rstd) override;
  void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd, Tensor& dx,
                        Tensor& dw) override;
  void rope(Tensor& x, int64_t rot_heads, int64_t T, int64_t pos0, double theta, bool inverse) override;
  void rope_positions(Tensor& x, int64_t rot_heads, const Tensor& positions, double theta, bool inverse) override;
  void swiglu_forward(const Tensor& gu, Tensor& y) override;
  void swiglu_backward(const Tensor& gu, const Tensor& dy, Tensor& dgu) override;

  void linear_forward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y) override;
  void linear_gelu_forward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& pre, Tensor& y) override;
  void linear_backward_input_gelu(const Tensor& dy, const Tensor& w, const Tensor& pre, Tensor& dpre) override;
  void linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor& dx, Tensor& dw,
                       Tensor& db) override;
  void linear_backward_input(const Tensor& dy, const Tensor& w, Tensor& dx) override;
  void linear_backward_weight(const Tensor& dy, const Tensor& x, Tensor& dw, Tensor& db) override;
  void bias_backward(const Tensor& dy, Tensor& db) override;

  // FP8 (gemm.cpp): casts in one pass over 32 x 32 tiles with the hardware's saturating
  // conversion, cuBLASLt FP8 GEMMs with scale pointers and the amax of D.
  void fp8_amax(const Tensor& x, Tensor& amax) override;
  void fp8_scale(const Tensor& amaxes, float fmt_max, int margin, Tensor& scale, Tensor& record) override;
  void fp8_quantize(const Tensor& x, const Tensor& scale, Tensor& q, Tensor& qt, Tensor& amax,
                    Tensor& saturated) override;
  void fp8_gemm(const Tensor& a, const Tensor& a_scale, const Tensor& b, const Tensor& b_scale, const Tensor& bias,
                bool accumulate, Tensor& out, Tensor& out_amax) override;

  // One cublasGemmGroupedBatchedEx per call (libcublas loaded at the first), each expert a group;
  // per-expert cuBLASLt GEMMs where cuBLAS declines the types.
  void grouped_linear_forward(const Tensor& x, std::span<const Tensor> w, std::span<const int64_t> offsets,
                              Tensor& y) override;
  void grouped_linear_backward_input(const Tensor& dy, std::span<const Tensor> w, std::span<const int64_t> offsets,
                                     Tensor& dx) override;
  void grouped_linear_backward_weight(const Tensor& dy, const Tensor& x, std::span<const int64_t> offsets,
                                      std::span<Tensor> dw) override;
  // Routing: one thread per token (moe.cu); the dispatch order by a block scan per expert.
  void moe_route(const Tensor& logits, const Tensor& bias, bool sigmoid, bool normalize, Tensor& idx, Tensor& weights,
                 Tensor& stats) override;
  void moe_route_backward(const Tensor& logits, const Tensor& idx, const Tensor& dweights, const Tensor& aux,
                          float z_scale, bool sigmoid, bool normalize, Tensor& dlogits) override;
  void moe_dispatch(const Tensor& idx, int64_t experts, int64_t capacity, Tensor& routed, Tensor& row_of,
                    Tensor& slot_of) override;
  void gather_rows(const Tensor& x, const Tensor& index, Tensor& out) override;
  void moe_permute(const Tensor& x, const Tensor& slot_of, int64_t k, const Tensor& weights, Tensor& xp) override;
  void moe_unpermute(const Tensor& yp, const Tensor& row_of, const Tensor& weights, Tensor& y) override;
  void moe_combine_backward(Tensor& g, const Tensor& act, const Tensor& slot_of, const Tensor& weights,
                            Tensor& dweights) override;
  void qk_norm_forward(Tensor& qkv, int64_t hq, int64_t hk, const Tensor& w, float eps, Tensor& saved,
                       Tensor& rstd) override;
  void qk_norm_backward(Tensor& dqkv, int64_t hq, const Tensor& saved, const Tensor& w, const Tensor& rstd,
                        Tensor& dw) override;

  void gelu_forward(const Tensor& x, Tensor& y) override;
  void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) override;

  // cuDNN's fused attention recomputes the probabilities from lse: `probs` is never filled.
  bool keeps_attention_probs() const override { return false; }
  void attention_forward(const Tensor& qkv, Tensor& out, Tensor& lse, Tensor& probs) override;
  void attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                          const Tensor& probs, Tensor& dqkv) override;
  // Packed documents: the reference kernels (attention_ref.cu), each query visiting only the keys of
  // its document.
  void attention_forward_docs(const Tensor& qkv, const DocRows& docs, Tensor& out, Tensor& lse) override;
  void attention_backward_docs(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                               const DocRows& docs, Tensor& dqkv) override;
  // One warp per (b, query head, new token) over its group's cache (attention_ref.cu), bf16 in,
  // f32 softmax.
  void attention_block_forward(const Tensor& q, const Tensor& kv, bool causal, const BlockDocs& docs, Tensor& out,
                               Tensor& lse) override;
  void attention_block_backward(const Tensor& dout, const Tensor& q, const Tensor& kv, const Tensor& out,
                                const Tensor& lse, bool causal, const BlockDocs& docs, Tensor& dq,
                                Tensor& dkv) override;
  void attention_kv_pack(const Tensor& qkv, int64_t H, Tensor& kv) override;
  void attention_kv_unpack(const Tensor& kv, int64_t H, Tensor& qkv) override;
  void attention_decode(const Tensor& qkv, Tensor& k_cache, Tensor& v_cache, int64_t pos, Tensor& out) override;

  void xent_stats(const Tensor& logits, const Tensor& targets, int64_t vocab_start, int64_t valid,
                  Tensor& stats) override;
  void xent_combine(const Tensor& parts, Tensor& lse, Tensor& loss) override;
  void xent_backward(Tensor& logits, const Tensor& targets, int64_t vocab_start, int64_t valid, const Tensor& lse,
                     float scale) override;

  void adamw(Tensor& master, const Tensor& grads, Tensor& m, Tensor& v, std::span<const FlatRange> ranges,
             const AdamWHyper& h, Tensor& compute_copy) override;

  // ---- for the communicators and benchmarks ---------------------------------------------------
  int device_index() const { return device_; }
  const std::string& device_name() const { return device_name_; }
  cudaStream_t compute_stream() const { return compute_; }
  // Which attention implementation ran last: "cudnn" or "reference" (see attention.cpp).
  const char* attention_impl() const;

  // Per-family GPU time: a cudaEvent pair around each op while on (TRIPOD_CUDA_TIMING=1 in the
  // environment turns it on at construction). take_times() waits for the GPU.
  void set_timing(bool on) override { timing_ = on; }
  OpTimes take_times() override;
  // The compute clock: an event pair around each region, summed at take (which waits for the GPU).
  void compute_begin() override;
  void compute_end() override;
  double take_compute_seconds() override;

  // Records the span of one op (used by the op implementations in this folder).
  class ScopedTimer {
   public:
    ScopedTimer(CudaOps& ops, OpFamily f);
    ~ScopedTimer();
    ScopedTimer(const ScopedTimer&) = delete;
    ScopedTimer& operator=(const ScopedTimer&) = delete;

   private:
    CudaOps* ops_ = nullptr;
    OpFamily family_;
    cudaEvent_t start_ = nullptr;
  };

  // A device copy of the chunk table of `ranges` (offsets into a flat buffer; flag = decay),
  // built once per distinct list (the same ranges come every step). Returns the chunk count.
  int chunk_table(std::span<const FlatRange> ranges, const k::Chunk** table);

 private:
  // The halves of linear_backward, untimed (each public entry point times itself once).
  // gelu_pre defined: dx = (dy w) * gelu'(gelu_pre), cuBLASLt's DGELU epilogue.
  void linear_input_grad(const Tensor& dy, const Tensor& w, Tensor& dx, const Tensor& gelu_pre = {});
  void linear_weight_grad(const Tensor& dy, const Tensor& x, Tensor& dw, Tensor& db);
  cudaEvent_t take_event();
  double reduce_to_host(const float* x, const k::Chunk* chunks, int nchunks, bool square, const char* what);
  void upload(const Tensor& src, Tensor& dst);
  void reap_uploads();
  // One column-major GEMM of a grouped call (GemmArgs' conventions, gemm_runner.h): C (m x n, ldc)
  // = op(A) op(B) + beta C, A and B bf16.
  struct GroupedGemm {
    int64_t m = 0, n = 0, k = 0;
    const void* a = nullptr;
    int64_t lda = 0;
    const void* b = nullptr;
    int64_t ldb = 0;
    void* c = nullptr;
    int64_t ldc = 0;
  };
  void grouped_gemm(bool trans_a, bool trans_b, const std::vector<GroupedGemm>& problems, bool f32_out, float beta,
                    const std::string& what);

  int device_ = 0;
  std::string device_name_;
  double peak_flops_ = 0;
  DeviceInfo info_;  // global memory and L2, from the device's properties
  cudaStream_t compute_ = nullptr;
  DeviceAllocator device_alloc_;
  PinnedAllocator pinned_alloc_;
  std::unique_ptr<GemmRunner> gemm_;
  ::cublasContext* cublas_ = nullptr;  // cuBLAS's handle, created at the first grouped GEMM
  bool grouped_declined_ = false;           // cuBLAS refused the grouped call: per-group cuBLASLt GEMMs
  bool dgelu_declined_ = false;             // cuBLASLt refused the DGELU epilogue: GEMM, then gelu_backward
  std::unique_ptr<AttentionRunner> attention_;

  // Reductions: kReduceBlocks partial sums and the result on the device, the result on the host.
  double* reduce_dev_ = nullptr;
  double* reduce_host_ = nullptr;

  // Host -> device copies in flight: their pinned staging buffers, kept until the copy is done.
  struct Upload {
    Tensor staging;
    cudaEvent_t done;
  };
  std::deque<Upload> uploads_;

  // Chunk tables by their ranges ({begin, end, decay} flattened).
  std::map<std::vector<int64_t>, std::pair<k::Chunk*, int>> chunk_tables_;

  bool timing_ = false;
  std::vector<cudaEvent_t> free_events_;
  struct Span {
    OpFamily family;
    cudaEvent_t start, stop;
  };
  std::vector<Span> spans_;
  cudaEvent_t compute_start_ = nullptr;                    // the open region's start
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> compute_spans_;  // closed regions
};

}  // namespace tripod::cuda
