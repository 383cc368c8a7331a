// The run's configuration: TOML sections read into typed per-section structs and validated.
// Unknown keys, wrong types and out-of-range values are InputErrors naming the key and what is
// valid. Checks that need the world size (the grid) are in validate_layout().
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "model/config.h"

namespace tripod {

struct ParallelConfig {
  int tp = 1, pp = 1;
  int dp = 0;  // 0: derived from the world size
  int vp = 1;  // model chunks (virtual stages) per pipeline rank
  std::string schedule = "1f1b";  // gpipe | 1f1b | interleaved
  std::string schedule_file;      // a custom schedule (CSV), overriding `schedule`
  std::vector<int> layers_per_stage;  // explicit layer counts per virtual stage
  bool sequence_parallel = false;
  bool distributed_optimizer = false;
  double bucket_mb = 25.0;   // DP gradient bucket size
  double timeout_s = 600.0;  // longest wait on any communication before failing
};

struct TrainConfig {
  std::string device = "cpu";
  uint64_t seed = 1234;
  int micro_batch_size = 1;
  int global_batch_size = 0;  // 0: micro_batch_size * dp
  int64_t steps = 0;
  double lr = 6e-4, min_lr = 0.0;
  int64_t warmup_steps = 0;
  std::string decay = "cosine";  // cosine | linear | constant
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
};

struct DataConfig {
  std::vector<std::string> prefixes;  // indexed datasets (PREFIX.bin / PREFIX.idx)
  std::vector<double> weights;        // blending weights, one per prefix
  std::string split = "969,30,1";     // train, valid, test
  std::string tokenizer;              // for eval/generate: a SentencePiece .model, vocab.json, *.tiktoken, tokenizer.json
  std::string tokenizer_pattern;      // a tiktoken file's pattern (r50k, p50k, cl100k, o200k, a regex); "": its name's
  std::string eod_token;              // the end-of-document token; "": the tokenizer's own
  bool synthetic = false;             // deterministic synthetic tokens instead of data
};

struct CheckpointConfig {
  std::string dir;    // "": no checkpoints
  int64_t interval = 0;
  int keep = 0;       // 0: keep all
  std::string load;   // a checkpoint directory, or "latest" (in dir)
  bool async = false;
  bool overwrite = false;  // let a fresh run write into a directory holding another run's checkpoints
};

struct Config {
  ModelConfig model;
  ParallelConfig parallel;
  TrainConfig train;
  RecomputeConfig recompute;
  DataConfig data;
  CheckpointConfig checkpoint;
};

// Reads `path` and applies `overrides` ("section.key=value", value in TOML syntax or a bare string).
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});
// Parses TOML text (`origin` names it in errors).
Config parse_config(const std::string& text, const std::string& origin, const std::vector<std::string>& overrides = {});
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
