// Evaluation: the per-token mean loss of the model over samples of a data split, by a
// forward-only pass through the pipeline (parallel/pipeline's forward-only schedule), on any
// grid. Perplexity = exp(loss). Used by the trainer (train.eval_interval) and `tripod eval`.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "data/gpt_data.h"
#include "data/sample_source.h"
#include "model/gpt.h"
#include "parallel/context.h"
#include "parallel/pipeline/executor.h"
#include "config/config.h"
#include "config/layout.h"

namespace tripod {

struct EvalResult {
  double loss = 0;        // mean over the tokens (those that count, under data.eod_mask_loss)
  double perplexity = 0;  // exp(loss)
  int64_t tokens = 0, samples = 0;
};

class Evaluator {
 public:
  // `model` is this rank's part of the model as `layout` places it (built by the trainer or a
  // command); cfg gives the global batch. `layout` is a forward-only one (make_eval_layout), whose
  // schedule the evaluator runs.
  Evaluator(const Config& cfg, const RankLayout& layout, Ops& ops, ParallelContext& par, GptModel& model);

  // Mean loss over samples [first, first + samples) of `data`, read in global batches in the
  // training order (data/sampler.h) so that any grid reads the same samples; a last partial
  // batch is padded with samples that are computed but not counted. Collective over the world;
  // every rank returns the same result. `data` may be null on ranks that hold neither the
  // embedding nor the head.
  EvalResult evaluate(const SampleSource* data, int64_t samples, int64_t first = 0);

 private:
  Config cfg_;
  const RankLayout layout_;  // forward-only (make_eval_layout)
  Ops& ops_;
  ParallelContext& par_;
  GptModel& model_;
  std::unique_ptr<PipelineExecutor> executor_;
};

// The samples of `split` for a run: data.prefixes' split (data.split), or, with data.synthetic, a
// synthetic stream seeded with train.seed for training and apart from it for the other splits.
// `samples` is how many the run will read. Collective over `sync` like make_gpt_source.
std::unique_ptr<SampleSource> make_split_source(const Config& cfg, Split split, int64_t samples, Communicator* sync);

// "valid" / "validation" -> Valid, "test" -> Test; an InputError naming `what` otherwise.
Split parse_eval_split(const std::string& name, const std::string& what);

}  // namespace tripod
