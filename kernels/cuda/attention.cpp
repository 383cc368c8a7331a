// Causal attention through cuDNN's fused flash attention, built with the cuDNN 9 backend graph
// API: the operation graphs below are the patterns cuDNN's fused-attention engines recognise
// (the ones its frontend library emits for causal SDPA with statistics); heuristics pick an
// engine, and the finalized execution plan is cached per shape. Shapes cuDNN declines run on the
// reference kernels (attention_ref.cu).
//
// Layouts as cuDNN sees them, logical dims (b, h, s, d) with strides into our buffers, for
// qkv (B, T, H + 2 Hkv, D) with W = (H + 2 Hkv) D elements per token:
//   Q        offset 0: dims (B, H, T, D), strides (W*T, D, W, 1)
//   K^T      offset H*D: dims (B, Hkv, D, T), strides (W*T, D, 1, W); V at (H + Hkv)*D: (B, Hkv, T, D)
//   O, dO    (B, T, H, D): dims (B, H, T, D), strides (HD*T, D, HD, 1)
// With Hkv < H (grouped-query attention) K, V, dK and dV have Hkv heads: cuDNN's fused engines
// take such graphs (query head h reads key/value head h / (H/Hkv); the backward computes dK and dV
// per query head and a reduction sums each group); where an engine declines one, the reference
// kernels run it.
//   Stats    lse (B, H, T) f32: dims (B, H, T, 1), natural-log log-sum-exp of the scaled scores,
//            the same quantity the CPU backend and the reference kernels store.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <bit>
#include <map>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string_view>
#include <vector>

#include "kernels/cuda/attention_runner.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/op_checks.h"

namespace tripod::cuda {

namespace cudnn_graph {

// Unique ids of the graph tensors that hold data (the variant pack binds pointers to them);
// virtual tensors number from kFirstVirtual.
enum Uid : int64_t {
  kQ = 1, kK, kV, kO, kStats, kScale, kNegInf, kDO, kDQ, kDK, kDV, kOne, kSoftmaxSum, kDQAccum,
  kFirstVirtual = 100
};

using Dims = std::array<int64_t, 4>;

// An owned backend descriptor.
class Desc {
 public:
  Desc(cudnnBackendDescriptorType_t type, const std::string& what) {
    TRIPOD_CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &d_), "{}: descriptor type {}", what,
                       static_cast<int>(type));
  }
  ~Desc() {
    if (d_) cudnnBackendDestroyDescriptor(d_);
  }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  cudnnBackendDescriptor_t get() const { return d_; }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

// The descriptors a finalized plan refers to, kept alive with it.
struct Kept {
  std::vector<std::unique_ptr<Desc>> descs;
};

// Builds one operation graph: each call adds a tensor or an operation in topological order.
class GraphBuilder {
 public:
  GraphBuilder(cudnnHandle_t handle, std::string what) : handle_(handle), what_(std::move(what)) {}

  cudnnBackendDescriptor_t tensor(int64_t uid, cudnnDataType_t dt, const Dims& dims, const Dims& strides,
                                  bool is_virtual = false, bool by_value = false) {
    cudnnBackendDescriptor_t t = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const int64_t alignment = 16;
    const bool virt = is_virtual;
    set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt);
    set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data());
    set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data());
    set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
    set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt);
    if (by_value) {
      const bool yes = true;
      set(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &yes);
    }
    finalize(t, "tensor");
    return t;
  }
  cudnnBackendDescriptor_t virt(cudnnDataType_t dt, const Dims& dims, const Dims& strides) {
    return tensor(next_uid_++, dt, dims, strides, true);
  }
  // An f32 scalar passed by value (its variant-pack pointer is host memory).
  cudnnBackendDescriptor_t scalar(int64_t uid) {
    return tensor(uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true);
  }

  // y = mode(x[, b[, t]]) computed in `math`; axis for GEN_INDEX.
  void pointwise(cudnnPointwiseMode_t mode, cudnnDataType_t math, cudnnBackendDescriptor_t x,
                 cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y,
                 int64_t axis = -1) {
    cudnnBackendDescriptor_t pw = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &math);
    if (mode == CUDNN_POINTWISE_GEN_INDEX) set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    finalize(pw, "pointwise descriptor");
    cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw);
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    if (b) set(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
    if (t) set(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t);
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    finalize(op, "pointwise operation");
    ops_.push_back(op);
  }

  void reduction(cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t red = make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    const cudnnDataType_t math = CUDNN_DATA_FLOAT;
    set(red, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode);
    set(red, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &math);
    finalize(red, "reduction descriptor");
    cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &red);
    finalize(op, "reduction operation");
    ops_.push_back(op);
  }

  // c = a b over the last two dims, batched over the first two; accumulation in f32.
  void matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c) {
    cudnnBackendDescriptor_t mm = make(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    const cudnnDataType_t math = CUDNN_DATA_FLOAT;
    set(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &math);
    finalize(mm, "matmul descriptor");
    cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mm);
    finalize(op, "matmul operation");
    ops_.push_back(op);
  }

  // y: x with other dims/strides over the same elements (used for transposes).
  void reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    set(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    set(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    finalize(op, "reshape operation");
    ops_.push_back(op);
  }

  // Scores s (b, h, s_q, s_kv) with the future masked: s where row >= column, else `lowest`.
  cudnnBackendDescriptor_t causal_mask(cudnnBackendDescriptor_t s, cudnnBackendDescriptor_t lowest, const Dims& dims,
                                       const Dims& strides) {
    cudnnBackendDescriptor_t row = virt(CUDNN_DATA_INT32, dims, strides);
    pointwise(CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, s, nullptr, nullptr, row, 2);
    cudnnBackendDescriptor_t col = virt(CUDNN_DATA_INT32, dims, strides);
    pointwise(CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, s, nullptr, nullptr, col, 3);
    cudnnBackendDescriptor_t keep = virt(CUDNN_DATA_BOOLEAN, dims, strides);
    pointwise(CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, col, nullptr, keep);
    cudnnBackendDescriptor_t masked = virt(CUDNN_DATA_FLOAT, dims, strides);
    pointwise(CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, s, lowest, keep, masked);
    return masked;
  }

  // Finalizes the graph, asks the heuristics for engine configurations and keeps the first one
  // that builds an execution plan. Throws Error (with cuDNN's reason) when none does.
  std::unique_ptr<Kept> build_plan(cudnnBackendDescriptor_t* plan_out, int64_t* workspace_out) {
    cudnnBackendDescriptor_t graph = make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_);
    set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<int64_t>(ops_.size()),
        ops_.data());
    finalize(graph, "operation graph");
    std::string reason = "the heuristics returned no engine configuration";
    for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
      cudnnBackendDescriptor_t heur = make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
      set(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph);
      set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
      cudnnStatus_t st = cudnnBackendFinalize(heur);
      if (st != CUDNN_STATUS_SUCCESS) {
        reason = "engine heuristics: " + cudnn_error(st);
        continue;
      }
      int64_t count = 0;
      st = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                                    nullptr);
      if (st != CUDNN_STATUS_SUCCESS || count == 0) continue;
      std::vector<cudnnBackendDescriptor_t> cfgs;
      for (int64_t i = 0; i < count; ++i) cfgs.push_back(make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
      int64_t returned = 0;
      TRIPOD_CUDNN_CHECK(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                                  count, &returned, cfgs.data()),
                         "{}: engine configurations", what_);
      for (int64_t i = 0; i < returned; ++i) {
        cudnnBackendDescriptor_t plan = make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
        set(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle_);
        set(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfgs[i]);
        st = cudnnBackendFinalize(plan);
        if (st != CUDNN_STATUS_SUCCESS) {
          reason = "no engine configuration builds a plan; last: " + cudnn_error(st);
          continue;
        }
        int64_t workspace = 0, n = 0;
        TRIPOD_CUDNN_CHECK(cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64,
                                                    1, &n, &workspace),
                           "{}: plan workspace size", what_);
        *plan_out = plan;
        *workspace_out = workspace;
        return std::move(kept_);
      }
    }
    TRIPOD_FAIL("{}: {}", what_, reason);
  }

 private:
  cudnnBackendDescriptor_t make(cudnnBackendDescriptorType_t type) {
    kept_->descs.push_back(std::make_unique<Desc>(type, what_));
    return kept_->descs.back()->get();
  }
  void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
           int64_t count, const void* values) {
    TRIPOD_CUDNN_CHECK(cudnnBackendSetAttribute(d, name, type, count, values), "{}: attribute {}", what_,
                       static_cast<int>(name));
  }
  void finalize(cudnnBackendDescriptor_t d, const char* what) {
    TRIPOD_CUDNN_CHECK(cudnnBackendFinalize(d), "{}: finalizing the {}", what_, what);
  }

  cudnnHandle_t handle_;
  std::string what_;
  std::unique_ptr<Kept> kept_ = std::make_unique<Kept>();
  std::vector<cudnnBackendDescriptor_t> ops_;
  int64_t next_uid_ = kFirstVirtual;
};

}  // namespace cudnn_graph

struct AttentionRunner::Plan {
  std::unique_ptr<cudnn_graph::Kept> kept;
  cudnnBackendDescriptor_t plan = nullptr;  // owned by `kept`
  int64_t workspace = 0;
};

namespace {

using cudnn_graph::Dims;
using namespace cudnn_graph;  // the uids

struct Layout {
  Dims q_dims, q_strides;    // Q, dQ in qkv / dqkv
  Dims kv_dims, kv_strides;  // K, V, dK, dV in qkv / dqkv
  Dims kt_dims, kt_strides;  // K^T (and V^T) in qkv
  Dims o_dims, o_strides;    // O, dO
  Dims row_dims, row_strides;    // (b, h, s, 1) statistics
  Dims s_dims, s_strides;        // (b, h, s_q, s_kv) scores
  Dims st_dims, st_strides;      // scores transposed, (b, h, s_kv, s_q)
};

Layout layout_of(int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D) {
  const int64_t tq = (H + 2 * Hkv) * D, to = H * D;
  return {{B, H, T, D},         {T * tq, D, tq, 1},         {B, Hkv, T, D},      {T * tq, D, tq, 1},
          {B, Hkv, D, T},       {T * tq, D, 1, tq},         {B, H, T, D},        {T * to, D, to, 1},
          {B, H, T, 1},         {H * T, T, 1, 1},           {B, H, T, T},        {H * T * T, T * T, T, 1},
          {B, H, T, T},         {H * T * T, T * T, 1, T}};
}

// Forward: S = Q K^T; S *= scale; causal mask; softmax with Stats = max + log(sum exp); O = P V.
std::unique_ptr<AttentionRunner::Plan> build_forward(cudnnHandle_t h, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                                                     int64_t D) {
  const Layout L = layout_of(B, T, H, Hkv, D);
  GraphBuilder g(h, fmt::format("cuDNN attention forward B={} T={} H={} Hkv={} D={}", B, T, H, Hkv, D));
  auto q = g.tensor(kQ, CUDNN_DATA_BFLOAT16, L.q_dims, L.q_strides);
  auto kt = g.tensor(kK, CUDNN_DATA_BFLOAT16, L.kt_dims, L.kt_strides);
  auto v = g.tensor(kV, CUDNN_DATA_BFLOAT16, L.kv_dims, L.kv_strides);
  auto o = g.tensor(kO, CUDNN_DATA_BFLOAT16, L.o_dims, L.o_strides);
  auto stats = g.tensor(kStats, CUDNN_DATA_FLOAT, L.row_dims, L.row_strides);
  auto scale = g.scalar(kScale);
  auto lowest = g.scalar(kNegInf);

  auto s = g.virt(CUDNN_DATA_FLOAT, L.s_dims, L.s_strides);
  g.matmul(q, kt, s);
  auto scaled = g.virt(CUDNN_DATA_FLOAT, L.s_dims, L.s_strides);
  g.pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, s, scale, nullptr, scaled);
  auto masked = g.causal_mask(scaled, lowest, L.s_dims, L.s_strides);
  auto max = g.virt(CUDNN_DATA_FLOAT, L.row_dims, L.row_strides);
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, masked, max);
  auto shifted = g.virt(CUDNN_DATA_FLOAT, L.s_dims, L.s_strides);
  g.pointwise(CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, masked, max, nullptr, shifted);
  auto e = g.virt(CUDNN_DATA_FLOAT, L.s_dims, L.s_strides);
  g.pointwise(CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, shifted, nullptr, nullptr, e);
  auto z = g.virt(CUDNN_DATA_FLOAT, L.row_dims, L.row_strides);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, z);
  auto log_z = g.virt(CUDNN_DATA_FLOAT, L.row_dims, L.row_strides);
  g.pointwise(CUDNN_POINTWISE_LOG, CUDNN_DATA_FLOAT, z, nullptr, nullptr, log_z);
  g.pointwise(CUDNN_POINTWISE_ADD, CUDNN_DATA_FLOAT, max, log_z, nullptr, stats);
  auto p = g.virt(CUDNN_DATA_BFLOAT16, L.s_dims, L.s_strides);  // the second GEMM takes P in the I/O type
  g.pointwise(CUDNN_POINTWISE_DIV, CUDNN_DATA_FLOAT, e, z, nullptr, p);
  g.matmul(p, v, o);

  auto plan = std::make_unique<AttentionRunner::Plan>();
  plan->kept = g.build_plan(&plan->plan, &plan->workspace);
  return plan;
}

// Backward (flash attention's): softmax_sum = rowsum(dO * O); P = exp(scale Q K^T - Stats) masked;
// dV = P^T dO; dS = P (dO V^T - softmax_sum) scale; dK = dS^T Q; dQ = dS K (accumulated in f32).
std::unique_ptr<AttentionRunner::Plan> build_backward(cudnnHandle_t h, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                                                      int64_t D) {
  const Layout L = layout_of(B, T, H, Hkv, D);
  GraphBuilder g(h, fmt::format("cuDNN attention backward B={} T={} H={} Hkv={} D={}", B, T, H, Hkv, D));
  auto q = g.tensor(kQ, CUDNN_DATA_BFLOAT16, L.q_dims, L.q_strides);
  auto kt = g.tensor(kK, CUDNN_DATA_BFLOAT16, L.kt_dims, L.kt_strides);
  auto vt = g.tensor(kV, CUDNN_DATA_BFLOAT16, L.kt_dims, L.kt_strides);
  auto o = g.tensor(kO, CUDNN_DATA_BFLOAT16, L.o_dims, L.o_strides);
  auto dout = g.tensor(kDO, CUDNN_DATA_BFLOAT16, L.o_dims, L.o_strides);
  auto stats = g.tensor(kStats, CUDNN_DATA_FLOAT, L.row_dims, L.row_strides);
  auto scale = g.scalar(kScale);
  auto lowest = g.scalar(kNegInf);
  auto one = g.scalar(kOne);
  auto dq = g.tensor(kDQ, CUDNN_DATA_BFLOAT16, L.q_dims, L.q_strides);
  auto dk = g.tensor(kDK, CUDNN_DATA_BFLOAT16, L.kv_dims, L.kv_strides);
  auto dv = g.tensor(kDV, CUDNN_DATA_BFLOAT16, L.kv_dims, L.kv_strides);
  auto softmax_sum = g.tensor(kSoftmaxSum, CUDNN_DATA_FLOAT, L.row_dims, L.row_strides);
  auto dq_accum = g.tensor(kDQAccum, CUDNN_DATA_FLOAT, L.q_dims, {H * T * D, T * D, D, 1});

  // softmax_sum (b, h, s, 1) = sum_d dO * O
  auto d_o = g.virt(CUDNN_DATA_FLOAT, L.o_dims, {H * T * D, T * D, H * D, 1});
  g.pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, dout, o, nullptr, d_o);
  auto row_sum = g.virt(CUDNN_DATA_FLOAT, L.row_dims, L.row_strides);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, d_o, row_sum);
  g.pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, row_sum, one, nullptr, softmax_sum);

  // P = exp(scale Q K^T - Stats), masked
  auto s = g.virt(CUDNN_DATA_FLOAT, L.s_dims, L.s_strides);
  g.matmul(q, kt, s);
  auto scaled = g.virt(CUDNN_DATA_FLOAT, L.s_dims, L.s_strides);
  g.pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, s, scale, nullptr, scaled);
  auto centered = g.virt(CUDNN_DATA_FLOAT, L.s_dims, L.s_strides);
  g.pointwise(CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, scaled, stats, nullptr, centered);
  auto masked = g.causal_mask(centered, lowest, L.s_dims, L.s_strides);
  auto p = g.virt(CUDNN_DATA_FLOAT, L.s_dims, L.s_strides);
  g.pointwise(CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, masked, nullptr, nullptr, p);

  // With grouped-query attention a matmul cannot write Hkv heads from H: dK and dV come out per
  // query head (b, H, s_kv, d) and a reduction sums each group of H/Hkv adjacent heads into them
  // (the pattern cuDNN's frontend emits for GQA).
  auto per_query_head = [&](cudnnBackendDescriptor_t full_out, auto&& product) {
    if (Hkv == H) return product(full_out);
    auto full = g.virt(CUDNN_DATA_BFLOAT16, L.q_dims, {H * T * D, T * D, D, 1});
    product(full);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, full, full_out);
  };

  // dV = P^T dO
  auto p_t = g.virt(CUDNN_DATA_BFLOAT16, L.st_dims, L.st_strides);
  g.reshape(p, p_t);
  per_query_head(dv, [&](cudnnBackendDescriptor_t y) { g.matmul(p_t, dout, y); });

  // dS = P (dO V^T - softmax_sum) scale
  auto dp = g.virt(CUDNN_DATA_FLOAT, L.s_dims, L.s_strides);
  g.matmul(dout, vt, dp);
  auto dp_kept = g.virt(CUDNN_DATA_FLOAT, L.s_dims, L.s_strides);
  g.pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, dp, one, nullptr, dp_kept);
  auto dp_centered = g.virt(CUDNN_DATA_FLOAT, L.s_dims, L.s_strides);
  g.pointwise(CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, dp_kept, softmax_sum, nullptr, dp_centered);
  auto ds_unscaled = g.virt(CUDNN_DATA_FLOAT, L.s_dims, L.s_strides);
  g.pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, dp_centered, p, nullptr, ds_unscaled);
  auto ds = g.virt(CUDNN_DATA_FLOAT, L.s_dims, L.s_strides);
  g.pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, ds_unscaled, scale, nullptr, ds);

  // dK = dS^T Q
  auto ds_t = g.virt(CUDNN_DATA_BFLOAT16, L.st_dims, L.st_strides);
  g.reshape(ds, ds_t);
  per_query_head(dk, [&](cudnnBackendDescriptor_t y) { g.matmul(ds_t, q, y); });

  // dQ = dS K, accumulated in f32 then converted
  auto k = g.virt(CUDNN_DATA_FLOAT, L.kv_dims, L.kv_strides);
  g.reshape(kt, k);
  g.matmul(ds, k, dq_accum);
  g.pointwise(CUDNN_POINTWISE_IDENTITY, CUDNN_DATA_FLOAT, dq_accum, nullptr, nullptr, dq);

  auto plan = std::make_unique<AttentionRunner::Plan>();
  plan->kept = g.build_plan(&plan->plan, &plan->workspace);
  return plan;
}

struct Qkv {
  int64_t B, T, H, Hkv, D;
};

// qkv (B, T, H + 2 Hkv, D) (or (B, T, 3, H, D)); H from `out`, which holds (B, T, H, D) elements.
Qkv qkv_dims(const Tensor& qkv, const Tensor& out, const char* op) {
  TRIPOD_CHECK(qkv.dim() == 4 || (qkv.dim() == 5 && qkv.size(2) == 3), "{}: qkv must be (B, T, H + 2 Hkv, D), got {}",
               op, qkv.str());
  const int64_t B = qkv.size(0), T = qkv.size(1), D = qkv.size(-1);
  const int64_t heads = qkv.numel() / (B * T * D), H = out.numel() / (B * T * D), Hkv = (heads - H) / 2;
  TRIPOD_CHECK(H >= 1 && Hkv >= 1 && H + 2 * Hkv == heads && H % Hkv == 0 && out.numel() == B * T * H * D,
               "{}: qkv {} and out {}: not H + 2 Hkv heads with Hkv dividing H", op, qkv.str(), out.str());
  return {B, T, H, Hkv, D};
}

}  // namespace

AttentionRunner::AttentionRunner(CudaOps& ops, AttentionKernels kernels) : ops_(ops), mode_(kernels) {}

AttentionRunner::~AttentionRunner() {
  plans_.clear();  // the plans' descriptors go before the handle
  if (handle_) cudnnDestroy(handle_);
}

AttentionRunner::Plan* AttentionRunner::plan_for(const Shape& s) {
  if (mode_ == AttentionKernels::Reference) return nullptr;
  auto it = plans_.find(s);
  if (it != plans_.end()) return it->second.get();
  std::unique_ptr<Plan> plan;
  std::string why;
  if (s.D % 8 != 0 || s.D > 256) {
    why = "cuDNN needs a head dimension that is a multiple of 8 and at most 256";
  } else {
    try {
      if (!handle_) {
        TRIPOD_CUDNN_CHECK(cudnnCreate(&handle_), "cuDNN handle on GPU {}", ops_.device_index());
        TRIPOD_CUDNN_CHECK(cudnnSetStream(handle_, ops_.compute_stream()), "cuDNN stream");
      }
      plan = s.backward ? build_backward(handle_, s.B, s.T, s.H, s.Hkv, s.D)
                        : build_forward(handle_, s.B, s.T, s.H, s.Hkv, s.D);
    } catch (const Error& e) {
      why = e.what();
    }
  }
  if (!plan) {
    TRIPOD_CHECK(mode_ != AttentionKernels::Cudnn, "attention {} B={} T={} H={} Hkv={} D={}: cuDNN fused attention is "
                 "unavailable (TRIPOD_ATTENTION=cudnn): {}", s.backward ? "backward" : "forward", s.B, s.T, s.H, s.Hkv,
                 s.D, why);
    spdlog::warn("attention {} B={} T={} H={} Hkv={} D={}: cuDNN fused attention is unavailable ({}); using the "
                 "slower reference kernels", s.backward ? "backward" : "forward", s.B, s.T, s.H, s.Hkv, s.D, why);
  }
  return plans_.emplace(s, std::move(plan)).first->second.get();
}

bool AttentionRunner::executed(int status, const Shape& s) {
  if (status == CUDNN_STATUS_SUCCESS) return true;
  const std::string why = cudnn_error(static_cast<cudnnStatus_t>(status));
  cudaGetLastError();  // a launch error that is not sticky must not reach the next check
  TRIPOD_CHECK(mode_ != AttentionKernels::Cudnn, "attention {} B={} T={} H={} D={}: cuDNN failed to execute its plan "
               "(TRIPOD_ATTENTION=cudnn): {}", s.backward ? "backward" : "forward", s.B, s.T, s.H, s.D, why);
  spdlog::warn("attention {} B={} T={} H={} D={}: cuDNN failed to execute its plan ({}); this shape uses the slower "
               "reference kernels from now on", s.backward ? "backward" : "forward", s.B, s.T, s.H, s.D, why);
  plans_[s].reset();
  return false;
}

namespace {

// Runs a plan; the status of the execution itself is returned (an engine may still refuse a shape
// here), everything before it throws.
cudnnStatus_t execute(CudaOps& ops, cudnnHandle_t handle, const AttentionRunner::Plan& plan,
                      std::span<const int64_t> uids, std::span<void* const> ptrs, const std::string& what) {
  Tensor workspace;
  void* ws = nullptr;
  if (plan.workspace > 0) {
    workspace = ops.empty({(plan.workspace + 3) / 4}, DType::F32, MemCategory::Workspace);
    ws = workspace.raw();
  }
  cudnn_graph::Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, what);
  TRIPOD_CUDNN_CHECK(cudnnBackendSetAttribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
                                              static_cast<int64_t>(uids.size()), uids.data()),
                     "{}: variant pack", what);
  TRIPOD_CUDNN_CHECK(cudnnBackendSetAttribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
                                              static_cast<int64_t>(ptrs.size()), ptrs.data()),
                     "{}: variant pack", what);
  TRIPOD_CUDNN_CHECK(
      cudnnBackendSetAttribute(pack.get(), CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws),
      "{}: variant pack", what);
  TRIPOD_CUDNN_CHECK(cudnnBackendFinalize(pack.get()), "{}: variant pack", what);
  return cudnnBackendExecute(handle, plan.plan, pack.get());
}

void* mut(const void* p) { return const_cast<void*>(p); }

}  // namespace

void AttentionRunner::forward(const Tensor& qkv, Tensor& out, Tensor& lse) {
  const char* op = "attention_forward";
  auto [B, T, H, Hkv, D] = qkv_dims(qkv, out, op);
  expect(qkv, DType::BF16, B * T * (H + 2 * Hkv) * D, op, "qkv");
  expect(out, DType::BF16, B * T * H * D, op, "out");
  expect(lse, DType::F32, B * H * T, op, "lse");
  float scale = 1.0f / std::sqrt(static_cast<float>(D));
  if (Plan* plan = plan_for({B, T, H, Hkv, D, false})) {
    const bf16* q = qkv.data<bf16>();
    float lowest = std::numeric_limits<float>::lowest();
    const std::array<int64_t, 7> uids{kQ, kK, kV, kO, kStats, kScale, kNegInf};
    const std::array<void*, 7> ptrs{mut(q), mut(q + H * D), mut(q + (H + Hkv) * D), out.raw(), lse.raw(), &scale,
                                    &lowest};
    if (executed(execute(ops_, handle_, *plan, uids, ptrs, fmt::format("{} qkv {} (cuDNN)", op, qkv.str())),
                 {B, T, H, Hkv, D, false})) {
      last_impl_ = "cudnn";
      return;
    }
  }
  TRIPOD_CHECK(D <= k::kMaxRefHeadDim, "{}: head dimension {} exceeds the reference kernels' {}", op, D,
               k::kMaxRefHeadDim);
  k::attention_forward(qkv.data<bf16>(), out.data<bf16>(), lse.data<float>(), B, T, H, Hkv, D, nullptr, scale,
                       ops_.compute_stream());
  TRIPOD_CUDA_LAUNCHED("{} qkv {} (reference kernels)", op, qkv.str());
  last_impl_ = "reference";
}

void AttentionRunner::backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                               Tensor& dqkv) {
  const char* op = "attention_backward";
  auto [B, T, H, Hkv, D] = qkv_dims(qkv, out, op);
  expect(qkv, DType::BF16, B * T * (H + 2 * Hkv) * D, op, "qkv");
  expect(dqkv, DType::BF16, B * T * (H + 2 * Hkv) * D, op, "dqkv");
  expect(out, DType::BF16, B * T * H * D, op, "out");
  expect(dout, DType::BF16, B * T * H * D, op, "dout");
  expect(lse, DType::F32, B * H * T, op, "lse");
  float scale = 1.0f / std::sqrt(static_cast<float>(D));
  if (Plan* plan = plan_for({B, T, H, Hkv, D, true})) {
    Tensor softmax_sum = ops_.empty({B, H, T}, DType::F32, MemCategory::Workspace);
    Tensor dq_accum = ops_.empty({B, H, T, D}, DType::F32, MemCategory::Workspace);
    TRIPOD_CUDA_CHECK(cudaMemsetAsync(dq_accum.raw(), 0, dq_accum.nbytes(), ops_.compute_stream()),
                      "{} dq accumulator", op);
    const bf16* q = qkv.data<bf16>();
    bf16* dq = dqkv.data<bf16>();
    float lowest = std::numeric_limits<float>::lowest(), one = 1.0f;
    const std::array<int64_t, 14> uids{kQ,  kK,  kV,  kO,  kDO,  kStats,      kScale, kNegInf,
                                       kOne, kDQ, kDK, kDV, kSoftmaxSum, kDQAccum};
    const int64_t ko = H * D, vo = (H + Hkv) * D;  // key and value offsets in a token's row
    const std::array<void*, 14> ptrs{mut(q),         mut(q + ko), mut(q + vo), mut(out.raw()), mut(dout.raw()),
                                     mut(lse.raw()), &scale,      &lowest,     &one,           dq,
                                     dq + ko,        dq + vo,     softmax_sum.raw(), dq_accum.raw()};
    if (executed(execute(ops_, handle_, *plan, uids, ptrs, fmt::format("{} qkv {} (cuDNN)", op, qkv.str())),
                 {B, T, H, Hkv, D, true})) {
      last_impl_ = "cudnn";
      return;
    }
  }
  TRIPOD_CHECK(D <= k::kMaxRefHeadDim, "{}: head dimension {} exceeds the reference kernels' {}", op, D,
               k::kMaxRefHeadDim);
  Tensor delta = ops_.empty({B, H, T}, DType::F32, MemCategory::Workspace);
  k::attention_backward(dout.data<bf16>(), qkv.data<bf16>(), out.data<bf16>(), lse.data<float>(), dqkv.data<bf16>(),
                        delta.data<float>(), B, T, H, Hkv, D, nullptr, scale, ops_.compute_stream());
  TRIPOD_CUDA_LAUNCHED("{} qkv {} (reference kernels)", op, qkv.str());
  last_impl_ = "reference";
}

namespace {

void expect_starts(const Tensor& start, int64_t B, int64_t T, const char* op) {
  TRIPOD_CHECK(start.defined(), "{}: no document starts", op);
  expect(start, DType::I32, B * T, op, "document starts");
}

// Packed documents on cuDNN's fused kernels: the documents batched by length, each batch one causal
// attention of n sequences of L tokens (L: the documents' lengths rounded up to a power of two, at
// least 64 and at most T; n: their count rounded up to a power of two, so that a few plans serve
// every micro-batch). A document padded at its end is exact: causally its queries never reach the
// padding keys, and padding queries (zero rows, zero output gradient) add nothing to any gradient.
struct DocBatch {
  int64_t L = 0;
  std::vector<int32_t> first, len;
  int64_t n() const { return static_cast<int64_t>(std::bit_ceil(first.size())); }
};

std::vector<DocBatch> doc_batches(std::span<const int32_t> offsets, int64_t T) {
  std::map<int64_t, DocBatch> by_length;
  for (size_t i = 0; i + 1 < offsets.size(); ++i) {
    const int64_t len = offsets[i + 1] - offsets[i];
    const int64_t L = std::min<int64_t>(T, std::max<int64_t>(64, static_cast<int64_t>(std::bit_ceil(
                                                                      static_cast<uint64_t>(len)))));
    DocBatch& b = by_length[L];
    b.L = L;
    b.first.push_back(offsets[i]);
    b.len.push_back(static_cast<int32_t>(len));
  }
  std::vector<DocBatch> out;
  for (auto& [L, b] : by_length) out.push_back(std::move(b));
  return out;
}

// The batch's table on the device: first[0..n) then len[0..n), the padding documents empty.
Tensor doc_table(CudaOps& ops, const DocBatch& b) {
  const int64_t n = b.n();
  CpuAllocator host;
  Tensor h = Tensor::empty(host, {2 * n}, DType::I32, MemCategory::Workspace);
  int32_t* p = h.data<int32_t>();
  std::fill(p, p + 2 * n, 0);
  std::copy(b.first.begin(), b.first.end(), p);
  std::copy(b.len.begin(), b.len.end(), p + n);
  Tensor d = ops.empty({2 * n}, DType::I32, MemCategory::Workspace);
  ops.copy(h, d);
  return d;
}

}  // namespace

void AttentionRunner::forward_docs(const Tensor& qkv, const DocRows& docs, Tensor& out, Tensor& lse) {
  const char* op = "attention_forward_docs";
  auto [B, T, H, Hkv, D] = qkv_dims(qkv, out, op);
  expect(qkv, DType::BF16, B * T * (H + 2 * Hkv) * D, op, "qkv");
  expect(out, DType::BF16, B * T * H * D, op, "out");
  expect(lse, DType::F32, B * H * T, op, "lse");
  expect_starts(docs.start, B, T, op);
  TRIPOD_CHECK(docs.offsets.size() >= 2 && docs.offsets.front() == 0 && docs.offsets.back() == B * T,
               "{}: document offsets must run from 0 to B T = {}", op, B * T);
  if (mode_ != AttentionKernels::Reference) {
    const int64_t W = (H + 2 * Hkv) * D;
    for (const DocBatch& b : doc_batches(docs.offsets, T)) {
      const int64_t n = b.n(), L = b.L;
      Tensor table = doc_table(ops_, b);
      Tensor q = ops_.empty({n, L, H + 2 * Hkv, D}, DType::BF16, MemCategory::Workspace);
      Tensor o = ops_.empty({n, L, H, D}, DType::BF16, MemCategory::Workspace);
      Tensor l = ops_.empty({n, H, L}, DType::F32, MemCategory::Workspace);
      k::doc_rows(qkv.data<bf16>(), q.data<bf16>(), table.data<int32_t>(), n, L, W, true, ops_.compute_stream());
      TRIPOD_CUDA_LAUNCHED("{}: gathering {} documents of up to {} tokens", op, b.first.size(), L);
      forward(q, o, l);  // cuDNN, or the reference kernels where it declines the shape
      k::doc_rows(o.data<bf16>(), out.data<bf16>(), table.data<int32_t>(), n, L, H * D, false, ops_.compute_stream());
      k::doc_lse(l.data<float>(), lse.data<float>(), table.data<int32_t>(), n, L, H, T, false, ops_.compute_stream());
      TRIPOD_CUDA_LAUNCHED("{}: scattering {} documents of up to {} tokens", op, b.first.size(), L);
    }
    return;
  }
  TRIPOD_CHECK(D <= k::kMaxRefHeadDim, "{}: head dimension {} exceeds the reference kernels' {}", op, D,
               k::kMaxRefHeadDim);
  k::attention_forward(qkv.data<bf16>(), out.data<bf16>(), lse.data<float>(), B, T, H, Hkv, D,
                       docs.start.data<int32_t>(), 1.0f / std::sqrt(static_cast<float>(D)), ops_.compute_stream());
  TRIPOD_CUDA_LAUNCHED("{} qkv {} (reference kernels)", op, qkv.str());
  last_impl_ = "reference";
}

void AttentionRunner::backward_docs(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                                    const DocRows& docs, Tensor& dqkv) {
  const char* op = "attention_backward_docs";
  auto [B, T, H, Hkv, D] = qkv_dims(qkv, out, op);
  expect(qkv, DType::BF16, B * T * (H + 2 * Hkv) * D, op, "qkv");
  expect(dqkv, DType::BF16, B * T * (H + 2 * Hkv) * D, op, "dqkv");
  expect(out, DType::BF16, B * T * H * D, op, "out");
  expect(dout, DType::BF16, B * T * H * D, op, "dout");
  expect(lse, DType::F32, B * H * T, op, "lse");
  expect_starts(docs.start, B, T, op);
  TRIPOD_CHECK(docs.offsets.size() >= 2 && docs.offsets.front() == 0 && docs.offsets.back() == B * T,
               "{}: document offsets must run from 0 to B T = {}", op, B * T);
  if (mode_ != AttentionKernels::Reference) {
    const int64_t W = (H + 2 * Hkv) * D;
    const cudaStream_t s = ops_.compute_stream();
    for (const DocBatch& b : doc_batches(docs.offsets, T)) {
      const int64_t n = b.n(), L = b.L;
      Tensor table = doc_table(ops_, b);
      const int32_t* tab = table.data<int32_t>();
      Tensor q = ops_.empty({n, L, H + 2 * Hkv, D}, DType::BF16, MemCategory::Workspace);
      Tensor o = ops_.empty({n, L, H, D}, DType::BF16, MemCategory::Workspace);
      Tensor d = ops_.empty({n, L, H, D}, DType::BF16, MemCategory::Workspace);
      Tensor l = ops_.empty({n, H, L}, DType::F32, MemCategory::Workspace);
      Tensor dq = ops_.empty({n, L, H + 2 * Hkv, D}, DType::BF16, MemCategory::Workspace);
      k::doc_rows(qkv.data<bf16>(), q.data<bf16>(), tab, n, L, W, true, s);
      k::doc_rows(out.data<bf16>(), o.data<bf16>(), tab, n, L, H * D, true, s);
      k::doc_rows(dout.data<bf16>(), d.data<bf16>(), tab, n, L, H * D, true, s);
      k::doc_lse(lse.data<float>(), l.data<float>(), tab, n, L, H, T, true, s);
      TRIPOD_CUDA_LAUNCHED("{}: gathering {} documents of up to {} tokens", op, b.first.size(), L);
      backward(d, q, o, l, dq);
      k::doc_rows(dq.data<bf16>(), dqkv.data<bf16>(), tab, n, L, W, false, s);
      TRIPOD_CUDA_LAUNCHED("{}: scattering {} documents of up to {} tokens", op, b.first.size(), L);
    }
    return;
  }
  TRIPOD_CHECK(D <= k::kMaxRefHeadDim, "{}: head dimension {} exceeds the reference kernels' {}", op, D,
               k::kMaxRefHeadDim);
  Tensor delta = ops_.empty({B, H, T}, DType::F32, MemCategory::Workspace);
  k::attention_backward(dout.data<bf16>(), qkv.data<bf16>(), out.data<bf16>(), lse.data<float>(), dqkv.data<bf16>(),
                        delta.data<float>(), B, T, H, Hkv, D, docs.start.data<int32_t>(),
                        1.0f / std::sqrt(static_cast<float>(D)), ops_.compute_stream());
  TRIPOD_CUDA_LAUNCHED("{} qkv {} (reference kernels)", op, qkv.str());
  last_impl_ = "reference";
}

// ---- the Ops entry points ---------------------------------------------------------------------

void CudaOps::attention_forward(const Tensor& qkv, Tensor& out, Tensor& lse, Tensor& probs) {
  ScopedTimer timer(*this, OpFamily::Attention);
  attention_->forward(qkv, out, lse);
}

void CudaOps::attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                                 const Tensor& probs, Tensor& dqkv) {
  ScopedTimer timer(*this, OpFamily::Attention);
  attention_->backward(dout, qkv, out, lse, dqkv);
}

void CudaOps::attention_forward_docs(const Tensor& qkv, const DocRows& docs, Tensor& out, Tensor& lse) {
  ScopedTimer timer(*this, OpFamily::Attention);
  attention_->forward_docs(qkv, docs, out, lse);
}

void CudaOps::attention_backward_docs(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                                      const DocRows& docs, Tensor& dqkv) {
  ScopedTimer timer(*this, OpFamily::Attention);
  attention_->backward_docs(dout, qkv, out, lse, docs, dqkv);
}

void CudaOps::attention_decode(const Tensor& qkv, Tensor& k_cache, Tensor& v_cache, int64_t pos, Tensor& out) {
  ScopedTimer timer(*this, OpFamily::Attention);
  const char* op = "attention_decode";
  auto [B, n, H, Hkv, D] = qkv_dims(qkv, out, op);
  TRIPOD_CHECK(k_cache.dim() == 4 && k_cache.size(0) == B && k_cache.size(1) == Hkv && k_cache.size(3) == D,
               "{}: k_cache {} must be (B, Hkv, T_max, D) = ({}, {}, T_max, {})", op, k_cache.str(), B, Hkv, D);
  const int64_t Tmax = k_cache.size(2);
  TRIPOD_CHECK(pos >= 0 && pos + n <= Tmax, "{}: positions [{}, {}) beyond the cache's {}", op, pos, pos + n, Tmax);
  TRIPOD_CHECK(D <= k::kMaxRefHeadDim, "{}: head dimension {} exceeds the kernels' {}", op, D, k::kMaxRefHeadDim);
  expect(qkv, DType::BF16, B * n * (H + 2 * Hkv) * D, op, "qkv");
  expect(k_cache, DType::BF16, B * Hkv * Tmax * D, op, "k_cache");
  expect(v_cache, DType::BF16, B * Hkv * Tmax * D, op, "v_cache");
  expect(out, DType::BF16, B * n * H * D, op, "out");
  k::attention_decode(qkv.data<bf16>(), k_cache.data<bf16>(), v_cache.data<bf16>(), out.data<bf16>(), B, n, H, Hkv,
                      D, Tmax, pos, 1.0f / std::sqrt(static_cast<float>(D)), compute_stream());
  TRIPOD_CUDA_LAUNCHED("{} qkv {} cache {} pos {}", op, qkv.str(), k_cache.str(), pos);
}

// Blocks of context-parallel attention: the reference kernels (attention_ref.cu), f32 running
// results and gradient accumulators.
namespace {
struct BlockShape {
  int64_t B, Tq, Tk, Wq, H, Hkv, D;
};
BlockShape block_shape(const Tensor& q, const Tensor& kv, const Tensor& out, const Tensor& lse, bool causal,
                       const char* op) {
  TRIPOD_CHECK(q.dim() == 4 && kv.dim() == 4 && out.dim() == 4, "{}: q {}, kv {} and out {} must be 4-d", op, q.str(),
               kv.str(), out.str());
  BlockShape b{q.size(0), q.size(1), kv.size(1), q.size(2), out.size(2), kv.size(2) / 2, q.size(3)};
  TRIPOD_CHECK(kv.size(0) == b.B && kv.size(3) == b.D && kv.size(2) % 2 == 0 && b.Hkv >= 1 && b.H % b.Hkv == 0 &&
                   b.Wq >= b.H && out.size(0) == b.B && out.size(1) == b.Tq && out.size(3) == b.D &&
                   (!causal || b.Tq == b.Tk),
               "{}: q {}, kv {}, out {}: not (B, Tq, >=H, D), (B, Tk, 2 Hkv, D), (B, Tq, H, D)", op, q.str(), kv.str(),
               out.str());
  TRIPOD_CHECK(b.D <= k::kMaxRefHeadDim, "{}: head dimension {} exceeds the kernels' {}", op, b.D, k::kMaxRefHeadDim);
  expect(q, DType::BF16, b.B * b.Tq * b.Wq * b.D, op, "q");
  expect(kv, DType::BF16, b.B * b.Tk * 2 * b.Hkv * b.D, op, "kv");
  expect(lse, DType::F32, b.B * b.H * b.Tq, op, "lse");
  return b;
}
}  // namespace

void CudaOps::attention_block_forward(const Tensor& q, const Tensor& kv, bool causal, const BlockDocs& docs,
                                      Tensor& out, Tensor& lse) {
  ScopedTimer timer(*this, OpFamily::Attention);
  const char* op = "attention_block_forward";
  const BlockShape b = block_shape(q, kv, out, lse, causal, op);
  expect(out, DType::F32, b.B * b.Tq * b.H * b.D, op, "out");
  if (docs.start.defined()) expect(docs.start, DType::I32, b.B * b.Tq, op, "document starts");
  k::attention_block_forward(q.data<bf16>(), kv.data<bf16>(), out.data<float>(), lse.data<float>(), b.B, b.Tq, b.Tk,
                             b.Wq, b.H, b.Hkv, b.D, causal,
                             docs.start.defined() ? docs.start.data<int32_t>() : nullptr, docs.key_pos,
                             1.0f / std::sqrt(static_cast<float>(b.D)), compute_stream());
  TRIPOD_CUDA_LAUNCHED("{} q {} kv {}", op, q.str(), kv.str());
}

void CudaOps::attention_block_backward(const Tensor& dout, const Tensor& q, const Tensor& kv, const Tensor& out,
                                       const Tensor& lse, bool causal, const BlockDocs& docs, Tensor& dq,
                                       Tensor& dkv) {
  ScopedTimer timer(*this, OpFamily::Attention);
  const char* op = "attention_block_backward";
  const BlockShape b = block_shape(q, kv, out, lse, causal, op);
  expect(out, DType::BF16, b.B * b.Tq * b.H * b.D, op, "out");
  expect(dout, DType::BF16, b.B * b.Tq * b.H * b.D, op, "dout");
  expect(dq, DType::F32, q.numel(), op, "dq");
  expect(dkv, DType::F32, kv.numel(), op, "dkv");
  if (docs.start.defined()) expect(docs.start, DType::I32, b.B * b.Tq, op, "document starts");
  Tensor delta = empty({b.B * b.H * b.Tq}, DType::F32, MemCategory::Workspace);
  k::attention_block_backward(dout.data<bf16>(), q.data<bf16>(), kv.data<bf16>(), out.data<bf16>(), lse.data<float>(),
                              delta.data<float>(), dq.data<float>(), dkv.data<float>(), b.B, b.Tq, b.Tk, b.Wq, b.H,
                              b.Hkv, b.D, causal, docs.start.defined() ? docs.start.data<int32_t>() : nullptr,
                              docs.key_pos, 1.0f / std::sqrt(static_cast<float>(b.D)), compute_stream());
  TRIPOD_CUDA_LAUNCHED("{} q {} kv {}", op, q.str(), kv.str());
}

void CudaOps::attention_kv_pack(const Tensor& qkv, int64_t H, Tensor& kv) {
  const char* op = "attention_kv_pack";
  const int64_t N = qkv.size(0), W = qkv.numel() / std::max<int64_t>(N, 1), w = kv.numel() / std::max<int64_t>(N, 1);
  TRIPOD_CHECK(kv.size(0) == N && w < W && kv.numel() == N * w, "{}: qkv {} and kv {} do not pair", op, qkv.str(),
               kv.str());
  expect(qkv, DType::BF16, N * W, op, "qkv");
  expect(kv, DType::BF16, N * w, op, "kv");
  k::attention_kv_pack(qkv.data<bf16>(), kv.data<bf16>(), N, W, w, compute_stream());
  TRIPOD_CUDA_LAUNCHED("{} qkv {}", op, qkv.str());
}

void CudaOps::attention_kv_unpack(const Tensor& kv, int64_t H, Tensor& qkv) {
  const char* op = "attention_kv_unpack";
  const int64_t N = qkv.size(0), W = qkv.numel() / std::max<int64_t>(N, 1), w = kv.numel() / std::max<int64_t>(N, 1);
  TRIPOD_CHECK(kv.size(0) == N && w < W && kv.numel() == N * w, "{}: qkv {} and kv {} do not pair", op, qkv.str(),
               kv.str());
  expect(qkv, DType::BF16, N * W, op, "qkv");
  if (kv.dtype() == DType::F32)
    k::attention_kv_unpack(kv.data<float>(), qkv.data<bf16>(), N, W, w, compute_stream());
  else
    k::attention_kv_unpack(kv.data<bf16>(), qkv.data<bf16>(), N, W, w, compute_stream());
  TRIPOD_CUDA_LAUNCHED("{} qkv {}", op, qkv.str());
}

const char* CudaOps::attention_impl() const { return attention_->last_impl(); }

}  // namespace tripod::cuda
