// The training loop.
#include "train/trainer.h"

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <thread>

#include "checkpoint/metadata.h"
#include "checkpoint/reader.h"
#include "checkpoint/reshard.h"
#include "core/version.h"
#include "data/sampler.h"
#include "data/tokenizer.h"
#include "parallel/comm/mpi_comm.h"
#include "parallel/pipeline/schedules.h"
#include "parallel/tensor_parallel/mappings.h"
#include "train/evaluator.h"
#include "train/task_evaluator.h"
#include "train/schedule_profile.h"
#include "train/signals.h"

namespace fs = std::filesystem;

namespace tripod {

std::string new_run_id() {
  const auto ns = std::chrono::system_clock::now().time_since_epoch() / std::chrono::nanoseconds(1);
  return fmt::format("{:x}-{}", ns, ::getpid());
}

namespace {

// A step's FP8 figures (on world rank 0) as metrics.jsonl's records, by linear.
std::map<std::string, Fp8LinearRecord> fp8_records(const Fp8Stats& st) {
  std::map<std::string, Fp8LinearRecord> out;
  for (size_t i = 0; i < st.names.size(); ++i) out[st.names[i]] = {st.scale[i], st.amax[i], st.saturated[i]};
  return out;
}

// The rank's chunks, and their FP8 linears' state allocated (an "auto" schedule profiles them).
std::unique_ptr<GptModel> build_model(const Config& cfg, Ops& ops, ParallelContext& par, ParamRegistry& reg,
                                      Fp8Registry* fp8) {
  const std::vector<ChunkLayout> chunks = chunks_of(cfg, par.coords.pp);
  auto m = std::make_unique<GptModel>(ops, par, cfg.model, chunks, cfg.recompute, reg, fp8);
  if (fp8) {
    // The memory plan and the report count the linears Fp8Config::linears names: exactly these.
    const int planned = fp8_linear_count(cfg.model, fp8->config(), chunks);
    TRIPOD_CHECK(fp8->size() == planned, "rank {} registered {} FP8 linears, its plan {}", par.rank, fp8->size(),
                 planned);
    fp8->allocate();
  }
  return m;
}

}  // namespace

Trainer::Trainer(const Config& cfg, Ops& ops, ParallelContext& par, const SampleSource* train_data,
                 const SampleSource* eval_data, const DebugOptions& debug)
    : cfg_(cfg), ops_(ops), par_(par), data_(train_data), eval_data_(eval_data), faults_(debug.inject_nan),
      fp8_(cfg.train.fp8() ? std::make_unique<Fp8Registry>(ops, par, cfg.train.fp8_config(), cfg.model.n_layers)
                           : nullptr),
      // The rank's chunks depend on the config alone (the schedule's placement is parallel.placement).
      model_(build_model(cfg, ops, par, reg_, fp8_.get())),
      // The schedule is resolved (and validated) before the layout: "auto" profiles this model.
      layout_(make_rank_layout(cfg, par.rank, training_schedule(cfg, ops, par, *model_, reg_, train_data, auto_chosen_))) {
  const TrainConfig& tc = cfg_.train;
  TRIPOD_CHECK(reg_.flat_size() == layout_.flat_elements, "rank {} registered {} parameter elements, its layout {}",
               par.rank, reg_.flat_size(), layout_.flat_elements);
  if (!reg_.allocated()) {  // (an "auto" profile has allocated and initialised them)
    reg_.allocate(ops);
    reg_.initialize(ops, tc.seed);
  }
  // The tied table's copies on the first and last pipeline rank sum their gradients over the
  // embedding group; with both ends here it is one parameter. Either way it is reduced after the
  // step's last backward (grad_sync.h).
  const GradSync& sync = layout_.grad_sync;
  if (sync.tied == GradSync::Tied::PipelineEnds) embedding_ = par.embedding.get();
  TRIPOD_CHECK(!(layout_.has_embedding || layout_.has_head) || data_,
               "rank {} holds the embedding or head but has no data", par.rank);
  // Packed documents: every rank reads its samples' boundaries (and counts the batch's tokens).
  if (cfg_.data.documents()) {
    TRIPOD_INPUT_CHECK(cfg_.data.eod_token_id >= 0, "data.eod_token: packed documents (data.reset_position_ids, "
                       "data.reset_attention_mask, data.eod_mask_loss) need the end-of-document token's id");
    TRIPOD_CHECK(data_, "rank {} has no data, but packed documents need every rank's samples", par.rank);
  }
  batch_docs_ = {.counted = static_cast<int64_t>(tc.global_batch_size) * cfg_.model.seq_len,
                 .attended = static_cast<double>(tc.global_batch_size) * cfg_.model.seq_len * cfg_.model.seq_len};

  evaluator_ = std::make_unique<Evaluator>(cfg_, make_eval_layout(layout_), ops, par, *model_);

  // A reducer per group, over its axis's communicator; the optimizer updates what every group
  // leaves this rank (in flat order).
  std::vector<FlatSpan> owned;
  for (const ReduceGroup& g : sync.groups) {
    TRIPOD_CHECK(g.axis == Axis::DPCP || g.axis == Axis::EDP, "a reduce group over axis {}", static_cast<int>(g.axis));
    Communicator* comm = g.axis == Axis::EDP ? par.edp : par.dpcp;
    reducers_.push_back(std::make_unique<GradReducer>(ops, comm, reg_.flat_grads(), reg_.flat_values(), g));
    owned.insert(owned.end(), g.owned.begin(), g.owned.end());
  }
  std::sort(owned.begin(), owned.end(), [](const FlatSpan& a, const FlatSpan& b) { return a.begin < b.begin; });
  optimizer_ = std::make_unique<AdamW>(
      ops, reg_, std::move(owned),
      AdamWConfig{.beta1 = tc.beta1, .beta2 = tc.beta2, .eps = tc.eps, .weight_decay = tc.weight_decay}, tc.seed);
  lr_ = lr_schedule_of(tc);

  TRIPOD_INPUT_CHECK(debug.slow_rank.rank < par.grid.world_size(), "environment variable TRIPOD_SLOW_RANK names rank "
                     "{}, but the world has {} ranks (0..{})", debug.slow_rank.rank, par.grid.world_size(),
                     par.grid.world_size() - 1);
  if (debug.slow_rank.rank == par.rank) slow_factor_ = debug.slow_rank.factor;
  step_sleep_ms_ = debug.step_sleep_ms;
  if (tc.straggler_factor > 0 && par.grid.world_size() > 1) {
    // Equals do the same work: the ranks of one pipeline rank (its chunks), across dp, cp and tp.
    std::vector<int> stage(par.grid.world_size());
    for (int r = 0; r < par.grid.world_size(); ++r) stage[r] = par.grid.coords(r).pp;
    stragglers_ = std::make_unique<StragglerMonitor>(tc.straggler_factor, std::move(stage));
  }

  if (!cfg_.checkpoint.load.empty()) load_checkpoint_state();
  if (tc.profile_steps > 0) {
    // This run's first step pays for first touches (allocations, library plans): the ones after it.
    const int64_t last = tc.exit_interval > 0 ? std::min(tc.exit_interval, tc.steps) : tc.steps;
    profile_first_ = step_ + (last > step_ + 1 ? 2 : 1);
    profile_last_ = std::min(last, profile_first_ + tc.profile_steps - 1);
  }
  if (tc.trace && !tc.output_dir.empty()) {
    trace_ = std::make_unique<TraceRecorder>(tc.output_dir, par.rank, par.grid.world_size(), par.coords,
                                             layout_.schedule);
    trace_->start(par.world.get());
  }
  executor_ = std::make_unique<PipelineExecutor>(layout_.schedule, par.pp.get(), par.coords.pp, trace_.get(),
                                                 par.flight.get());
  if (!cfg_.checkpoint.dir.empty()) {
    check_checkpoint_dir();
    saver_ = std::make_unique<CheckpointSaver>(cfg_.checkpoint.dir, cfg_.checkpoint.keep, cfg_.checkpoint.async,
                                               *par.world, debug.checkpoint_sleep_ms);
  }

  // The peak FLOP/s of the whole world, for MFU (measured concurrently on CPU).
  CpuAllocator host;
  Tensor hp = Tensor::empty(host, {1}, DType::F32, MemCategory::Workspace);
  hp.data<float>()[0] = static_cast<float>(ops.peak_flops() / 1e9);
  par.world->all_reduce(hp);
  peak_flops_ = static_cast<double>(hp.data<float>()[0]) * 1e9;

  if (par.rank == 0 && !tc.output_dir.empty()) {  // (library users may run without a run directory)
    std::filesystem::create_directories(tc.output_dir);
    std::ofstream(tc.output_dir + "/config.toml") << config_to_toml(cfg_);
    std::ofstream(tc.output_dir + "/schedule.csv") << schedule_csv(layout_.schedule);
    metrics_ = std::make_unique<MetricsLog>(tc.output_dir, tc.tensorboard_dir);
  }
  const ParallelConfig& pc = cfg_.parallel;
  int64_t n_params = cfg_.model.num_params(pc.tp);
  const ModelConfig& mc = cfg_.model;
  spdlog::info("model: {} ({}, {}, {}), {} layers, d_model {}, {} heads ({} key/value), seq {}, vocab {} (padded {}): "
               "{:.2f}M parameters{}",
               enum_name(mc.arch), enum_name(mc.norm), enum_name(mc.position), enum_name(mc.mlp), mc.n_layers, mc.d_model, mc.n_heads, mc.kv_heads(), mc.seq_len,
               mc.vocab_size, mc.padded_vocab(pc.tp), n_params / 1e6,
               mc.moe.enabled()
                   ? fmt::format(" ({:.2f}M active: {} experts, top {}, {} shared, layers {}+)",
                                 mc.num_params(pc.tp, /*active=*/true) / 1e6, mc.moe.experts, mc.moe.top_k,
                                 mc.moe.shared_experts, mc.moe.first_dense)
                   : std::string());
  if (tc.fp8())
    spdlog::info("precision fp8 (e4m3 forward, e5m2 gradients): recipe {}{}, margin {}; {}", enum_name(tc.fp8_recipe),
                 tc.fp8_recipe == Fp8Recipe::Delayed ? fmt::format(" (amax history {})", tc.fp8_amax_history) : "",
                 tc.fp8_margin, fp8_summary(mc, tc.fp8_config()));
  spdlog::info("grid {} on {} ranks; {} micro-batches of {} per rank per step; schedule {}{} (vp {}, placement {}); "
               "device {}", par.grid.str(), par.grid.world_size(), layout_.microbatches, layout_.micro_batch_size,
               enum_name(layout_.schedule.kind), auto_chosen_.empty() ? "" : " (" + auto_chosen_ + ")", pc.vp,
               enum_name(layout_.schedule.placement), enum_name(tc.device));
  // Last, so that a constructor that throws leaves no pointer to its recorder behind.
  if (trace_) par.trace = trace_.get();  // the cp attention's exchanges (reset by ~Trainer)
}

Trainer::~Trainer() {
  if (par_.trace == trace_.get()) par_.trace = nullptr;
}

void Trainer::load_microbatch(int64_t step, int micro, MicroBatch& mb) {
  const TrainConfig& tc = cfg_.train;
  // d(step loss)/d(token loss): the loss is the mean over the global batch's counted tokens.
  mb.grad_scale = cfg_.data.eod_mask_loss
                      ? 1.0f / static_cast<float>(std::max<int64_t>(1, batch_docs_.counted))
                      : 1.0f / static_cast<float>(static_cast<int64_t>(tc.global_batch_size) * cfg_.model.seq_len);
  tripod::load_microbatch(data_, cfg_, layout_, ops_, step * tc.global_batch_size, micro, mb);
}

void Trainer::on_grads_ready(const std::vector<Param*>& params) {
  // Under sequence parallelism the LayerNorm gradients are partial per TP rank, and per-head
  // norms' always are: sum them first.
  if (par_.grid.tp() > 1) {
    for (Param* p : params)
      if ((par_.sequence_parallel && p->spec.sp_partial_grad) || p->spec.tp_partial_grad) par_.tp->all_reduce(p->grad);
  }
  const GradSync& sync = layout_.grad_sync;
  const FlatSpan& tied = sync.tied_table;
  for (Param* p : params) {
    if (p->offset == tied.begin && tied.size() > 0) continue;  // reduced in finish_gradients
    reducers_[sync.group_of(p->spec.expert >= 0)]->mark_ready(p->offset, p->offset + p->numel());
  }
}

void Trainer::run_schedule(Tensor& losses) {
  const int M = layout_.microbatches, vp = model_->num_chunks();
  const int64_t N = layout_.micro_tokens, Ns = layout_.local_tokens;
  // Per micro-batch: its data (loaded at its first forward here, dropped after its last
  // weight-gradient action here: a split backward's W still reads the tokens) and how many chunks
  // still owe one; per (micro-batch, chunk): activations, and between an I and its W what W needs.
  std::vector<MicroBatch> mbs(M);
  std::vector<int> pending(M, 0);
  std::vector<std::vector<ChunkActs>> acts(M, std::vector<ChunkActs>(vp));
  std::vector<std::vector<ChunkPending>> weight_work(M, std::vector<ChunkPending>(vp));
  GradReadyFn ready = [this](const std::vector<Param*>& ps) { on_grads_ready(ps); };
  // The step's compute time, on the device's compute clock (straggler detection).
  auto timed = [this](auto&& work) {
    ops_.compute_begin();
    Tensor out = work();
    ops_.compute_end();
    return out;
  };
  // Each action's host wall time, data loading included, and its MPI waits (a profiled step's
  // breakdown).
  struct ActionClock {
    Trainer& t;
    std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
    double waited0 = mpi_wait_seconds();
    ~ActionClock() {
      t.action_wall_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      t.action_mpi_wait_s_ += mpi_wait_seconds() - waited0;
    }
  };

  PipelineCallbacks cb;
  cb.forward = [&](int mb, int chunk, const Tensor& input) {
    ActionClock clock{*this};
    if (pending[mb] == 0) {
      load_microbatch(step_, mb, mbs[mb]);
      if (losses.defined()) mbs[mb].losses = losses.slice(mb, mb + 1).view({N});
      pending[mb] = vp;
    }
    return timed([&] { return model_->forward(chunk, mbs[mb], input, acts[mb][chunk]); });
  };
  // The last B or W of a chunk makes its gradients final: the model then reports each layer's as
  // it finishes, which starts the DP bucket reduction (on_grads_ready).
  cb.backward = [&](int mb, int chunk, const Tensor& grad_output) {
    ActionClock clock{*this};
    const bool last = executor_->is_last_backward(B(mb, chunk));
    Tensor dx = timed(
        [&] { return model_->backward(chunk, mbs[mb], grad_output, acts[mb][chunk], last ? ready : GradReadyFn{}); });
    if (--pending[mb] == 0) mbs[mb] = MicroBatch{};
    return dx;
  };
  cb.backward_input = [&](int mb, int chunk, const Tensor& grad_output) {
    ActionClock clock{*this};
    return timed(
        [&] { return model_->backward_input(chunk, mbs[mb], grad_output, acts[mb][chunk], weight_work[mb][chunk]); });
  };
  cb.backward_weight = [&](int mb, int chunk) {
    ActionClock clock{*this};
    const bool last = executor_->is_last_backward(W(mb, chunk));
    timed([&] {
      model_->backward_weight(chunk, weight_work[mb][chunk], last ? ready : GradReadyFn{});
      return Tensor{};
    });
    if (--pending[mb] == 0) mbs[mb] = MicroBatch{};
  };
  cb.recv_buffer = [&](int mb, int chunk, bool grad) {
    // A received activation is the chunk's input (kept for its backward); a gradient is transient.
    return ops_.empty({Ns, cfg_.model.d_model}, ops_.compute_dtype(),
                      grad ? MemCategory::Workspace : MemCategory::Activations);
  };
  executor_->run(cb);
}

void Trainer::finish_gradients() {
  // The tied table's two copies (first and last stage) sum their gradients, then DP-reduce.
  FlightPhase phase(par_.flight.get(), "dp-reduce");
  const FlatSpan& tied = layout_.grad_sync.tied_table;
  if (tied.size() > 0) {
    if (embedding_) {
      FlightPhase sync(par_.flight.get(), "embedding-sync");
      Tensor grad = reg_.flat_grads().flat(tied.begin, tied.end);
      embedding_->all_reduce(grad);
    }
    reducers_[0]->mark_ready(tied.begin, tied.end);
  }
  for (auto& r : reducers_) r->finish();
}

StepRecord Trainer::step() {
  const TrainConfig& tc = cfg_.train;
  using clock = std::chrono::steady_clock;
  auto t0 = clock::now();
  // A profiled step (train.profile_steps) times the backend's ops by family and its phases by the
  // wall clock, the device synchronised at each boundary: [t0, t_sched) the optimizer's zeroing,
  // [t_sched, t_sync) the pipeline's actions and the waits between them, [t_sync, t_reduced) the
  // gradient reduction past the backward, then the grad norm, the world all-reduce (waiting for the
  // slowest rank: idle) and the optimizer.
  const bool profiling = step_ + 1 >= profile_first_ && step_ + 1 <= profile_last_;
  auto mark = [&] {
    if (profiling) ops_.synchronize();
    return clock::now();
  };
  if (profiling) ops_.set_timing(true);
  ops_.allocator().stats().reset_peaks();
  reg_.zero_grads(ops_);
  for (auto& r : reducers_) r->begin_step();
  if (fp8_) fp8_->begin_step();
  for (MoeLayer* moe : model_->moe_layers()) moe->reset_stats();

  if (trace_) trace_->set_step(step_ + 1);
  if (par_.flight) par_.flight->set_step(step_ + 1);
  if (cfg_.data.documents())
    batch_docs_ = summarize_documents(*data_, cfg_, step_ * tc.global_batch_size, tc.global_batch_size);
  // Losses of this rank's micro-batches, one row each (the last stage fills them).
  Tensor losses;
  if (layout_.has_head) {
    losses = ops_.empty({layout_.microbatches, layout_.micro_tokens}, DType::F32, MemCategory::Workspace);
    ops_.fill(losses, 0.f);
  }
  const auto t_sched = mark();
  if (profiling) ops_.take_times();  // the zeroing's ops count with the optimizer
  action_wall_s_ = action_mpi_wait_s_ = 0;
  run_schedule(losses);
  const auto t_sync = mark();
  const OpTimes action_ops = profiling ? ops_.take_times() : OpTimes{};
  {
    auto span = trace_ ? trace_->span("grad sync", TraceCategory::Reduce) : TraceRecorder::Span{};
    finish_gradients();
  }
  const auto t_reduced = mark();

  // One world all-reduce gives the grad norm and the loss: replicated copies count once (TP rank
  // 0, rank 0 of the parameter's reduce group unless the optimizer is sharded there), the loss from
  // the last stage's TP rank 0.
  const GradSync& sync = layout_.grad_sync;
  double sq = optimizer_->grad_sq_sum([this, &sync](const ParamSpec& s) {
    const ReduceGroup& g = sync.groups[sync.group_of(s.expert >= 0)];
    return (g.sharded || g.rank == 0) && s.counts_in_norm(par_.coords.tp);
  });
  double loss_sum = (layout_.has_head && par_.coords.tp == 0) ? ops_.sum(losses) : 0.0;
  if (par_.rank == 0) {  // fault injection (tests): the world's sums become non-finite
    for (const FaultInjection& f : faults_)
      if (f.step == step_ + 1) (f.in_loss ? loss_sum : sq) = std::numeric_limits<double>::quiet_NaN();
  }
  CpuAllocator host;
  // A mixture of experts' step statistics join the same reduction: one row per MoE layer of the
  // model, filled by the ranks holding it (TP rank 0 of each, its tokens), summed over the world.
  const int64_t moe_width = cfg_.model.moe.experts + 3;
  std::vector<int> moe_rows(cfg_.model.n_layers, -1);  // layer -> row
  int n_moe = 0;
  for (int l = 0; l < cfg_.model.n_layers; ++l)
    if (cfg_.model.moe.sparse(l)) moe_rows[l] = n_moe++;
  Tensor red = Tensor::empty(host, {3 + n_moe * moe_width}, DType::F64, MemCategory::Workspace);
  // Summed in f64, so that every grid clips and reports what the single-rank run does. The third
  // sum counts the ranks that received a stop signal, so that every rank agrees to stop.
  double* sums = red.data<double>();
  std::fill(sums, sums + red.numel(), 0.0);
  sums[0] = sq;
  sums[1] = loss_sum;
  sums[2] = stop_signal() != 0 ? 1.0 : 0.0;
  if (par_.coords.tp == 0)
    for (MoeLayer* moe : model_->moe_layers()) {
      const MoeStepStats& st = moe->stats();
      double* row = sums + 3 + moe_rows[moe->layer()] * moe_width;
      std::copy(st.routed.begin(), st.routed.end(), row);
      row[moe_width - 3] = st.dropped;
      row[moe_width - 2] = st.aux;
      row[moe_width - 1] = st.z;
    }
  const auto t_norm = clock::now();
  if (par_.grid.world_size() > 1) {
    FlightPhase phase(par_.flight.get(), "grad-norm");
    par_.world->all_reduce(red);
  }
  const auto t_normed = clock::now();
  stop_requested_ = sums[2] > 0;
  double grad_norm = std::sqrt(sums[0]);
  double loss = cfg_.data.eod_mask_loss
                    ? sums[1] / static_cast<double>(std::max<int64_t>(1, batch_docs_.counted))
                    : sums[1] / (static_cast<double>(tc.global_batch_size) * cfg_.model.seq_len);

  StepRecord m;
  m.step = step_ + 1;
  m.lr = lr_.at(step_);
  m.loss = loss;
  m.grad_norm = grad_norm;
  // The losses are means over the step's micro-batches (each its micro-batch's).
  const double micro_batches = static_cast<double>(tc.global_batch_size) / tc.micro_batch_size;
  for (int l = 0; l < cfg_.model.n_layers; ++l) {
    if (moe_rows[l] < 0) continue;
    const double* row = sums + 3 + moe_rows[l] * moe_width;
    m.moe.push_back({.layer = l, .tokens_per_expert = std::vector<double>(row, row + moe_width - 3),
                     .dropped = row[moe_width - 3], .load_balancing_loss = row[moe_width - 2] / micro_batches,
                     .z_loss = row[moe_width - 1] / micro_batches});
  }
  const bool bad = !std::isfinite(loss) || !std::isfinite(grad_norm);
  // The delayed recipe's amaxes of this step (reduced over every rank) join the histories, and
  // the next step's scales follow (model/fp8.h); a skipped step leaves them as they were.
  if (fp8_) fp8_->end_step(bad);
  if (bad) {
    m.skipped = true;
    ++skipped_total_;
    ++bad_in_a_row_;
  } else {
    bad_in_a_row_ = 0;
    float clip = 1.f;
    if (tc.grad_clip > 0 && grad_norm > tc.grad_clip) clip = static_cast<float>(tc.grad_clip / (grad_norm + 1e-6));
    auto span = trace_ ? trace_->span("optimizer", TraceCategory::Optimizer) : TraceRecorder::Span{};
    FlightPhase phase(par_.flight.get(), "optimizer");
    // Adam's bias correction counts the updates applied; the LR follows the iteration.
    optimizer_->step(m.lr, optimizer_->steps_taken() + 1, clip);
    for (auto& r : reducers_) r->all_gather_values();
    // Aux-loss-free balancing: every copy of a layer's selection bias moves by the same counts.
    for (MoeLayer* moe : model_->moe_layers()) moe->update_bias(m.moe[moe_rows[moe->layer()]].tokens_per_expert);
    if (fp8_) fp8_->weights_changed();  // the weights' FP8 casts are stale
  }
  ops_.synchronize();
  const auto t_updated = clock::now();
  double compute_s = ops_.take_compute_seconds();
  const double actions_s = ops_.device() == Device::CUDA ? compute_s : action_wall_s_;  // GPU time on CUDA
  if (profiling) {
    ops_.set_timing(false);
    ops_.take_times();
  }
  if (slow_factor_ > 1) {  // TRIPOD_SLOW_RANK: the rank idles (slow_factor - 1) x its compute time
    std::this_thread::sleep_for(std::chrono::duration<double>((slow_factor_ - 1) * compute_s));
    compute_s *= slow_factor_;
  }
  if (trace_) trace_->flush();
  m.skipped_total = skipped_total_;
  ++step_;
  m.consumed_samples = step_ * tc.global_batch_size;
  m.step_time_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  m.tokens_per_s = static_cast<double>(tc.global_batch_size) * cfg_.model.seq_len / m.step_time_s;
  // Model FLOPs: attention counts the keys each token's document gives it under
  // data.reset_attention_mask (the pairs the step needs), seq_len otherwise.
  const double attended = batch_docs_.attended / (static_cast<double>(tc.global_batch_size) * cfg_.model.seq_len);
  const double flops_per_token = cfg_.data.reset_attention_mask
                                     ? cfg_.model.flops_per_token(par_.grid.tp(), attended)
                                     : cfg_.model.flops_per_token(par_.grid.tp());
  m.mfu = flops_per_token * m.tokens_per_s / peak_flops_;
  m.tflops = flops_per_token * m.tokens_per_s / par_.grid.world_size() / 1e12;
  m.batch_size = tc.global_batch_size;
  if (stragglers_) stragglers_->add_step(m.step_time_s, compute_s);
  const MemoryStats& ms = ops_.allocator().stats();
  auto& peaks = m.memory.emplace_back();
  for (int c = 0; c < kNumMemCategories; ++c)
    peaks[std::string(mem_category_name(static_cast<MemCategory>(c)))] = ms.peak(static_cast<MemCategory>(c));
  peaks["total"] = ms.total_peak();
  if (profiling) {
    auto secs = [](clock::time_point a, clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
    StepBreakdown b;
    b.gemm = action_ops.seconds_of(OpFamily::Gemm);
    b.attention = action_ops.seconds_of(OpFamily::Attention);
    b.elementwise = action_ops.total_seconds() - b.gemm - b.attention;
    // Inside the actions: on a GPU, their device time outside the timed ops; on the CPU, their MPI
    // waits (the host time between ops is the step's other).
    const double in_actions = ops_.device() == Device::CUDA ? std::max(0.0, actions_s - action_ops.total_seconds())
                                                             : action_mpi_wait_s_;
    b.communication = in_actions + secs(t_sync, t_reduced);
    b.pipeline_idle = std::max(0.0, secs(t_sched, t_sync) - actions_s) + secs(t_norm, t_normed);
    b.optimizer = secs(t0, t_sched) + secs(t_reduced, t_norm) + secs(t_normed, t_updated);
    b.step = m.step_time_s;
    b.other = b.step - b.parts_sum();  // trace and log writing (and what the clamps above took)
    profiled_.push_back(b);
    std::string ops;
    for (int f = 0; f < kNumOpFamilies; ++f)
      if (action_ops.calls[f] > 0)
        ops += fmt::format(" {} {:.2f} ms ({} ops)", op_family_name(static_cast<OpFamily>(f)), 1e3 * action_ops.seconds[f],
                           action_ops.calls[f]);
    spdlog::debug("profiled step {}: {:.2f} ms; inside the actions:{}", m.step, 1e3 * b.step, ops);
    if (step_ == profile_last_) finish_profile();
  }
  return m;
}

void Trainer::finish_profile() {
  // This rank's median step (by its time), whole: its parts still add up to it.
  std::vector<StepBreakdown> steps = profiled_;
  std::sort(steps.begin(), steps.end(), [](const StepBreakdown& a, const StepBreakdown& b) { return a.step < b.step; });
  const StepBreakdown mine = steps[(steps.size() - 1) / 2];
  // Every rank's, by one all-reduce of a table with a row per rank.
  constexpr int kCols = StepBreakdown::kParts + 1;
  const int world = par_.grid.world_size();
  CpuAllocator host;
  Tensor table = Tensor::empty(host, {int64_t{world} * kCols}, DType::F64, MemCategory::Workspace);
  double* t = table.data<double>();
  std::fill(t, t + int64_t{world} * kCols, 0.0);
  for (int i = 0; i < StepBreakdown::kParts; ++i) t[par_.rank * kCols + i] = mine.part(i);
  t[par_.rank * kCols + StepBreakdown::kParts] = mine.step;
  if (world > 1) par_.world->all_reduce(table);
  std::vector<int64_t> numbers;
  for (int64_t s = profile_first_; s <= profile_last_; ++s) numbers.push_back(s);
  if (par_.rank != 0 || !profile_hook_) return;
  std::vector<StepBreakdown> ranks(world);
  for (int r = 0; r < world; ++r) {
    for (int i = 0; i < StepBreakdown::kParts; ++i) ranks[r].part(i) = t[r * kCols + i];
    ranks[r].step = t[r * kCols + StepBreakdown::kParts];
  }
  profile_hook_(numbers, ranks);
}

void Trainer::run() {
  const TrainConfig& tc = cfg_.train;
  const int64_t last = tc.exit_interval > 0 ? std::min(tc.exit_interval, tc.steps) : tc.steps;
  install_stop_signal_handlers();
  while (step_ < last) {
    // TRIPOD_TEST_STEP_SLEEP_MS: a tiny run's steps take a fixed minimum time (test hook).
    if (step_sleep_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(step_sleep_ms_));
    StepRecord m = step();
    if (stragglers_ && (m.step % tc.log_interval == 0 || m.step == last))  // collective, as is the condition
      m.stragglers = stragglers_->gather(*par_.world, m.step);
    if (fp8_ && (m.step % tc.log_interval == 0 || m.step == last || m.skipped))  // collective (skipped is agreed)
      m.fp8 = fp8_records(fp8_->gather_stats(m.step, *par_.world));
    if (metrics_ && (m.step % tc.log_interval == 0 || m.step == last || m.skipped)) metrics_->log_step(m, tc.steps);
    if (tc.eval_interval > 0 && m.step % tc.eval_interval == 0) {
      evaluate();
      evaluate_tasks();
    }
    if (bad_in_a_row_ >= tc.max_bad_steps) {
      // Every rank stops here together: a save still in flight is committed first, so that the
      // checkpoint named below exists. A diverged run is a failure (exit 1), not bad input.
      finish_checkpoints();
      throw Error(__FILE__, __LINE__,
                  fmt::format("{} steps in a row had a non-finite loss or grad norm (last: step {}, loss {}, grad norm "
                              "{}); stopping (train.max_bad_steps = {}); {}",
                              bad_in_a_row_, m.step, m.loss, m.grad_norm, tc.max_bad_steps,
                              last_checkpoint_.empty() ? std::string("no checkpoint was saved or loaded in this run")
                                                       : "the last good checkpoint is " + last_checkpoint_),
                  /*shared=*/true);
    }
    const bool stop = stop_requested_;
    const int64_t interval = cfg_.checkpoint.interval;
    if (saver_ && (stop || step_ == last || (interval > 0 && step_ % interval == 0))) save_checkpoint();
    if (stop) {
      stopped_by_signal_ = true;
      spdlog::info("stop signal received: {} after step {}; exiting", saver_ ? "checkpoint saved" : "no checkpoint.dir, "
                   "nothing saved", step_);
      break;
    }
  }
  finish_checkpoints();
}

std::vector<OptimizerShardRef> Trainer::optimizer_state() {
  std::vector<OptimizerShardRef> out;
  for (AdamW::Shard& sh : optimizer_->shards()) out.push_back({sh.span, sh.master, sh.m, sh.v});
  return out;
}

namespace {
// The names of every buffer of the model (all stages'): their values are saved, never optimizer
// state (ckpt verify reads the list).
nlohmann::json buffer_names(const ModelConfig& model) {
  nlohmann::json out = nlohmann::json::array();
  if (!model.moe.selection_bias()) return out;  // the only buffers
  for (const ParamSpec& p : model_param_specs(model))
    if (p.buffer) out.push_back(p.name);
  return out;
}

// The packed-document keys a checkpoint was trained with.
nlohmann::json documents_record(const DataConfig& d) {
  return {{"reset_position_ids", d.reset_position_ids}, {"reset_attention_mask", d.reset_attention_mask},
          {"eod_mask_loss", d.eod_mask_loss}, {"eod_token", d.eod_token_id}};
}
}  // namespace

nlohmann::json Trainer::checkpoint_metadata() const {
  const TrainConfig& tc = cfg_.train;
  const ParallelConfig& pc = cfg_.parallel;
  nlohmann::json ranks = nlohmann::json::array();
  for (int r = 0; r < par_.grid.world_size(); ++r) {
    Coords c = par_.grid.coords(r);
    // Initialisation draws from a counter-based stream keyed by (seed, tensor name, element) and
    // data order is a pure function of (seed, step); there is no dropout: no rank has RNG state
    // beyond the seed.
    ranks.push_back({{"rank", r}, {"dp", c.dp}, {"pp", c.pp}, {"cp", c.cp}, {"tp", c.tp}, {"seed", tc.seed},
                     {"state", "stateless"}});
  }
  nlohmann::json meta = {
      {"iteration", step_},
      {"consumed_samples", step_ * tc.global_batch_size},
      {"global_batch_size", tc.global_batch_size},
      {"config_toml", config_to_toml(cfg_)},
      {"tokenizer", tokenizer_record(cfg_.data.tokenizer, cfg_.data.tokenizer_pattern)},
      {"run_id", run_id_},
      {"model", model_to_json(cfg_.model)},
      {"grid", {{"dp", pc.dp}, {"pp", pc.pp}, {"tp", pc.tp}, {"vp", pc.vp}, {"cp", pc.cp}, {"ep", pc.ep}, {"world_size", par_.grid.world_size()},
                {"distributed_optimizer", pc.distributed_optimizer}, {"schedule", enum_name(layout_.schedule.kind)},
                {"placement", enum_name(layout_.schedule.placement)}}},
      // The schedule itself when it was chosen at start-up, so that a resume runs the same one.
      {"schedule_csv", layout_.schedule.kind == ScheduleKind::Auto ? schedule_csv(layout_.schedule) : std::string()},
      {"has_optimizer", true},
      {"precision", tc.fp8() ? nlohmann::json{{"precision", "fp8"}, {"fp8_recipe", enum_name(tc.fp8_recipe)},
                                              {"fp8_amax_history", tc.fp8_amax_history},
                                              {"fp8_margin", tc.fp8_margin}, {"fp8_bf16_layers", tc.fp8_bf16_layers}}
                             : nlohmann::json{{"precision", "bf16"}}},
      {"documents", documents_record(cfg_.data)},
      {"lr_schedule", {{"lr", lr_.lr}, {"min_lr", lr_.min_lr}, {"warmup_steps", lr_.warmup_steps},
                       {"total_steps", lr_.total_steps}, {"decay", enum_name(lr_.decay)}, {"next_step", step_},
                       {"next_lr", lr_.at(step_)}}},
      {"trainer", {{"skipped_total", skipped_total_}, {"bad_in_a_row", bad_in_a_row_},
                   {"adam_steps", optimizer_->steps_taken()}}},
      {"rng", {{"generator", "philox4x32-10, counter-based (stateless)"},
               {"init", "element i of tensor NAME draws from (train.seed, hash(NAME), i)"},
               {"data_order", "a pure function of (train.seed, step)"},
               {"dropout", "none"},
               {"ranks", ranks}}},
  };
  if (nlohmann::json buffers = buffer_names(cfg_.model); !buffers.empty()) meta["buffers"] = std::move(buffers);
  if (!task_figures_.is_null()) meta["eval_tasks"] = task_figures_;  // the latest downstream figures
  return meta;
}

void Trainer::save_checkpoint() {
  TRIPOD_CHECK(saver_, "save_checkpoint without checkpoint.dir");
  auto span = trace_ ? trace_->span("checkpoint", TraceCategory::Other) : TraceRecorder::Span{};
  FlightPhase phase(par_.flight.get(), "checkpoint");
  auto t0 = std::chrono::steady_clock::now();
  saver_->finish();  // commits the previous asynchronous save, if any
  const Coords cc = checkpoint_coords(par_.grid, par_.coords);
  Snapshot snap = take_snapshot(reg_, ops_, optimizer_state(), cc, cfg_.parallel.distributed_optimizer, par_.grid.ep());
  // The delayed recipe's scales and histories: the same on every TP and DP x CP rank of a layer
  // (reduced every step), saved once per layer by its TP rank 0 of DP x CP rank 0.
  if (fp8_ && cfg_.train.fp8_recipe == Fp8Recipe::Delayed && !snap.file.empty() && cc.tp == 0 && cc.dp == 0)
    add_fp8_state(snap, fp8_->state());
  const int64_t bytes = snap.bytes();
  saver_->save(step_, std::move(snap), checkpoint_metadata());
  last_checkpoint_ = (std::filesystem::path(cfg_.checkpoint.dir) / iter_dir_name(step_)).string();
  spdlog::debug("checkpoint of step {}: {:.1f} MB from this rank, {:.3f} s blocking{}", step_, bytes / 1e6,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                cfg_.checkpoint.async ? " (written in the background)" : "");
}

void Trainer::finish_checkpoints() {
  if (saver_) saver_->finish();
}

void Trainer::check_checkpoint_dir() const {
  // A run writes into checkpoint.dir only when it holds no checkpoints, or those of the run it
  // continues (loaded from there), or checkpoint.overwrite says so: another run's checkpoints
  // would otherwise be overwritten, and `keep` would delete them.
  const CheckpointConfig& k = cfg_.checkpoint;
  const auto existing = committed_checkpoints(k.dir);
  if (existing.empty() || k.overwrite) return;
  std::error_code ec;
  if (!loaded_from_.empty() && fs::equivalent(fs::path(loaded_from_).parent_path(), k.dir, ec)) return;
  throw InputError(fmt::format(
      "checkpoint.dir = {} already holds {} checkpoint(s) of another run (newest {}); this run would overwrite "
      "them: resume that run with checkpoint.load = \"latest\", choose another checkpoint.dir, or set "
      "checkpoint.overwrite = true",
      k.dir, existing.size(), fs::path(existing.back().second).filename().string()));
}

void Trainer::load_checkpoint_state() {
  // Every check reads the same files on every rank: rank 0 reports (InputError's default scope).
  const std::string dir = resolve_checkpoint(cfg_.checkpoint.load, cfg_.checkpoint.dir);
  {
    CheckpointReader reader(dir);  // metadata.json validated: checksum, every field's type and range
    const nlohmann::json& meta = reader.metadata();
    if (meta.contains("model")) check_model_record(meta["model"], model_to_json(cfg_.model), dir);
    // Another choice of the packed-document keys continues training on other masks and positions:
    // allowed (a run may switch them on for long-context training), but said. A checkpoint without
    // the record was trained with them off.
    const nlohmann::json now = documents_record(cfg_.data);
    const nlohmann::json then = meta.contains("documents") && meta["documents"].is_object() ? meta["documents"]
                                                                                             : nlohmann::json::object();
    std::vector<std::string> changed;
    for (const char* key : {"reset_position_ids", "reset_attention_mask", "eod_mask_loss"}) {
      const bool was = then.contains(key) && then[key].is_boolean() && then[key].get<bool>();
      if (was != now[key].get<bool>())
        changed.push_back(fmt::format("data.{} = {} (the checkpoint: {})", key, now[key].get<bool>(), was));
    }
    if (!changed.empty() && par_.rank == 0)
      spdlog::warn("checkpoint {} was trained with other packed-document settings: {}; training continues with "
                   "this run's", dir, fmt::join(changed, ", "));
    if (meta.value("has_optimizer", false) && meta.contains("global_batch_size"))
      TRIPOD_INPUT_CHECK(meta["global_batch_size"].get<int64_t>() == cfg_.train.global_batch_size,
                         "checkpoint {} was trained with train.global_batch_size = {}, this run has {}: the data "
                         "position (step x batch) would not continue; resume with the same global batch",
                         dir, meta["global_batch_size"].get<int64_t>(), cfg_.train.global_batch_size);
  }
  auto t0 = std::chrono::steady_clock::now();
  LoadResult r = load_checkpoint(dir, reg_, ops_, optimizer_state(), *par_.world);
  step_ = r.metadata["iteration"].get<int64_t>();
  if (fp8_) {
    fp8_->weights_changed();
    if (cfg_.train.fp8_recipe == Fp8Recipe::Delayed && r.optimizer_loaded) {
      // Every rank reads its own layers' state (checked by its checksum); a checkpoint without it
      // (trained in bf16, or tensorwise) starts the histories afresh.
      const int restored = fp8_->load_state(read_fp8_state(dir));
      if (par_.rank == 0 && restored < fp8_->size())
        spdlog::info("checkpoint {} holds no delayed-scaling state for {} of rank 0's {} FP8 linears: their amax "
                     "histories start empty", dir, fp8_->size() - restored, fp8_->size());
    }
  }
  if (r.optimizer_loaded && r.metadata.contains("trainer")) {
    const nlohmann::json& t = r.metadata["trainer"];
    skipped_total_ = t.value("skipped_total", int64_t{0});
    bad_in_a_row_ = t.value("bad_in_a_row", int64_t{0});
    optimizer_->set_steps_taken(t.value("adam_steps", step_));
  }
  if (!r.optimizer_loaded) step_ = 0;  // parameters only (e.g. converted weights): a fresh run from them
  if (r.optimizer_loaded && r.metadata.value("run_id", "") != "") run_id_ = r.metadata["run_id"].get<std::string>();
  // The latest downstream figures go on into this run's checkpoints until its first evaluation.
  if (r.optimizer_loaded && r.metadata.contains("eval_tasks") && r.metadata["eval_tasks"].is_object())
    task_figures_ = r.metadata["eval_tasks"];
  last_checkpoint_ = loaded_from_ = dir;
  const nlohmann::json& g = r.metadata["grid"];
  const int saved_ep = g.value("ep", 1);
  spdlog::info("loaded checkpoint {} (saved on grid dp={}, pp={}, tp={}{}): continuing at step {}, {:.2f} s", dir,
               g["dp"].get<int>(), g["pp"].get<int>(), g["tp"].get<int>(),
               saved_ep > 1 ? fmt::format(", ep={}", saved_ep) : std::string(), step_ + 1,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

EvalResult Trainer::evaluate() {
  const TrainConfig& tc = cfg_.train;
  auto t0 = std::chrono::steady_clock::now();
  FlightPhase phase(par_.flight.get(), "eval");
  EvalResult r = evaluator_->evaluate(eval_data_, tc.eval_steps * tc.global_batch_size);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (metrics_)
    metrics_->log_eval({.step = step_, .consumed_samples = step_ * tc.global_batch_size, .split = "valid",
                        .loss = r.loss, .perplexity = r.perplexity, .tokens = r.tokens, .seconds = seconds});
  spdlog::info("eval  {:>6}/{} | val loss {:.4f} | val ppl {:.2f} | {} tokens in {:.2f} s", step_, tc.steps, r.loss,
               r.perplexity, r.tokens, seconds);
  return r;
}

void Trainer::set_tasks(std::vector<Task> tasks) {
  tasks_ = std::move(tasks);
  if (!tasks_.empty() && !task_evaluator_)
    task_evaluator_ = std::make_unique<TaskEvaluator>(cfg_, make_eval_layout(layout_), ops_, par_, *model_, reg_);
}

void Trainer::evaluate_tasks() {
  if (tasks_.empty()) return;
  FlightPhase phase(par_.flight.get(), "eval");
  const int64_t samples = step_ * cfg_.train.global_batch_size;
  task_figures_ = {{"step", step_}, {"tasks", nlohmann::json::object()}};
  for (const Task& task : tasks_) {
    const TaskResult r = task_evaluator_->evaluate(task);
    if (metrics_) metrics_->log_task(task_record(step_, samples, r));
    nlohmann::json figures = nlohmann::json::object();
    std::string line;
    for (const TaskMetric& m : r.metrics) {
      figures[m.name] = m.value;
      line += m.stderr_of_mean ? fmt::format(" | {} {:.4f} ± {:.4f}", m.name, m.value, *m.stderr_of_mean)
                               : fmt::format(" | {} {:.4f}", m.name, m.value);
    }
    task_figures_["tasks"][r.task] = figures;
    spdlog::info("eval  {:>6}/{} | {}{} | {} examples in {:.2f} s", step_, cfg_.train.steps, r.task, line, r.examples,
                 r.seconds);
  }
}

}  // namespace tripod
