// Downstream evaluation tasks, the pure part: task files read into examples, examples turned into
// scoring requests by lm-evaluation-harness's rules, and the metrics of the scores. No model and no
// ranks here: train/task_evaluator.h scores the requests on the pipeline.
//
// The rules (lm-evaluation-harness, lm_eval/api/task.py and models/huggingface.py):
// - A multiple-choice example asks, per choice, for the log-likelihood of " " + choice (the
//   target delimiter) after the context. Whitespace ending the context moves to the front of the
//   continuation; the continuation's tokens are those of encode(context + continuation) past the
//   first len(encode(context)), so the context's tokens are the ones it has alone even when the
//   join merges across the boundary. An empty context is the end-of-text token.
// - A row is (context + continuation)[-(L+1):], L = model.seq_len: the context loses its start
//   when too long; the continuation (at most L tokens) is scored whole.
// - acc: the highest log-likelihood is the label; acc_norm: the highest log-likelihood divided by
//   the choice's length in characters (Python's len, without the delimiter); np.argmax's first
//   maximum on ties. Standard error: sample standard deviation / sqrt(n).
// - Text is scored in rolling windows (get_rolling_token_windows, context_len 1, made disjoint):
//   the first window is the end-of-text token then up to L tokens, each later one predicts the
//   next up to L tokens from the L tokens before each, so every token is scored once. Bits per
//   byte = -sum(ll) / sum(bytes) / ln 2; byte and word perplexity = exp(-sum(ll) / sum(bytes or
//   words)), words = len(re.split(r"\s+", text)).
// - HellaSwag: query = preprocess(activity_label + ": " + ctx_a + " " + ctx_b.capitalize()),
//   choices = preprocess(ending); preprocess strips, turns " [title]" into ". ", removes
//   "[...]" spans and then replaces each "  " by " " once (the harness's tasks/hellaswag/utils.py).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/config.h"

namespace tripod {

// Text to token ids (the run's tokenizer, or a test's).
using EncodeFn = std::function<std::vector<int>(std::string_view)>;

struct ChoiceExample {
  std::string context;               // HellaSwag: the preprocessed query
  std::vector<std::string> choices;  // without the delimiter
  int label = 0;
  int64_t line = 0;                  // in the task file, from 1
};

struct TextDocument {
  std::string text;
  int64_t line = 0;
};

// HellaSwag's preprocessing of one string, and its query.
std::string hellaswag_preprocess(std::string_view text);
std::string hellaswag_query(std::string_view activity_label, std::string_view ctx_a, std::string_view ctx_b);

// The examples of a multiple-choice task file (kind HellaSwag or MultipleChoice), the first `limit`
// of them (0: all). Blank lines are skipped. InputError "FILE:LINE: ..." naming the field at fault:
// a line that is not a JSON object, a missing or mistyped field, fewer than two choices, an empty
// choice (acc_norm divides by its length), a label out of range; "FILE: ..." when it cannot be read
// or holds no example.
std::vector<ChoiceExample> read_choice_examples(const std::string& path, TaskKind kind, int64_t limit);
// The documents of a text file (one per line; blank lines skipped) or of a JSONL file (.jsonl,
// .json, .ndjson: the string under "text"), the first `limit` of them (0: all). InputError as above.
std::vector<TextDocument> read_text_documents(const std::string& path, int64_t limit);
// The same on a file's `content` (`path` names it in errors; `jsonl`: JSONL, else text).
std::vector<ChoiceExample> parse_choice_examples(std::string_view content, const std::string& path, TaskKind kind,
                                                 int64_t limit);
std::vector<TextDocument> parse_text_documents(std::string_view content, const std::string& path, bool jsonl,
                                               int64_t limit);

// One row of the model's input: tokens[0, n) go in, tokens[1, n] are predicted, and the last
// `scored` predictions are summed (n = tokens.size() - 1 <= model.seq_len).
struct ScoreRequest {
  std::vector<int32_t> tokens;
  int32_t scored = 0;
  int64_t example = 0;  // the example or document of its task
  int32_t part = 0;     // its choice, or its rolling window
  int64_t length() const { return static_cast<int64_t>(tokens.size()) - 1; }
};

struct EncodedPair {
  std::vector<int> context, continuation;
};
// The harness's _encode_pair (and its empty-context case, which a context of only whitespace
// joins: its tokens would be none).
EncodedPair encode_pair(const EncodeFn& encode, std::string_view context, std::string_view continuation, int eot);
// The row that scores p.continuation after p.context with at most `max_length` input tokens.
// p.continuation must hold 1 .. max_length tokens.
ScoreRequest loglikelihood_request(const EncodedPair& p, int64_t max_length);
// The rolling windows that score every token of `tokens` once (none for no tokens).
std::vector<ScoreRequest> rolling_requests(const std::vector<int>& tokens, int prefix, int64_t max_length);

// len(s) in Python (code points of UTF-8 text), len(re.split(r"\s+", s)), and Python's
// whitespace (str.isspace, which re's \s matches).
int64_t count_chars(std::string_view utf8);
int64_t count_words(std::string_view utf8);
bool is_python_space(char32_t c);

struct ChoiceScore {
  int pred = 0, pred_norm = 0;  // argmax of ll, of ll / len(choice)
  bool acc = false, acc_norm = false;
};
ChoiceScore score_choices(std::span<const double> lls, const std::vector<std::string>& choices, int label);

// Mean and the standard error of the mean (none for fewer than two values).
struct MeanStderr {
  double mean = 0;
  std::optional<double> stderr_of_mean{};
};
MeanStderr mean_stderr(std::span<const double> x);

// A task read and tokenized: its examples (or documents) and every row to score, in order.
struct Task {
  EvalTaskConfig cfg;
  std::vector<ChoiceExample> examples;  // hellaswag, multiple_choice
  std::vector<TextDocument> documents;  // bits_per_byte
  std::vector<ScoreRequest> requests;
  int64_t size() const { return cfg.name == TaskKind::BitsPerByte ? documents.size() : examples.size(); }
  std::string label() const { return cfg.label(); }
};

// Reads cfg.path and builds its requests with `encode` (`eot`: the end-of-text token; rows of at
// most `max_length` input tokens; every id must be below `vocab_size`). `where` names the setting
// that gave the file in errors that are not about a line ("eval.tasks[0].path", "--task-file").
Task load_task(const EvalTaskConfig& cfg, const EncodeFn& encode, int eot, int64_t max_length, int vocab_size,
               const std::string& where);

struct TaskMetric {
  std::string name;  // acc, acc_norm; bits_per_byte, byte_perplexity, word_perplexity
  double value = 0;
  std::optional<double> stderr_of_mean{};
};

struct TaskResult {
  std::string task, kind, path;  // label, TaskKind's name, file
  int64_t examples = 0, requests = 0;
  std::vector<TaskMetric> metrics;
  nlohmann::json samples = nlohmann::json::array();  // per example, see task_result
  double seconds = 0;
  const TaskMetric* find(std::string_view name) const;
};

// The figures of `task` from the log-likelihood of each of its requests (in order). Samples:
// multiple choice {example, line, label, loglikelihoods, chars, tokens, pred, pred_norm, acc,
// acc_norm}; text {document, line, loglikelihood, tokens, windows, words, bytes}.
TaskResult task_result(const Task& task, std::span<const double> lls);

// A result as one JSON object: {task, kind, path, examples, seconds, <metric>: value,
// <metric>_stderr: value or null}.
nlohmann::json task_result_json(const TaskResult& r);

}  // namespace tripod
