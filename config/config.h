// The run's configuration: TOML sections read into typed per-section structs, each validated by
// its own validate() beside it. Unknown keys, wrong types, unknown choices (parsed once into
// enums here) and out-of-range values are InputErrors naming the key and what is valid. Checks
// that need the world size (the grid) are in validate_layout().
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/device.h"
#include "model/config.h"
#include "parallel/grid.h"
#include "parallel/pipeline/schedules.h"

namespace tripod {

// What a command needs of its config beyond what every command checks: training needs
// train.steps, and reading data needs data.prefixes (or data.synthetic). `tripod plan` needs
// neither.
struct ConfigUse {
  bool training = true;
  bool data = true;
};

struct ParallelConfig {
  int tp = 1, pp = 1;
  int dp = 0;  // 0: derived from the world size
  int vp = 1;  // model chunks (virtual stages) per pipeline rank
  int cp = 1;  // context parallelism: ranks splitting every sequence (2 load-balanced chunks each)
  CpComm cp_comm = CpComm::Ring;  // how attention reaches the other chunks' keys and values
  // Expert parallelism: the routed experts split over ep ranks taken from the DP x CP group
  // (parallel/grid.h); and how tokens travel to them.
  int ep = 1;
  MoeDispatcher moe_dispatcher = MoeDispatcher::AllToAll;
  ScheduleKind schedule = ScheduleKind::OneFOneB;
  std::string schedule_file;      // a custom schedule (CSV), overriding `schedule`
  // Where virtual stages live (parallel/pipeline/placement.h): loop, or v (vp = 2; the zbv and
  // dualpipev schedules).
  Placement placement = Placement::Loop;
  // Layer counts per virtual stage (pp*vp entries): given, or "auto" (balance_layers), filled in
  // by balance_stages (plan/cost_model.h) from the cost model before any rank layout is made.
  std::vector<int> layers_per_stage;
  bool balance_layers = false;
  std::string hardware;  // the hardware file "auto" balances with; "": default_hardware(train.device)
  bool sequence_parallel = false;
  bool distributed_optimizer = false;
  double bucket_mb = 25.0;   // DP gradient bucket size
  double timeout_s = 600.0;  // longest wait on any communication before failing
  int flight_recorder_size = 2000;  // communication operations each rank's flight recorder keeps; 0: off

  void validate(const std::string& origin) const;
  // The rank grid of these sizes (dp resolved: validate_layout).
  RankGrid grid() const { return RankGrid(tp, dp, pp, cp, ep); }
};

enum class Decay { Cosine, Linear, Constant };  // of the learning rate after the warmup
template <> struct EnumNames<Decay> { static constexpr std::array<std::string_view, 3> names{"cosine", "linear", "constant"}; };

struct TrainConfig {
  Device device = Device::CPU;
  uint64_t seed = 1234;
  int micro_batch_size = 1;
  int global_batch_size = 0;  // 0: micro_batch_size * dp
  int64_t steps = 0;
  double lr = 6e-4, min_lr = 0.0;
  int64_t warmup_steps = 0;
  Decay decay = Decay::Cosine;
  double weight_decay = 0.1;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double grad_clip = 1.0;  // 0: off
  int64_t log_interval = 1;
  int64_t eval_interval = 0;  // 0: no evaluation during training
  int64_t eval_steps = 10;
  std::string output_dir = "runs/default";
  int64_t exit_interval = 0;  // stop (with a checkpoint) after this step; 0: run all steps
  int max_bad_steps = 3;      // consecutive non-finite losses or grad norms before stopping
  bool trace = true;          // record the per-rank timeline in output_dir/trace/
  std::string tensorboard_dir;    // TensorBoard event files (train/tensorboard.h); "": none
  double straggler_factor = 1.3;  // a rank computing this much over the median is a straggler; 0: off
  // The linear layers' GEMMs (model/config.h, model/fp8.h): bf16 (the backend's compute dtype) or
  // fp8 with its recipe, amax history (delayed), margin and the first/last layers kept out of FP8.
  Precision precision = Precision::Bf16;
  Fp8Recipe fp8_recipe = Fp8Recipe::Tensorwise;
  int fp8_amax_history = 1024;
  int fp8_margin = 0;
  int fp8_bf16_layers = 0;
  bool fp8() const { return precision == Precision::Fp8; }
  Fp8Config fp8_config() const {
    return {.recipe = fp8_recipe, .amax_history = fp8_amax_history, .margin = fp8_margin,
            .bf16_layers = fp8_bf16_layers};
  }
  // Time this many steps (after the run's first) by op family, communication and idle, and write
  // them beside the cost model's prediction into output_dir/plan_check.json; 0: off.
  int profile_steps = 0;

  // `training`: train.steps must be given (>= 1).
  void validate(const std::string& origin, bool training) const;
};

struct DataConfig {
  std::vector<std::string> prefixes;  // indexed datasets (PREFIX.bin / PREFIX.idx)
  std::vector<double> weights;        // blending weights, one per prefix
  std::string split = "969,30,1";     // train, valid, test
  std::string tokenizer;              // for eval/generate: a SentencePiece .model, vocab.json, *.tiktoken, tokenizer.json
  std::string tokenizer_pattern;      // a tiktoken file's pattern (r50k, p50k, cl100k, o200k, a regex); "": its name's
  // The end-of-document token: a piece of data.tokenizer (eod_token; "": the tokenizer's own) or,
  // given as an integer in the TOML, its id (eod_token_id; -1: not given).
  std::string eod_token;
  int64_t eod_token_id = -1;
  bool synthetic = false;             // deterministic synthetic tokens instead of data
  // Packed documents, as Megatron's _get_ltor_masks_and_position_ids defines them (a document ends
  // with an end-of-document input token, which belongs to it): positions restart after every one
  // (reset_position_ids), tokens attend only within their document (reset_attention_mask), and
  // positions whose input is the end-of-document token do not count in the loss (eod_mask_loss).
  bool reset_position_ids = false;
  bool reset_attention_mask = false;
  bool eod_mask_loss = false;

  // Whether any of the three is on: the run needs the documents' boundaries (and their token).
  bool documents() const { return reset_position_ids || reset_attention_mask || eod_mask_loss; }
  // `reads_data`: data.prefixes (or data.synthetic) must be given.
  void validate(const std::string& origin, bool reads_data) const;
};

struct CheckpointConfig {
  std::string dir;    // "": no checkpoints
  int64_t interval = 0;
  int keep = 0;       // 0: keep all
  std::string load;   // a checkpoint directory, or "latest" (in dir)
  bool async = false;
  bool overwrite = false;  // let a fresh run write into a directory holding another run's checkpoints

  void validate(const std::string& origin) const;
};

// Downstream evaluation tasks (train/tasks.h): what a task file holds and how it is scored.
//   hellaswag:       the original HellaSwag JSONL (activity_label, ctx_a, ctx_b, endings, label),
//                    preprocessed as lm-evaluation-harness does; acc and acc_norm.
//   multiple_choice: JSONL of {"context", "choices", "label"} (ARC, PIQA, ... in one line); acc, acc_norm.
//   bits_per_byte:   text (a document per line) or JSONL ("text"): rolling log-likelihood of every
//                    document; bits per byte, byte and word perplexity.
enum class TaskKind { HellaSwag, MultipleChoice, BitsPerByte };
template <> struct EnumNames<TaskKind> {
  static constexpr std::array<std::string_view, 3> names{"hellaswag", "multiple_choice", "bits_per_byte"};
};

// One entry of [eval] tasks: {name = "hellaswag", path = "hellaswag_val.jsonl", limit = 0, tag = ""}.
struct EvalTaskConfig {
  TaskKind name = TaskKind::HellaSwag;
  std::string path;
  int64_t limit = 0;  // the first `limit` examples (documents); 0: all
  std::string tag;    // what its figures are called (metrics.jsonl, TensorBoard, the report); "": the name
  std::string label() const { return tag.empty() ? std::string(enum_name(name)) : tag; }
};

struct EvalConfig {
  std::vector<EvalTaskConfig> tasks;  // run next to the validation loss at train.eval_interval

  void validate(const std::string& origin) const;
};

struct Config {
  ModelConfig model;
  ParallelConfig parallel;
  TrainConfig train;
  RecomputeConfig recompute;
  DataConfig data;
  CheckpointConfig checkpoint;
  EvalConfig eval;
};

// Reads `path` and applies `overrides` ("section.key=value", value in TOML syntax or a bare string).
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {}, ConfigUse use = {});
// Parses TOML text (`origin` names it in errors).
Config parse_config(const std::string& text, const std::string& origin, const std::vector<std::string>& overrides = {},
                    ConfigUse use = {});
// The resolved configuration as TOML (every key, defaults filled in).
std::string config_to_toml(const Config& cfg);
// Every [model] key with its resolved value (ffn_hidden and max_positions filled in), as JSON:
// what a checkpoint records as "model" and what a load compares it with, key by key.
nlohmann::json model_to_json(const ModelConfig& m);
// The inverse: keys absent from `j` keep their defaults (GPT-2's architecture). InputError naming
// `origin` and the key when a value has the wrong type.
ModelConfig model_from_json(const nlohmann::json& j, const std::string& origin);
// Checks that need the world size; fills parallel.dp and train.global_batch_size when derived.
void validate_layout(Config& cfg, int world_size);

}  // namespace tripod
