// Forward-only evaluation over a data split.
#include "train/evaluator.h"

#include <cmath>

#include "data/sampler.h"
#include "parallel/pipeline/schedules.h"
#include "parallel/tensor_parallel/mappings.h"
#include "train/microbatch.h"

namespace tripod {

Split parse_eval_split(const std::string& name, const std::string& what) {
  if (name == "valid" || name == "validation") return Split::Valid;
  if (name == "test") return Split::Test;
  throw InputError(fmt::format("{} '{}' is not a split to evaluate (valid: valid, test)", what, name));
}

std::unique_ptr<SampleSource> make_split_source(const Config& cfg, Split split, int64_t samples, Communicator* sync) {
  if (cfg.data.synthetic) {
    // The same kind of phrases per split, each from its own seed (Train = 0 keeps train.seed).
    const uint64_t seed = cfg.train.seed + 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(split);
    return std::make_unique<SyntheticSource>(cfg.model.seq_len, cfg.model.vocab_size, seed);
  }
  return make_gpt_source(GptDataOptions{.prefixes = cfg.data.prefixes, .weights = cfg.data.weights,
                                        .split = cfg.data.split, .seq_len = cfg.model.seq_len, .seed = cfg.train.seed,
                                        .num_samples = std::max<int64_t>(1, samples),
                                        .vocab_size = cfg.model.vocab_size,
                                        .eod_token = cfg.data.documents() ? cfg.data.eod_token_id : -1},
                         split, sync);
}

Evaluator::Evaluator(const Config& cfg, const RankLayout& layout, Ops& ops, ParallelContext& par, GptModel& model)
    : cfg_(cfg), layout_(layout), ops_(ops), par_(par), model_(model) {
  TRIPOD_CHECK(layout.schedule.forward_only, "the evaluator runs a forward-only layout (make_eval_layout), not a {} "
               "schedule", enum_name(layout.schedule.kind));
  executor_ = std::make_unique<PipelineExecutor>(layout.schedule, par.pp.get(), layout.coords.pp, nullptr,
                                                 par.flight.get());
}

EvalResult Evaluator::evaluate(const SampleSource* data, int64_t samples, int64_t first) {
  TRIPOD_CHECK(samples >= 1 && first >= 0, "evaluate {} samples from {}", samples, first);
  const RankLayout& rl = layout_;
  TRIPOD_CHECK(!(rl.has_embedding || rl.has_head) || data, "rank {} holds the embedding or head but has no eval data",
               rl.rank);
  TRIPOD_CHECK(!cfg_.data.documents() || data, "rank {} has no eval data, but packed documents need every rank's "
               "samples", rl.rank);
  const int64_t gb = cfg_.train.global_batch_size, B = rl.micro_batch_size, T = cfg_.model.seq_len;
  const int64_t N = rl.micro_tokens, Ns = rl.local_tokens;
  const int M = rl.microbatches, vp = model_.num_chunks();
  const SampleOrder order{.global_batch = gb, .micro_batch = B, .dp = rl.grid.dp()};
  const int64_t end = first + samples, batches = (samples + gb - 1) / gb;
  CpuAllocator host;
  Tensor host_losses = Tensor::empty(host, {N}, DType::F32, MemCategory::Workspace);
  double loss_sum = 0;  // this rank's counted tokens (the head's TP rank 0 only)

  for (int64_t batch = 0; batch < batches; ++batch) {
    const int64_t consumed = first + batch * gb;
    std::vector<MicroBatch> mbs(M);
    std::vector<int> pending(M, 0);
    PipelineCallbacks cb;
    cb.forward = [&](int mb, int chunk, const Tensor& input) {
      if (pending[mb] == 0) {
        load_microbatch(data, cfg_, rl, ops_, consumed, mb, mbs[mb]);
        if (rl.has_head) mbs[mb].losses = ops_.empty({N}, DType::F32, MemCategory::Workspace);
        pending[mb] = vp;
      }
      ChunkActs acts;  // nothing is kept: there is no backward
      Tensor out = model_.forward(chunk, mbs[mb], input, acts);
      if (model_.layout(chunk).has_head && rl.coords.tp == 0) {
        ops_.copy(mbs[mb].losses, host_losses);
        const float* l = host_losses.data<float>();
        // This rank's tokens of sample b: T / cp of them, in slots of c (context parallelism).
        const MicroShape& ms = mbs[mb].shape;
        const int64_t c = ms.slot_tokens();
        for (int64_t b = 0; b < B; ++b) {
          if (order.index(consumed, mb, rl.coords.dp, b) >= end) continue;  // padding of the last batch
          double s = 0;
          for (int slot = 0; slot < ms.slots(); ++slot)
            for (int64_t t = 0; t < c; ++t) s += l[(slot * B + b) * c + t];
          loss_sum += s;
        }
      }
      if (--pending[mb] == 0) mbs[mb] = MicroBatch{};
      return out;
    };
    cb.recv_buffer = [&](int, int, bool) {
      return ops_.empty({Ns, cfg_.model.d_model}, ops_.compute_dtype(), MemCategory::Activations);
    };
    executor_->run(cb);
  }

  // Every rank learns the sum, in f64: every grid reports what the single-rank run does.
  Tensor red = Tensor::empty(host, {1}, DType::F64, MemCategory::Workspace);
  red.data<double>()[0] = loss_sum;
  if (par_.grid.world_size() > 1) par_.world->all_reduce(red);
  EvalResult r;
  r.samples = samples;
  // Under data.eod_mask_loss the mean is over the tokens that count (the others' losses are 0).
  r.tokens = cfg_.data.eod_mask_loss ? summarize_documents(*data, cfg_, first, samples).counted : samples * T;
  r.loss = red.data<double>()[0] / static_cast<double>(std::max<int64_t>(1, r.tokens));
  r.perplexity = std::exp(r.loss);
  return r;
}

}  // namespace tripod
