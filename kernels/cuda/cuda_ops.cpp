// The CUDA backend's setup (device, streams, handles), memory and elementwise ops, host sums,
// chunk tables and per-op timing.
#include "kernels/cuda/cuda_ops.h"

#include "kernels/cuda/cublas.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <utility>

#include <spdlog/spdlog.h>

#include "kernels/cuda/attention_runner.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemm_runner.h"
#include "kernels/cuda/op_checks.h"

namespace tripod::cuda {

std::string cudnn_error(cudnnStatus_t status) {
  char last[1024] = {};
  cudnnGetLastErrorString(last, sizeof(last));
  std::string out = cudnnGetErrorString(status);
  if (last[0]) out += fmt::format(" ({})", last);
  return out;
}

int device_count() {
  int n = 0;
  // No driver, no GPU, or a driver too old for this runtime: no usable device.
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

std::unique_ptr<Ops> make_cuda_ops(int index, const DebugOptions& debug) {
  return std::make_unique<CudaOps>(index, debug);
}

CudaOps::CudaOps(int device_index, const DebugOptions& debug) : device_(device_index), timing_(debug.cuda_timing) {
  TRIPOD_CUDA_CHECK(cudaSetDevice(device_), "selecting GPU {}", device_);
  cudaDeviceProp prop{};
  TRIPOD_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_), "properties of GPU {}", device_);
  device_name_ = prop.name;
  info_ = {.memory_bytes = static_cast<int64_t>(prop.totalGlobalMem), .cache_bytes = prop.l2CacheSize};
  peak_flops_ = debug.peak_tflops > 0 ? debug.peak_tflops * 1e12 : gpu_peak_flops(device_name_);
  if (peak_flops_ == 0) {
    spdlog::warn("GPU {} ({}): its peak is not known, MFU uses 989 TFLOP/s (H100 SXM); set TRIPOD_PEAK_TFLOPS",
                 device_, device_name_);
    peak_flops_ = 989e12;
  }
  TRIPOD_CUDA_CHECK(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking), "compute stream on GPU {}", device_);
  TRIPOD_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&reduce_dev_), (k::kReduceBlocks + 1) * sizeof(double)), "reduction buffer");
  TRIPOD_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&reduce_host_), sizeof(double)), "reduction result buffer");
  gemm_ = std::make_unique<GemmRunner>(*this);
  attention_ = std::make_unique<AttentionRunner>(*this, debug.attention);
}

CudaOps::~CudaOps() {
  // Destructors do not throw: errors here (a GPU already in a failed state) are ignored.
  cudaStreamSynchronize(compute_);
  for (Upload& u : uploads_) cudaEventDestroy(u.done);
  uploads_.clear();
  attention_.reset();
  gemm_.reset();
  if (cublas_) cublas().Destroy_v2(cublas_);
  for (auto& [key, table] : chunk_tables_) cudaFree(table.first);
  for (Span& s : spans_) {
    cudaEventDestroy(s.start);
    cudaEventDestroy(s.stop);
  }
  for (auto [start, stop] : compute_spans_) {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
  if (compute_start_) cudaEventDestroy(compute_start_);
  for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
  cudaFree(reduce_dev_);
  cudaFreeHost(reduce_host_);
  device_alloc_.release_cache();
  pinned_alloc_.release_cache();
  cudaStreamDestroy(compute_);
  cudaGetLastError();
}

void CudaOps::synchronize() {
  TRIPOD_CUDA_CHECK(cudaStreamSynchronize(compute_), "synchronize (compute stream, GPU {})", device_);
}

// ---- timing ----------------------------------------------------------------------------------

cudaEvent_t CudaOps::take_event() {
  if (!free_events_.empty()) {
    cudaEvent_t e = free_events_.back();
    free_events_.pop_back();
    return e;
  }
  cudaEvent_t e;
  TRIPOD_CUDA_CHECK(cudaEventCreate(&e), "timing event");
  return e;
}

CudaOps::ScopedTimer::ScopedTimer(CudaOps& ops, OpFamily f) : family_(f) {
  if (!ops.timing_) return;
  start_ = ops.take_event();
  const cudaError_t err = cudaEventRecord(start_, ops.compute_);
  if (err != cudaSuccess) ops.free_events_.push_back(start_);  // back to the pool, not leaked
  TRIPOD_CUDA_CHECK(err, "timing event");
  ops_ = &ops;
}

CudaOps::ScopedTimer::~ScopedTimer() {
  if (!ops_) return;
  cudaEvent_t stop = nullptr;
  if (!ops_->free_events_.empty()) {
    stop = ops_->free_events_.back();
    ops_->free_events_.pop_back();
  } else if (cudaEventCreate(&stop) != cudaSuccess) {
    cudaGetLastError();
    ops_->free_events_.push_back(start_);
    return;
  }
  cudaEventRecord(stop, ops_->compute_);
  ops_->spans_.push_back({family_, start_, stop});
}

OpTimes CudaOps::take_times() {
  OpTimes out;
  TRIPOD_CUDA_CHECK(cudaStreamSynchronize(compute_), "collecting op timings");
  for (Span& s : spans_) {
    float ms = 0;
    TRIPOD_CUDA_CHECK(cudaEventElapsedTime(&ms, s.start, s.stop), "collecting op timings");
    out.add(s.family, ms / 1e3);
    free_events_.push_back(s.start);
    free_events_.push_back(s.stop);
  }
  spans_.clear();
  return out;
}

void CudaOps::compute_begin() {
  if (!compute_start_) compute_start_ = take_event();  // a region left open by an error starts again
  TRIPOD_CUDA_CHECK(cudaEventRecord(compute_start_, compute_), "compute clock event");
}

void CudaOps::compute_end() {
  TRIPOD_CHECK(compute_start_, "compute_end() without compute_begin()");
  cudaEvent_t stop = take_event();
  const cudaError_t err = cudaEventRecord(stop, compute_);
  if (err != cudaSuccess) free_events_.push_back(stop);
  TRIPOD_CUDA_CHECK(err, "compute clock event");
  compute_spans_.emplace_back(std::exchange(compute_start_, nullptr), stop);
}

double CudaOps::take_compute_seconds() {
  TRIPOD_CUDA_CHECK(cudaStreamSynchronize(compute_), "reading the compute clock");
  double s = 0;
  for (auto [start, stop] : compute_spans_) {
    float ms = 0;
    TRIPOD_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop), "reading the compute clock");
    s += ms / 1e3;
    free_events_.push_back(start);
    free_events_.push_back(stop);
  }
  compute_spans_.clear();
  return s;
}

// ---- chunk tables and host sums ---------------------------------------------------------------

int CudaOps::chunk_table(std::span<const FlatRange> ranges, const k::Chunk** table) {
  std::vector<int64_t> key;
  key.reserve(ranges.size() * 3);
  for (const FlatRange& r : ranges) key.insert(key.end(), {r.begin, r.end, r.decay ? 1 : 0});
  auto it = chunk_tables_.find(key);
  if (it == chunk_tables_.end()) {
    if (chunk_tables_.size() >= 256) {  // an unexpected variety of range lists: start over
      TRIPOD_CUDA_CHECK(cudaStreamSynchronize(compute_), "chunk table cache");
      for (auto& [k, t] : chunk_tables_) cudaFree(t.first);
      chunk_tables_.clear();
    }
    std::vector<k::Chunk> chunks;
    for (const FlatRange& r : ranges)
      for (int64_t b = r.begin; b < r.end; b += k::kChunkElems)
        chunks.push_back({b, std::min(r.end, b + k::kChunkElems), r.decay ? 1 : 0, 0});
    k::Chunk* dev = nullptr;
    if (!chunks.empty()) {
      TRIPOD_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&dev), chunks.size() * sizeof(k::Chunk)), "chunk table of {} ranges",
                        ranges.size());
      // Pageable source: the call returns once the bytes are staged; the copy is ordered before
      // the kernels that read the table on the same stream.
      TRIPOD_CUDA_CHECK(cudaMemcpyAsync(dev, chunks.data(), chunks.size() * sizeof(k::Chunk), cudaMemcpyHostToDevice,
                                        compute_),
                        "chunk table of {} ranges", ranges.size());
    }
    it = chunk_tables_.emplace(std::move(key), std::make_pair(dev, static_cast<int>(chunks.size()))).first;
  }
  *table = it->second.first;
  return it->second.second;
}

double CudaOps::reduce_to_host(const float* x, const k::Chunk* chunks, int nchunks, bool square, const char* what) {
  k::reduce_sum(x, chunks, nchunks, square, reduce_dev_, reduce_dev_ + k::kReduceBlocks, compute_);
  TRIPOD_CUDA_LAUNCHED("{} ({} chunks)", what, nchunks);
  TRIPOD_CUDA_CHECK(cudaMemcpyAsync(reduce_host_, reduce_dev_ + k::kReduceBlocks, sizeof(double),
                                    cudaMemcpyDeviceToHost, compute_),
                    "{}", what);
  TRIPOD_CUDA_CHECK(cudaStreamSynchronize(compute_), "{}", what);
  return *reduce_host_;
}

double CudaOps::sum_squares(const Tensor& t, std::span<const FlatRange> ranges) {
  ScopedTimer timer(*this, OpFamily::Reduction);
  expect_on_device(t, "sum_squares", "t");
  expect_dtype(t, DType::F32, "sum_squares", "t");
  for (const FlatRange& r : ranges)
    TRIPOD_CHECK(0 <= r.begin && r.begin <= r.end && r.end <= t.numel(), "sum_squares: range [{}, {}) of {}", r.begin,
                 r.end, t.str());
  const k::Chunk* table = nullptr;
  int n = chunk_table(ranges, &table);
  return reduce_to_host(t.data<float>(), table, n, true, "sum_squares");
}

double CudaOps::sum(const Tensor& t) {
  ScopedTimer timer(*this, OpFamily::Reduction);
  expect_on_device(t, "sum", "t");
  expect_dtype(t, DType::F32, "sum", "t");
  const FlatRange all{0, t.numel(), false};
  const k::Chunk* table = nullptr;
  int n = chunk_table(std::span<const FlatRange>(&all, 1), &table);
  return reduce_to_host(t.data<float>(), table, n, false, "sum");
}

// ---- memory and elementwise -------------------------------------------------------------------

namespace {

template <class S, class D> void host_convert_typed(const S* s, D* d, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<D, bf16>)
      d[i] = bf16(static_cast<float>(s[i]));
    else if constexpr (std::is_same_v<S, bf16>)
      d[i] = static_cast<D>(static_cast<float>(s[i]));
    else
      d[i] = static_cast<D>(s[i]);
  }
}

template <class S> void host_convert_from(const S* s, const Tensor& dst, int64_t n) {
  switch (dst.dtype()) {
    case DType::F32: host_convert_typed(s, dst.data<float>(), n); break;
    case DType::BF16: host_convert_typed(s, dst.data<bf16>(), n); break;
    case DType::I32: host_convert_typed(s, dst.data<int32_t>(), n); break;
    case DType::F64: host_convert_typed(s, dst.data<double>(), n); break;
  }
}

// dst = src for two host tensors (the CPU backend's conversions).
void host_convert(const Tensor& src, const Tensor& dst) {
  const int64_t n = src.numel();
  if (src.dtype() == dst.dtype()) {
    if (src.raw() != dst.raw()) std::memcpy(dst.raw(), src.raw(), src.nbytes());
    return;
  }
  switch (src.dtype()) {
    case DType::F32: host_convert_from(src.data<float>(), dst, n); break;
    case DType::BF16: host_convert_from(src.data<bf16>(), dst, n); break;
    case DType::I32: host_convert_from(src.data<int32_t>(), dst, n); break;
    case DType::F64: host_convert_from(src.data<double>(), dst, n); break;
  }
}

}  // namespace

void CudaOps::fill(Tensor& t, float value) {
  ScopedTimer timer(*this, OpFamily::Memory);
  TRIPOD_CHECK(t.defined(), "fill: undefined tensor");
  if (t.device() == Device::CPU) {  // host memory (e.g. a staging buffer)
    const int64_t n = t.numel();
    switch (t.dtype()) {
      case DType::F32: std::fill_n(t.data<float>(), n, value); break;
      case DType::BF16: std::fill_n(t.data<bf16>(), n, bf16(value)); break;
      case DType::I32: std::fill_n(t.data<int32_t>(), n, static_cast<int32_t>(value)); break;
      case DType::F64: std::fill_n(t.data<double>(), n, static_cast<double>(value)); break;
    }
    return;
  }
  TRIPOD_CHECK(t.dtype() != DType::F64, "fill {}: f64 tensors live on the host only", t.str());
  k::fill(t.raw(), t.dtype(), t.numel(), value, compute_);
  TRIPOD_CUDA_LAUNCHED("fill {} with {}", t.str(), value);
}

// Host -> device through a pinned staging buffer of this backend: the host converts into it, the
// copy runs asynchronously on the compute stream, and the buffer is kept until an event says the
// copy is done. The caller may reuse `src` at once and the host never waits (uploading a
// micro-batch's tokens mid-step costs no synchronisation).
void CudaOps::upload(const Tensor& src, Tensor& dst) {
  reap_uploads();
  Tensor staging = Tensor::empty(pinned_alloc_, dst.shape(), dst.dtype(), MemCategory::Comm);
  host_convert(src, staging);
  TRIPOD_CUDA_CHECK(cudaMemcpyAsync(dst.raw(), staging.raw(), staging.nbytes(), cudaMemcpyHostToDevice, compute_),
                    "copy {} -> {}", src.str(), dst.str());
  cudaEvent_t done;
  TRIPOD_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "copy {} -> {}", src.str(), dst.str());
  const cudaError_t err = cudaEventRecord(done, compute_);
  if (err != cudaSuccess) cudaEventDestroy(done);
  TRIPOD_CUDA_CHECK(err, "copy {} -> {}", src.str(), dst.str());
  uploads_.push_back({std::move(staging), done});
}

void CudaOps::reap_uploads() {
  while (!uploads_.empty()) {
    cudaError_t q = cudaEventQuery(uploads_.front().done);
    if (q == cudaErrorNotReady) break;
    TRIPOD_CUDA_CHECK(q, "host to device copy");
    cudaEventDestroy(uploads_.front().done);
    uploads_.pop_front();  // the staging block goes back to the pinned cache
  }
}

void CudaOps::copy(const Tensor& src, Tensor& dst) {
  ScopedTimer timer(*this, OpFamily::Memory);
  TRIPOD_CHECK(src.defined() && dst.defined() && src.numel() == dst.numel(), "copy {} -> {}",
               src.defined() ? src.str() : "undefined", dst.defined() ? dst.str() : "undefined");
  const bool src_host = src.device() == Device::CPU, dst_host = dst.device() == Device::CPU;
  const int64_t n = src.numel();
  if (n == 0) return;
  if (src_host && dst_host) {
    host_convert(src, dst);
    return;
  }
  if (!src_host && !dst_host) {
    if (src.dtype() == dst.dtype()) {
      if (src.raw() != dst.raw())
        TRIPOD_CUDA_CHECK(cudaMemcpyAsync(dst.raw(), src.raw(), src.nbytes(), cudaMemcpyDeviceToDevice, compute_),
                          "copy {} -> {}", src.str(), dst.str());
    } else {
      k::convert(src.raw(), src.dtype(), dst.raw(), dst.dtype(), n, compute_);
      TRIPOD_CUDA_LAUNCHED("copy {} -> {}", src.str(), dst.str());
    }
    return;
  }
  if (src_host) {  // host -> device, without waiting (see upload())
    upload(src, dst);
    return;
  }
  // device -> host: the caller reads the result at once, so this waits for it.
  Tensor staged = src;
  if (src.dtype() != dst.dtype()) {
    staged = Tensor::empty(device_alloc_, src.shape(), dst.dtype(), MemCategory::Workspace);
    k::convert(src.raw(), src.dtype(), staged.raw(), dst.dtype(), n, compute_);
    TRIPOD_CUDA_LAUNCHED("copy {} -> {}", src.str(), dst.str());
  }
  TRIPOD_CUDA_CHECK(cudaMemcpyAsync(dst.raw(), staged.raw(), staged.nbytes(), cudaMemcpyDeviceToHost, compute_),
                    "copy {} -> {}", src.str(), dst.str());
  TRIPOD_CUDA_CHECK(cudaStreamSynchronize(compute_), "copy {} -> {}", src.str(), dst.str());
}

void CudaOps::add(const Tensor& a, const Tensor& b, Tensor& out) {
  ScopedTimer timer(*this, OpFamily::Elementwise);
  for (const Tensor* t : {&a, &b, static_cast<const Tensor*>(&out)}) expect_on_device(*t, "add", "operand");
  TRIPOD_CHECK(a.numel() == b.numel() && a.numel() == out.numel() && a.dtype() == b.dtype() &&
                   a.dtype() == out.dtype() && a.dtype() != DType::I32,
               "add {} + {} -> {}: same size and float dtype expected", a.str(), b.str(), out.str());
  k::add(a.raw(), b.raw(), out.raw(), a.dtype(), a.numel(), compute_);
  TRIPOD_CUDA_LAUNCHED("add {} + {} -> {}", a.str(), b.str(), out.str());
}

void CudaOps::accumulate(Tensor& dst, const Tensor& src) {
  ScopedTimer timer(*this, OpFamily::Elementwise);
  expect_on_device(dst, "accumulate", "dst");
  expect_on_device(src, "accumulate", "src");
  TRIPOD_CHECK(dst.numel() == src.numel() && dst.dtype() != DType::I32 && src.dtype() != DType::I32,
               "accumulate {} += {}: same size and float dtypes expected", dst.str(), src.str());
  k::accumulate(dst.raw(), dst.dtype(), src.raw(), src.dtype(), dst.numel(), compute_);
  TRIPOD_CUDA_LAUNCHED("accumulate {} += {}", dst.str(), src.str());
}

void CudaOps::scale(Tensor& t, float s) {
  ScopedTimer timer(*this, OpFamily::Elementwise);
  expect_on_device(t, "scale", "t");
  TRIPOD_CHECK(t.dtype() != DType::I32, "scale {}: float dtype expected", t.str());
  k::scale(t.raw(), t.dtype(), t.numel(), s, compute_);
  TRIPOD_CUDA_LAUNCHED("scale {} by {}", t.str(), s);
}

}  // namespace tripod::cuda
