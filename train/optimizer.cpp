// AdamW on owned ranges of the flat buffers.
#include "train/optimizer.h"

namespace tripod {

AdamW::AdamW(Ops& ops, ParamRegistry& reg, std::vector<FlatSpan> owned, const AdamWConfig& cfg, uint64_t init_seed)
    : ops_(ops), reg_(reg), cfg_(cfg) {
  const bool separate_master = ops.compute_dtype() != DType::F32;
  CpuAllocator host;
  for (const FlatSpan& span : owned) {
    if (span.size() == 0) continue;
    Shard sh;
    sh.span = span;
    for (const Param& p : reg.params()) {
      int64_t b = std::max(span.begin, p.offset), e = std::min(span.end, p.offset + p.numel());
      if (b < e) sh.ranges.push_back({b - span.begin, e - span.begin, p.spec.decay});
    }
    sh.m = ops.empty({span.size()}, DType::F32, MemCategory::Optimizer);
    sh.v = ops.empty({span.size()}, DType::F32, MemCategory::Optimizer);
    ops.fill(sh.m, 0.f);
    ops.fill(sh.v, 0.f);
    if (separate_master) {
      // The master starts from the exact f32 initial values, not their compute-dtype rounding.
      sh.master = ops.empty({span.size()}, DType::F32, MemCategory::Optimizer);
      Tensor h = Tensor::empty(host, {span.size()}, DType::F32, MemCategory::Workspace);
      std::fill(h.data<float>(), h.data<float>() + span.size(), 0.f);
      for (const Param& p : reg.params()) {
        int64_t b = std::max(span.begin, p.offset), e = std::min(span.end, p.offset + p.numel());
        if (b >= e) continue;
        std::vector<float> all(p.numel());
        init_shard_values(p.spec, init_seed, all.data());
        std::copy(all.begin() + (b - p.offset), all.begin() + (e - p.offset), h.data<float>() + (b - span.begin));
      }
      ops.copy(h, sh.master);
    }
    shards_.push_back(std::move(sh));
  }
}

void AdamW::step(double lr, int64_t step, float grad_scale) {
  AdamWHyper h{.lr = static_cast<float>(lr), .beta1 = static_cast<float>(cfg_.beta1),
               .beta2 = static_cast<float>(cfg_.beta2), .eps = static_cast<float>(cfg_.eps),
               .weight_decay = static_cast<float>(cfg_.weight_decay), .step = step, .grad_scale = grad_scale};
  for (Shard& sh : shards_) {
    Tensor values = reg_.flat_values().flat(sh.span.begin, sh.span.end);
    Tensor grads = reg_.flat_grads().flat(sh.span.begin, sh.span.end);
    Tensor& master = sh.master.defined() ? sh.master : values;
    Tensor copy = sh.master.defined() ? values : Tensor{};
    ops_.adamw(master, grads, sh.m, sh.v, sh.ranges, h, copy);
  }
  steps_ = step;
}

double AdamW::grad_sq_sum(const std::function<bool(const ParamSpec&)>& counts) {
  double total = 0;
  for (Shard& sh : shards_) {
    std::vector<FlatRange> ranges;
    for (const Param& p : reg_.params()) {
      if (!counts(p.spec)) continue;
      int64_t b = std::max(sh.span.begin, p.offset), e = std::min(sh.span.end, p.offset + p.numel());
      if (b < e) ranges.push_back({b, e, false});
    }
    total += ops_.sum_squares(reg_.flat_grads(), ranges);
  }
  return total;
}

}  // namespace tripod
