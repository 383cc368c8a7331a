// Downstream tasks scored on the pipeline.
#include "train/task_evaluator.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <numeric>

#include "data/tokenizer.h"
#include "model/inference.h"
#include "parallel/pipeline/schedules.h"
#include "parallel/tensor_parallel/mappings.h"
#include "core/format.h"
#include "train/microbatch.h"

namespace tripod {

namespace {

int64_t round_up(int64_t x, int64_t q) { return (x + q - 1) / q * q; }

// The padded length of a row of `length` tokens: a multiple of 8 (fewer distinct shapes, whole
// vector lanes) and of the granule, or of the granule alone where that would pass seq_len.
int64_t padded_length(int64_t length, const BatchPlanOptions& o) {
  const int64_t coarse = round_up(length, std::lcm<int64_t>(o.granule, 8));
  return coarse <= o.seq_len ? coarse : round_up(length, o.granule);
}

}  // namespace

std::vector<ScoreBatch> plan_score_batches(std::span<const ScoreRequest> requests, const BatchPlanOptions& o) {
  TRIPOD_CHECK(o.granule >= 1 && o.split >= 1 && o.seq_len % o.granule == 0 && o.max_tokens >= o.seq_len,
               "batch plan: granule {}, split {}, seq_len {}, max_tokens {}", o.granule, o.split, o.seq_len,
               o.max_tokens);
  // Groups: the consecutive requests of one example (one request each without batching).
  struct Group {
    int64_t begin, end, length;
  };
  std::vector<Group> groups;
  for (int64_t i = 0; i < static_cast<int64_t>(requests.size()); ++i) {
    const int64_t len = requests[i].length();
    TRIPOD_CHECK(len >= 1 && len <= o.seq_len && requests[i].scored >= 1 && requests[i].scored <= len,
                 "request {}: {} tokens, {} scored, rows of {}", i, len, requests[i].scored, o.seq_len);
    if (o.batch && !groups.empty() && requests[groups.back().begin].example == requests[i].example) {
      groups.back().end = i + 1;
      groups.back().length = std::max(groups.back().length, len);
    } else {
      groups.push_back({i, i + 1, len});
    }
  }
  std::stable_sort(groups.begin(), groups.end(), [](const Group& a, const Group& b) { return a.length > b.length; });

  std::vector<ScoreBatch> out;
  const auto close = [&](ScoreBatch& b) {
    if (b.rows.empty()) return;
    b.B = static_cast<int64_t>(b.rows.size());
    while ((b.B * b.T) % o.split != 0) ++b.B;  // rows of padding for sequence parallelism's split
    out.push_back(std::move(b));
    b = ScoreBatch{};
  };
  const auto capacity = [&](int64_t T) { return o.batch ? std::max<int64_t>(1, o.max_tokens / T) : int64_t{1}; };
  ScoreBatch cur;
  for (const Group& g : groups) {
    if (!cur.rows.empty() && static_cast<int64_t>(cur.rows.size()) + (g.end - g.begin) > capacity(cur.T)) close(cur);
    // Longest first: the batch's first group sets its length, and every later one fits in it.
    if (cur.rows.empty()) cur.T = padded_length(g.length, o);
    for (int64_t r = g.begin; r < g.end; ++r) {  // an example too big for one micro-batch is split
      if (static_cast<int64_t>(cur.rows.size()) == capacity(cur.T)) {
        const int64_t T = cur.T;
        close(cur);
        cur.T = T;
      }
      cur.rows.push_back(r);
    }
  }
  close(cur);
  return out;
}

TaskEvaluator::TaskEvaluator(const Config& cfg, const RankLayout& layout, Ops& ops, ParallelContext& par,
                             GptModel& model, ParamRegistry& reg)
    : cfg_(cfg), layout_(layout), ops_(ops), par_(par), model_(model), reg_(reg) {
  TRIPOD_CHECK(layout.schedule.forward_only, "the task evaluator runs a forward-only layout (make_eval_layout), not a "
               "{} schedule", enum_name(layout.schedule.kind));
}

PipelineExecutor& TaskEvaluator::executor(int microbatches) {
  std::unique_ptr<PipelineExecutor>& e = executors_[microbatches];
  if (!e)
    e = std::make_unique<PipelineExecutor>(
        forward_only_schedule(layout_.grid.pp(), layout_.schedule.vp, microbatches, layout_.schedule.placement),
        par_.pp.get(), layout_.coords.pp, nullptr, par_.flight.get());
  return *e;
}

bool TaskEvaluator::shares_prefixes() const {
  const RankGrid& g = layout_.grid;
  const MoeConfig& moe = cfg_.model.moe;
  return ops_.device() == Device::CPU && g.pp() == 1 && g.cp() == 1 && g.ep() == 1 &&
         !(moe.enabled() && moe.capacity_factor > 0) && !cfg_.train.fp8();
}

std::vector<double> TaskEvaluator::shared_prefix_loglikelihoods(std::span<const ScoreRequest> requests,
                                                                const std::string& progress, int64_t examples) {
  const RankLayout& rl = layout_;
  // An example's requests are consecutive (load_task's order).
  std::vector<std::pair<size_t, size_t>> groups;
  int64_t longest = 1;
  size_t widest = 1;
  for (size_t i = 0; i < requests.size(); ++i) {
    longest = std::max(longest, requests[i].length());
    if (groups.empty() || requests[groups.back().first].example != requests[i].example) groups.push_back({i, i});
    groups.back().second = i + 1;
    widest = std::max(widest, groups.back().second - groups.back().first);
  }
  const int64_t budget = static_cast<int64_t>(rl.micro_batch_size) * cfg_.model.seq_len;
  const int64_t rows = std::clamp<int64_t>(budget / longest, 1, static_cast<int64_t>(widest));
  InferenceModel inf(ops_, par_, cfg_.model, reg_, longest, rows);
  std::vector<double> losses(requests.size(), 0.0);
  const auto t0 = std::chrono::steady_clock::now();
  auto last_line = t0;
  const size_t mine = (groups.size() + rl.grid.dp() - 1 - rl.coords.dp) / rl.grid.dp();
  size_t done = 0;
  for (size_t g = rl.coords.dp; g < groups.size(); g += rl.grid.dp(), ++done) {
    const auto [begin, end] = groups[g];
    // The inputs every request leaves unscored and shares with the first.
    const std::vector<int32_t>& first = requests[begin].tokens;
    int64_t P = requests[begin].length() - requests[begin].scored;
    for (size_t r = begin + 1; r < end; ++r) {
      const ScoreRequest& q = requests[r];
      P = std::min(P, q.length() - q.scored);
      P = std::mismatch(first.begin(), first.begin() + P, q.tokens.begin()).first - first.begin();
    }
    inf.reset();
    if (P > 0) inf.forward(std::span(first).first(P));
    for (size_t c = begin; c < end; c += rows) {
      const size_t ce = std::min(end, c + rows);
      inf.rewind(P);
      inf.share_prefix(static_cast<int64_t>(ce - c));
      // Each row's inputs past the prefix, and their targets (-1 where not scored).
      std::vector<int32_t> tokens, targets;
      std::vector<int64_t> lengths;
      for (size_t r = c; r < ce; ++r) {
        const ScoreRequest& q = requests[r];
        const int64_t n = q.length() - P;
        for (int64_t t = 0; t < n; ++t) {
          tokens.push_back(q.tokens[P + t]);
          targets.push_back(t >= n - q.scored ? q.tokens[P + t + 1] : -1);
        }
        lengths.push_back(n);
      }
      const std::vector<float> token_losses = inf.forward_rows(tokens, lengths, targets);
      int64_t at = 0;  // the first token of request r's row
      for (size_t r = c; r < ce; ++r) {
        const int64_t n = lengths[r - c];
        double loss = 0;  // the scored tokens' losses, summed in f64 as the pipeline's path does
        for (int64_t t = 0; t < n; ++t) loss += token_losses[at + t];
        if (rl.coords.tp == 0) losses[r] = loss;  // every TP rank holds the same losses
        at += n;
      }
    }
    const auto now = std::chrono::steady_clock::now();
    if (!progress.empty() && par_.rank == 0 && now - last_line > std::chrono::seconds(10)) {
      last_line = now;
      const double frac = static_cast<double>(done + 1) / static_cast<double>(std::max<size_t>(1, mine));
      const double sec = std::chrono::duration<double>(now - t0).count();
      spdlog::info("{}: {}/{} examples ({:.0f}%) | {:.1f} examples/s | ETA {}", progress,
                   static_cast<int64_t>(frac * static_cast<double>(examples)), examples, 100 * frac,
                   frac * static_cast<double>(examples) / sec, format_duration(sec / frac - sec));
    }
  }
  return world_loglikelihoods(losses);
}

std::vector<double> TaskEvaluator::world_loglikelihoods(const std::vector<double>& losses) {
  CpuAllocator host;
  Tensor red = Tensor::empty(host, {static_cast<int64_t>(std::max<size_t>(1, losses.size()))}, DType::F64,
                             MemCategory::Workspace);
  std::fill(red.data<double>(), red.data<double>() + red.numel(), 0.0);
  std::copy(losses.begin(), losses.end(), red.data<double>());
  if (par_.grid.world_size() > 1) par_.world->all_reduce(red);
  std::vector<double> out(losses.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = -red.data<double>()[i];
  return out;
}

std::vector<double> TaskEvaluator::loglikelihoods(std::span<const ScoreRequest> requests, const std::string& progress,
                                                  int64_t examples, bool batch) {
  if (batch && shares_prefixes()) return shared_prefix_loglikelihoods(requests, progress, examples);
  const RankLayout& rl = layout_;
  const int cp = rl.grid.cp(), tp = rl.grid.tp(), dp = rl.grid.dp();
  const bool sp = sequence_parallel(par_);
  const int64_t C = cfg_.model.d_model;
  const std::vector<ScoreBatch> plan =
      plan_score_batches(requests, {.max_tokens = static_cast<int64_t>(rl.micro_batch_size) * cfg_.model.seq_len,
                                    .seq_len = cfg_.model.seq_len,
                                    .granule = cp > 1 ? 2 * cp : 1,
                                    .split = sp ? tp * cp : 1,  // this rank's B T / cp tokens split over tp
                                    .batch = batch});
  std::vector<const ScoreBatch*> mine;  // this DP rank's micro-batches
  int64_t my_rows = 0;
  for (size_t i = rl.coords.dp; i < plan.size(); i += dp) {
    mine.push_back(&plan[i]);
    my_rows += static_cast<int64_t>(plan[i].rows.size());
  }

  CpuAllocator host;
  std::vector<double> sums(requests.size(), 0.0);  // sums of this rank's scored losses
  const bool reads_losses = rl.has_head && rl.coords.tp == 0;
  const auto t0 = std::chrono::steady_clock::now();
  auto last_line = t0;
  int64_t rows_done = 0;
  const int M = std::max(1, rl.microbatches);
  const int vp = model_.num_chunks();
  for (size_t first = 0; first < mine.size(); first += M) {
    const int m = static_cast<int>(std::min<size_t>(M, mine.size() - first));
    std::vector<MicroBatch> mbs(m);
    std::vector<int> pending(m, 0);
    const auto shape = [&](int mb) {
      const ScoreBatch& b = *mine[first + mb];
      return MicroShape{.B = b.B, .T = b.T / cp, .cp = cp, .cp_rank = rl.coords.cp};
    };
    PipelineCallbacks cb;
    cb.forward = [&](int mb, int chunk, const Tensor& input) {
      const ScoreBatch& b = *mine[first + mb];
      MicroBatch& x = mbs[mb];
      if (pending[mb] == 0) {
        x.shape = shape(mb);
        if (rl.has_embedding || rl.has_head) {
          Tensor in = Tensor::empty(host, {x.shape.N()}, DType::I32, MemCategory::Workspace);
          Tensor tg = Tensor::empty(host, {x.shape.N()}, DType::I32, MemCategory::Workspace);
          std::vector<int32_t> sample(b.T + 1);
          for (int64_t r = 0; r < b.B; ++r) {  // rows past b.rows are padding
            std::fill(sample.begin(), sample.end(), 0);
            if (r < static_cast<int64_t>(b.rows.size())) {
              const std::vector<int32_t>& t = requests[b.rows[r]].tokens;
              std::copy(t.begin(), t.end(), sample.begin());
            }
            place_sample(x.shape, r, sample, in.data<int32_t>(), tg.data<int32_t>());
          }
          if (rl.has_embedding) {
            x.tokens = ops_.empty({x.shape.N()}, DType::I32, MemCategory::Activations);
            ops_.copy(in, x.tokens);
          }
          if (rl.has_head) {
            x.targets = ops_.empty({x.shape.N()}, DType::I32, MemCategory::Activations);
            ops_.copy(tg, x.targets);
            x.losses = ops_.empty({x.shape.N()}, DType::F32, MemCategory::Workspace);
          }
        }
        pending[mb] = vp;
      }
      ChunkActs acts;  // nothing is kept: there is no backward
      Tensor out = model_.forward(chunk, x, input, acts);
      if (model_.layout(chunk).has_head && reads_losses) {
        Tensor losses = Tensor::empty(host, {x.shape.N()}, DType::F32, MemCategory::Workspace);
        ops_.copy(x.losses, losses);
        const float* l = losses.data<float>();
        const int64_t c = x.shape.slot_tokens();
        for (size_t r = 0; r < b.rows.size(); ++r) {
          const ScoreRequest& q = requests[b.rows[r]];
          const int64_t from = q.length() - q.scored, to = q.length();  // predictions [from, to)
          double s = 0;
          for (int slot = 0; slot < x.shape.slots(); ++slot) {
            const int64_t p0 = x.shape.slot_position(slot);
            const float* row = l + (slot * x.shape.B + static_cast<int64_t>(r)) * c;
            for (int64_t t = std::max(from, p0); t < std::min(to, p0 + c); ++t) s += row[t - p0];
          }
          sums[b.rows[r]] += s;
        }
      }
      if (--pending[mb] == 0) {
        rows_done += static_cast<int64_t>(b.rows.size());
        mbs[mb] = MicroBatch{};
      }
      return out;
    };
    cb.recv_buffer = [&](int mb, int, bool) {
      const MicroShape s = shape(mb);
      return ops_.empty({s.N() / (sp ? tp : 1), C}, ops_.compute_dtype(), MemCategory::Activations);
    };
    executor(m).run(cb);
    const auto now = std::chrono::steady_clock::now();
    if (!progress.empty() && par_.rank == 0 && now - last_line > std::chrono::seconds(10) && rows_done > 0) {
      last_line = now;
      const double frac = static_cast<double>(rows_done) / static_cast<double>(my_rows);
      const double s = std::chrono::duration<double>(now - t0).count();
      spdlog::info("{}: {}/{} examples ({:.0f}%) | {:.1f} examples/s | ETA {}", progress,
                   static_cast<int64_t>(frac * static_cast<double>(examples)), examples, 100 * frac,
                   frac * static_cast<double>(examples) / s, format_duration(s / frac - s));
    }
  }

  // Every rank learns every sum (each request's from its DP rank's head, CP ranks' parts added).
  return world_loglikelihoods(sums);
}

TaskResult TaskEvaluator::evaluate(const Task& task) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<double> lls = loglikelihoods(task.requests, task.label(), task.size());
  TaskResult r = task_result(task, lls);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

std::vector<Task> load_tasks(const Config& cfg, const std::vector<EvalTaskConfig>& cfgs,
                             const std::function<std::string(size_t)>& where) {
  std::vector<Task> tasks;
  if (cfgs.empty()) return tasks;
  TRIPOD_INPUT_CHECK(!cfg.data.tokenizer.empty(), "{}: downstream tasks need data.tokenizer, the tokenizer the model "
                     "was trained with, to encode their text", where(0));
  const Tokenizer tok(cfg.data.tokenizer, cfg.data.eod_token, cfg.data.tokenizer_pattern);
  WordCache cache;
  const EncodeFn encode = [&](std::string_view text) {
    std::vector<int> ids;
    tok.encode(text, ids, &cache);
    return ids;
  };
  for (size_t i = 0; i < cfgs.size(); ++i)
    tasks.push_back(load_task(cfgs[i], encode, tok.eod_id(), cfg.model.seq_len, cfg.model.vocab_size, where(i)));
  return tasks;
}

}  // namespace tripod
