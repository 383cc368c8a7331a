// Causal self-attention on the GPU: cuDNN's fused flash attention (backend graph API), its
// execution plans built once per shape and cached; the reference kernels of attention_ref.cu for
// shapes cuDNN has no engine for, or when asked for.
//
// AttentionKernels (DebugOptions::attention, TRIPOD_ATTENTION): Auto (the default: cuDNN, the
// reference kernels with a warning when cuDNN declines a shape, at planning or at its first
// execution) | Cudnn (cuDNN or fail) | Reference.
#pragma once

#include <compare>
#include <map>
#include <memory>
#include <string>

#include "core/debug_options.h"
#include "core/tensor.h"
#include "kernels/op.h"

struct cudnnContext;

namespace tripod::cuda {

class CudaOps;

class AttentionRunner {
 public:
  AttentionRunner(CudaOps& ops, AttentionKernels kernels);
  ~AttentionRunner();
  AttentionRunner(const AttentionRunner&) = delete;
  AttentionRunner& operator=(const AttentionRunner&) = delete;

  // qkv (B, T, H + 2 Hkv, D) -> out (B, T, H, D), lse (B, H, T) f32.
  void forward(const Tensor& qkv, Tensor& out, Tensor& lse);
  // dout (B, T, H, D) -> dqkv (B, T, H + 2 Hkv, D).
  void backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse, Tensor& dqkv);
  // The same within packed documents (Ops::attention_forward_docs): cuDNN on the documents batched
  // by length (each padded to a power of two; exact, since padding at a causal sequence's end is
  // invisible to its queries), or under AttentionKernels::Reference the reference kernels, each
  // query visiting only its document's keys.
  void forward_docs(const Tensor& qkv, const DocRows& docs, Tensor& out, Tensor& lse);
  void backward_docs(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                     const DocRows& docs, Tensor& dqkv);
  // "cudnn" or "reference": what the last call ran.
  const char* last_impl() const { return last_impl_; }

  struct Plan;  // a finalized cuDNN execution plan and the descriptors it uses (attention.cpp)

 private:
  struct Shape {
    int64_t B, T, H, Hkv, D;
    bool backward;
    auto operator<=>(const Shape&) const = default;
  };
  // The cached plan for a shape, built on first use; null when cuDNN declined it (Auto mode).
  Plan* plan_for(const Shape& s);
  // True when a plan's execution succeeded (a cudnnStatus_t); otherwise the shape falls back to
  // the reference kernels for good, with a warning (an error under TRIPOD_ATTENTION=cudnn).
  bool executed(int status, const Shape& s);

  CudaOps& ops_;
  cudnnContext* handle_ = nullptr;
  AttentionKernels mode_;
  std::map<Shape, std::unique_ptr<Plan>> plans_;
  const char* last_impl_ = "none";
};

}  // namespace tripod::cuda
