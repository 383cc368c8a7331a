// `tripod generate [--config F.toml] (--load DIR | --init-seed S) --prompt TEXT [--max-tokens N]
//  [--temperature T] [--top-k K] [--top-p P] [--seed S]`
//
// Without --config the checkpoint's own config is used (its data.tokenizer too).
// Runs on the grid (tp = world size, pp = 1, dp = 1) whatever the config's grid is: the weights
// are resharded to it on loading. Rank 0 streams the continuation to stdout, one decoded piece
// at a time.
#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <cstdlib>

#include "core/log.h"
#include "data/tokenizer.h"
#include "model/gpt.h"
#include "model/inference.h"
#include "train/commands/commands.h"
#include "config/layout.h"
#include "train/commands/weights.h"
#include "train/mpi_session.h"
#include "train/runtime.h"

namespace tripod {

namespace {

struct GenerateOptions {
  std::string config, prompt;
  std::vector<std::string> sets;
  WeightOptions weights;
  int64_t max_tokens = 64;
  double temperature = 1.0, top_p = 1.0;
  int top_k = 0;
  uint64_t seed = 1234;
  bool verbose = false;
};

// The config's model on (tp = world, pp = 1, dp = 1).
void force_inference_grid(Config& cfg, int world) {
  ParallelConfig& p = cfg.parallel;
  // Decoding attends one new token to a cache: context parallelism (parallel.cp) does not apply,
  // every TP rank holds whole sequences.
  if (p.pp != 1 || (p.dp != 0 && p.dp != 1) || p.tp != world || p.cp != 1)
    spdlog::info("generate runs on grid (dp=1, pp=1, cp=1, tp={}) (the world size), not the config's (dp={}, pp={}, "
                 "cp={}, tp={})", world, p.dp, p.pp, p.cp, p.tp);
  p.tp = world;
  p.pp = p.dp = p.vp = p.cp = 1;
  p.schedule = ScheduleKind::OneFOneB;
  p.schedule_file.clear();
  p.placement = Placement::Loop;
  p.layers_per_stage.clear();
  p.balance_layers = false;
  p.sequence_parallel = false;
  cfg.train.global_batch_size = cfg.train.micro_batch_size;
}

int run_generate(const GenerateOptions& o) {
  MpiSession mpi;
  init_logging(mpi.rank(), mpi.size(), o.verbose);
  Config cfg;
  Runtime rt;
  std::unique_ptr<Tokenizer> tok;
  std::vector<int> prompt;
  try {
    check_weight_options(o.weights);
    cfg = load_command_config(o.config, o.weights, o.sets, {.tokenizer = true});
    TRIPOD_INPUT_CHECK(!o.prompt.empty(), "--prompt is empty; give the text to continue");
    TRIPOD_INPUT_CHECK(o.max_tokens >= 1, "--max-tokens {}: give at least 1 token to generate", o.max_tokens);
    TRIPOD_INPUT_CHECK(std::isfinite(o.temperature) && o.temperature >= 0,
                       "--temperature {}: give a number >= 0 (0 picks the most likely token)", o.temperature);
    TRIPOD_INPUT_CHECK(std::isfinite(o.top_p) && o.top_p > 0 && o.top_p <= 1,
                       "--top-p {}: give a probability in (0, 1] (1 keeps every token)", o.top_p);
    TRIPOD_INPUT_CHECK(o.top_k >= 0, "--top-k {}: give a number of tokens >= 0 (0 keeps every token)", o.top_k);
    TRIPOD_INPUT_CHECK(!cfg.data.tokenizer.empty(), "data.tokenizer is not set in {}; generate needs the tokenizer "
                       "(--set data.tokenizer=PATH: a .model, vocab.json, *.tiktoken or tokenizer.json)",
                       o.config.empty() ? o.weights.load : o.config);
    try {
      tok = std::make_unique<Tokenizer>(cfg.data.tokenizer, cfg.data.eod_token, cfg.data.tokenizer_pattern);
    } catch (const InputError& e) {
      throw InputError(fmt::format("data.tokenizer: {}", e.what()));
    }
    check_checkpoint_tokenizer(o.weights, cfg);
    TRIPOD_INPUT_CHECK(tok->vocab_size() <= cfg.model.vocab_size,
                       "data.tokenizer {} has {} tokens but model.vocab_size = {}; give the tokenizer the model was "
                       "trained with", cfg.data.tokenizer, tok->vocab_size(), cfg.model.vocab_size);
    tok->encode(o.prompt, prompt, nullptr, /*specials=*/true);  // a prompt may write <|endoftext|> and the like
    TRIPOD_INPUT_CHECK(!prompt.empty(), "--prompt '{}' encodes to no tokens; give some text", o.prompt);
    const int64_t limit = cfg.model.positions(), len = static_cast<int64_t>(prompt.size());
    TRIPOD_INPUT_CHECK(len + o.max_tokens <= limit,
                       "--max-tokens {}: the prompt is {} tokens and the model holds {} positions (model.seq_len / "
                       "model.max_positions), so at most {} new tokens fit{}",
                       o.max_tokens, len, limit, std::max<int64_t>(0, limit - len),
                       len >= limit ? "; shorten --prompt" : "");
    force_inference_grid(cfg, mpi.size());
    validate_layout(cfg, mpi.size());
    rt = make_runtime(cfg);
  } catch (const InputError& e) {
    rethrow_agreed(e);
  }
  Ops& ops = *rt.ops;
  ParallelContext& par = rt.par;

  // The training model registers every parameter with its TP shard; inference reads them.
  ParamRegistry reg;
  GptModel model(ops, par, cfg.model, chunks_of(cfg, 0), RecomputeConfig{}, reg);
  reg.allocate(ops);
  load_weights(o.weights, cfg, reg, ops, par);
  const int64_t len = static_cast<int64_t>(prompt.size());
  InferenceModel inf(ops, par, cfg.model, reg, len + o.max_tokens);

  const SamplingOptions so{.temperature = o.temperature, .top_k = o.top_k, .top_p = o.top_p};
  std::mt19937_64 rng(o.seed);
  std::vector<int32_t> ids(prompt.begin(), prompt.end());
  // The prompt (as the tokenizer reads it back) comes first, then the continuation; DecodeStream
  // prints whole characters as they complete (a byte-level token may end inside one), and the
  // bytes printed are exactly decode(prompt + generated).
  DecodeStream stream(*tok, ids);
  auto out = [&](const std::string& text) {
    if (mpi.rank() != 0 || text.empty()) return;
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  };
  out(stream.start());
  auto t0 = std::chrono::steady_clock::now();
  std::vector<float> logits = inf.forward(ids);
  const double prefill_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int64_t generated = 0;
  for (int64_t i = 0; i < o.max_tokens; ++i) {
    // Ids the tokenizer cannot decode (a model vocabulary larger than the tokenizer's) never come.
    const int32_t next = sample_token(std::span(logits).first(tok->vocab_size()), so, rng);
    ids.push_back(next);
    ++generated;
    if (mpi.rank() == 0) out(stream.push(next));
    if (next == tok->eod_id() || i + 1 == o.max_tokens) break;
    logits = inf.forward(std::span<const int32_t>(&ids.back(), 1));
  }
  out(stream.finish());
  out("\n");
  const double total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  spdlog::info("prompt {} tokens (prefill {:.3f} s); generated {} tokens in {:.3f} s ({:.1f} tokens/s) on tp={}", len,
               prefill_s, generated, total_s - prefill_s, generated / std::max(1e-9, total_s - prefill_s),
               par.grid.tp());
  return 0;
}

}  // namespace

CommandFn add_generate_command(CLI::App& app) {
  auto opts = std::make_shared<GenerateOptions>();
  CLI::App* sub = app.add_subcommand(
      "generate", "Continue a prompt with a trained model, streaming the text (tensor parallel over the world)");
  sub->add_option("--config", opts->config, "TOML config file (the model and data.tokenizer); default: the --load "
                  "checkpoint's");
  add_weight_options(sub, opts->weights);
  sub->add_option("--prompt", opts->prompt, "Text to continue")->required();
  sub->add_option("--max-tokens,--max-new-tokens", opts->max_tokens, "Tokens to generate at most (default 64)");
  sub->add_option("--temperature", opts->temperature, "Sampling temperature; 0 is greedy (default 1)");
  sub->add_option("--top-k", opts->top_k, "Sample among the K most likely tokens; 0 for all (default 0)");
  sub->add_option("--top-p", opts->top_p, "Nucleus sampling: the smallest set with this probability (default 1)");
  sub->add_option("--seed", opts->seed, "Seed of the sampler (default 1234)");
  sub->add_option("--set", opts->sets, "Override a config value: section.key=value (repeatable)");
  sub->add_flag("-v,--verbose", opts->verbose, "Debug logging on every rank");
  return [opts] { return run_generate(*opts); };
}

}  // namespace tripod
