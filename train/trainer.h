// The training loop: Trainer::step() reads as schedule -> reduce grads -> clip -> update -> log.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/writer.h"
#include "config/config.h"
#include "config/layout.h"
#include "core/debug_options.h"
#include "data/sample_source.h"
#include "model/fp8.h"
#include "model/gpt.h"
#include "parallel/context.h"
#include "parallel/data_parallel/grad_reducer.h"
#include "parallel/pipeline/executor.h"
#include "parallel/pipeline/trace.h"
#include "train/lr_schedule.h"
#include "train/metrics.h"
#include "train/microbatch.h"
#include "train/optimizer.h"
#include "train/straggler.h"

namespace tripod {

class Evaluator;
struct EvalResult;
class TaskEvaluator;
struct Task;

// A new run's identity for its checkpoints' "run_id": the time and process id (unique per host).
std::string new_run_id();

class Trainer {
 public:
  // `cfg` must have passed validate_layout() for par's world size; the trainer computes its rank's
  // layout once (layout()). `eval_data` (the validation
  // split) is needed when train.eval_interval > 0 on ranks holding the embedding or the head.
  // `debug`: the test hooks it honours (inject_nan, checkpoint_sleep_ms).
  Trainer(const Config& cfg, Ops& ops, ParallelContext& par, const SampleSource* train_data,
          const SampleSource* eval_data = nullptr, const DebugOptions& debug = {});
  ~Trainer();

  // Trains from the current step to train.steps (or train.exit_interval), evaluating every
  // train.eval_interval steps and saving checkpoints (checkpoint.dir) every checkpoint.interval
  // steps, at the last step, and when a stop signal (SIGTERM, SIGUSR1) arrives, after which it
  // returns early. Waits for an asynchronous save.
  void run();
  // The validation loss now: train.eval_steps global batches of the eval data, forward only;
  // logged to metrics.jsonl as an "eval" record (loss, perplexity, and val_loss, val_ppl).
  EvalResult evaluate();
  Evaluator& evaluator() { return *evaluator_; }
  // Downstream tasks ([eval] tasks, read at start-up) to score at every evaluation, after the
  // validation loss: metrics.jsonl records {"eval_task": true, ...}, TensorBoard's TASK/METRIC
  // scalars, and the checkpoints' "eval_tasks" (the latest figures).
  void set_tasks(std::vector<Task> tasks);
  void evaluate_tasks();
  // Collective: saves a checkpoint of the current step into checkpoint.dir (asynchronously with
  // checkpoint.async; finish_checkpoints() or the next save commits it).
  void save_checkpoint();
  void finish_checkpoints();
  // Views of the optimizer's state per owned span (what checkpoints save and load).
  std::vector<OptimizerShardRef> optimizer_state();
  // Whether run() returned because of a stop signal.
  bool stopped_by_signal() const { return stopped_by_signal_; }
  // One optimizer step over the global batch; metrics are valid on every rank.
  StepRecord step();

  int64_t completed_steps() const { return step_; }
  ParamRegistry& registry() { return reg_; }
  // The FP8 linears' state (train.precision = "fp8"), else null.
  Fp8Registry* fp8() { return fp8_.get(); }
  GptModel& model() { return *model_; }
  const Config& config() const { return cfg_; }
  const Schedule& schedule() const { return layout_.schedule; }
  const RankLayout& layout() const { return layout_; }
  // schedule = "auto": the candidate the start-up profile chose ("" for a fixed schedule).
  const std::string& auto_chosen() const { return auto_chosen_; }

  // train.profile_steps = N: the N steps after this run's first (fewer when the run ends sooner)
  // are timed by where their time goes (StepBreakdown: the backend's op families inside the
  // pipeline's actions, their communication, the waits between them, the DP reduction,
  // the optimizer), synchronising the device at the step's phase boundaries. After the last one
  // every rank's breakdown of its median profiled step is gathered (one world all-reduce) and
  // handed to `hook` on world rank 0, with the profiled steps.
  using ProfileHook = std::function<void(const std::vector<int64_t>& steps, const std::vector<StepBreakdown>& ranks)>;
  void on_profile(ProfileHook hook) { profile_hook_ = std::move(hook); }
  // The steps train.profile_steps times: [first, last] (empty when last < first).
  std::pair<int64_t, int64_t> profile_steps() const { return {profile_first_, profile_last_}; }

 private:
  // The tokens (first stage) and targets (last stage) of micro-batch `micro` of `step`.
  void load_microbatch(int64_t step, int micro, MicroBatch& mb);
  // Runs this rank's part of the pipeline schedule over the step's micro-batches; the last
  // stage writes the per-token losses into `losses` (one row per micro-batch).
  void run_schedule(Tensor& losses);
  void finish_gradients();
  // After the last profiled step: the median step of each rank, gathered; the hook on rank 0.
  void finish_profile();
  void on_grads_ready(const std::vector<Param*>& params);
  nlohmann::json checkpoint_metadata() const;
  void load_checkpoint_state();
  void check_checkpoint_dir() const;

  Config cfg_;
  Ops& ops_;
  ParallelContext& par_;
  const SampleSource* data_;
  const SampleSource* eval_data_;
  std::vector<FaultInjection> faults_;
  ParamRegistry reg_;
  std::unique_ptr<Fp8Registry> fp8_;  // train.precision = "fp8": before the model, whose linears join it
  std::unique_ptr<GptModel> model_;  // this rank's chunks, registered before the layout is made
  std::string auto_chosen_;          // schedule = "auto": the candidate chosen, for the log
  const RankLayout layout_;          // with the schedule resolved ("auto" from a start-up profile)
  // One reducer per reduce group of the layout (grad_sync.h): DP x CP, and with expert
  // parallelism the experts' over EDP; indexed as the groups.
  std::vector<std::unique_ptr<GradReducer>> reducers_;
  std::unique_ptr<AdamW> optimizer_;
  std::unique_ptr<PipelineExecutor> executor_;
  std::unique_ptr<TraceRecorder> trace_;
  std::unique_ptr<MetricsLog> metrics_;
  std::unique_ptr<Evaluator> evaluator_;
  std::vector<Task> tasks_;
  std::unique_ptr<TaskEvaluator> task_evaluator_;
  nlohmann::json task_figures_;  // the latest {"step", "tasks": {TASK: {metric: value}}}, for checkpoints
  std::unique_ptr<CheckpointSaver> saver_;
  std::unique_ptr<StragglerMonitor> stragglers_;  // train.straggler_factor > 0 on more than one rank
  double slow_factor_ = 1;                       // TRIPOD_SLOW_RANK on this rank
  int step_sleep_ms_ = 0;                        // TRIPOD_TEST_STEP_SLEEP_MS
  bool stopped_by_signal_ = false;
  bool stop_requested_ = false;  // after step(): some rank received SIGTERM or SIGUSR1
  std::string last_checkpoint_;  // the newest saved or loaded, for messages
  std::string loaded_from_;      // the checkpoint this run continues ("" when fresh)
  // Names this run's checkpoints (inherited when resuming) so that checkpoint.keep removes only
  // those: the start time and process id of the run's first rank 0.
  std::string run_id_ = new_run_id();
  LrSchedule lr_;
  int64_t step_ = 0;
  int64_t skipped_total_ = 0, bad_in_a_row_ = 0;
  double peak_flops_ = 0;  // the whole world's
  int64_t profile_first_ = 0, profile_last_ = -1;  // train.profile_steps: the steps timed
  std::vector<StepBreakdown> profiled_;            // this rank's, one per profiled step so far
  ProfileHook profile_hook_;
  double action_wall_s_ = 0;      // this step's pipeline actions (their callbacks), host wall time
  double action_mpi_wait_s_ = 0;  // the part of it in MPI waits (collectives inside the actions)
  Communicator* embedding_ = nullptr;  // the tied table's first/last-stage group (GradSync::Tied::PipelineEnds)
  // The step's global batch as its packed documents make it (data.reset_*, eod_mask_loss): the
  // tokens the loss counts and the attention pairs needed (every rank reads them the same).
  BatchDocuments batch_docs_;
};

}  // namespace tripod
