// `tripod data train-tokenizer | preprocess | inspect | encode | decode`: tokenizers and indexed
// datasets.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "core/output_path.h"
#include "data/indexed_dataset.h"
#include "data/preprocess.h"
#include "data/tokenizer.h"
#include "train/commands/commands.h"

namespace tripod {

namespace {

struct DataOptions {
  TokenizerTrainOptions tok;
  std::string tok_format = "auto";
  PreprocessOptions pre;
  std::string pre_format = "auto";
  bool no_eod = false, no_progress = false, no_word_cache = false;
  std::optional<std::string> pre_workers;  // --workers as written (absent: one per core)
  std::string inspect_prefix, inspect_tokenizer, inspect_eod, inspect_pattern;
  std::optional<int64_t> show_document;
  bool json = false, verbose = false;
  // encode / decode
  std::string codec_tokenizer, codec_pattern, codec_input, codec_output;
  bool codec_specials = false;
};

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  TRIPOD_INPUT_CHECK(f.good(), "--input {}: no such file", path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void write_all(const std::string& path, std::string_view bytes) {
  if (path.empty() || path == "-") {
    std::fwrite(bytes.data(), 1, bytes.size(), stdout);
    std::fflush(stdout);
    return;
  }
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  TRIPOD_INPUT_CHECK(f.good(), "--output {}: cannot be written", path);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// The whole input file as one text -> a JSON array of ids.
int run_encode(DataOptions& o) {
  init_logging(0, 1, o.verbose);
  Tokenizer tok(o.codec_tokenizer, "", o.codec_pattern);
  const std::string text = read_all(o.codec_input);
  std::vector<int> ids;
  WordCache cache;
  tok.encode(text, ids, &cache, o.codec_specials);
  write_all(o.codec_output, nlohmann::json(ids).dump() + "\n");
  return 0;
}

// A JSON array of ids -> the bytes they decode to, exactly.
int run_decode(DataOptions& o) {
  init_logging(0, 1, o.verbose);
  Tokenizer tok(o.codec_tokenizer, "", o.codec_pattern);
  const nlohmann::json j = nlohmann::json::parse(read_all(o.codec_input), nullptr, false);
  TRIPOD_INPUT_CHECK(j.is_array(), "--input {}: not a JSON array of token ids", o.codec_input);
  std::vector<int32_t> ids;
  for (const auto& v : j) {
    TRIPOD_INPUT_CHECK(v.is_number_integer(), "--input {}: {} is not a token id", o.codec_input, v.dump());
    ids.push_back(v.get<int32_t>());
  }
  write_all(o.codec_output, tok.decode(ids));
  return 0;
}

int run_train_tokenizer(DataOptions& o) {
  init_logging(0, 1, o.verbose);
  o.tok.format = parse_input_format(o.tok_format, "--input-format");
  o.tok.verbose = o.verbose;
  for (const char* ext : {".model", ".vocab"}) check_output_file(o.tok.model_prefix + ext, "--model-prefix");
  TokenizerTrainStats st = train_tokenizer(o.tok);
  spdlog::info("wrote {0}.model and {0}.vocab: {1} pieces ({2}, end of document \"{3}\") from {4} documents ({5} "
               "sentences){6}", o.tok.model_prefix, o.tok.vocab_size, o.tok.model_type, o.tok.eod_piece, st.documents,
               st.sentences, st.bad_lines ? fmt::format("; {} bad lines skipped", st.bad_lines) : "");
  return 0;
}

// --workers N: a whole number of threads from 1 to kMaxPreprocessWorkers (more than the cores is
// allowed; leaving it out means one per core).
int parse_workers(const std::string& s) {
  int n = 0;
  const char* end = s.data() + s.size();
  auto [p, ec] = std::from_chars(s.data(), end, n);
  TRIPOD_INPUT_CHECK(!s.empty() && ec == std::errc() && p == end && n >= 1 && n <= kMaxPreprocessWorkers,
                     "--workers {}: must be a whole number of encoding threads from 1 to {} (leave it out for one "
                     "per core)", s.empty() ? "''" : s, kMaxPreprocessWorkers);
  return n;
}

int run_preprocess(DataOptions& o) {
  init_logging(0, 1, o.verbose);
  if (o.pre_workers) o.pre.workers = parse_workers(*o.pre_workers);
  o.pre.format = parse_input_format(o.pre_format, "--input-format");
  o.pre.append_eod = !o.no_eod;
  o.pre.progress = !o.no_progress;
  o.pre.word_cache = !o.no_word_cache;
  for (const char* ext : {".bin", ".idx"}) check_output_file(o.pre.output_prefix + ext, "--output-prefix");
  PreprocessStats st = preprocess(o.pre);
  spdlog::info("wrote {0}.bin and {0}.idx: {1} documents, {2} tokens ({3}, vocabulary {4}) from {5:.1f} MB in {6:.2f} "
               "s ({7:.2f} MB/s, {11:.2f} CPU s with {12} workers, {13:.2f} of it writing; the tokenizer loaded in "
               "{10:.2f} s){8}{9}",
               o.pre.output_prefix, st.documents, st.tokens, dtype_name(st.dtype), st.vocab_size, st.bytes / 1e6,
               st.seconds, st.bytes / 1e6 / std::max(st.seconds, 1e-9),
               st.bad_lines ? fmt::format("; {} bad lines skipped", st.bad_lines) : "",
               st.blank_lines ? fmt::format("; {} blank lines", st.blank_lines) : "", st.load_seconds, st.cpu_seconds,
               st.workers, st.writer_cpu_seconds);
  return 0;
}

int run_inspect(DataOptions& o) {
  init_logging(0, 1, o.verbose);
  IndexedDataset d(o.inspect_prefix);
  int64_t min_len = 0, max_len = 0;
  std::vector<int64_t> lengths(static_cast<size_t>(d.num_documents()));
  for (int64_t i = 0; i < d.num_documents(); ++i) {
    int64_t n = lengths[i] = d.document_tokens(i);
    min_len = i == 0 ? n : std::min(min_len, n);
    max_len = std::max(max_len, n);
  }
  // Document lengths (what packing documents into sequences cuts at, data.reset_attention_mask):
  // the mean and the nearest-rank median and 99th percentile.
  auto percentile = [&](double p) -> int64_t {
    if (lengths.empty()) return 0;
    const auto k = static_cast<size_t>(std::max<double>(1.0, std::ceil(p / 100.0 * static_cast<double>(lengths.size())))) - 1;
    std::nth_element(lengths.begin(), lengths.begin() + static_cast<std::ptrdiff_t>(k), lengths.end());
    return lengths[k];
  };
  const double mean_len =
      d.num_documents() ? static_cast<double>(d.num_tokens()) / static_cast<double>(d.num_documents()) : 0.0;
  const int64_t p50 = percentile(50), p99 = percentile(99);
  nlohmann::json j = {{"prefix", o.inspect_prefix},
                      {"dtype", std::string(dtype_name(d.dtype()))},
                      {"sequences", d.num_sequences()},
                      {"documents", d.num_documents()},
                      {"tokens", d.num_tokens()},
                      {"bin_bytes", d.bin_bytes()},
                      {"idx_bytes", d.idx_bytes()},
                      {"min_document_tokens", min_len},
                      {"max_document_tokens", max_len},
                      {"document_tokens", {{"mean", mean_len}, {"p50", p50}, {"p99", p99}}}};
  TRIPOD_INPUT_CHECK(o.inspect_tokenizer.empty() || o.show_document,
                     "--tokenizer-model is for decoding a document: add --show-document I");
  if (o.show_document) {
    const int64_t at = *o.show_document;
    TRIPOD_INPUT_CHECK(at >= 0 && at < d.num_documents(), "--show-document {}: {} has documents 0 to {}", at,
                       o.inspect_prefix, d.num_documents() - 1);
    std::vector<int32_t> ids = d.document(at);
    nlohmann::json doc = {{"index", at}, {"tokens", ids.size()}, {"ids", ids}};
    if (!o.inspect_tokenizer.empty()) {
      Tokenizer tok(o.inspect_tokenizer, o.inspect_eod, o.inspect_pattern);
      doc["text"] = tok.decode(ids);
    }
    j["document"] = doc;
  }
  if (o.json) {
    fmt::print("{}\n", j.dump());
    return 0;
  }
  fmt::print("prefix     {}\ndtype      {}\nsequences  {}\ndocuments  {}\ntokens     {}\n"
             "tokens per document  min {}  mean {:.1f}  p50 {}  p99 {}  max {}\n",
             o.inspect_prefix, dtype_name(d.dtype()), d.num_sequences(), d.num_documents(), d.num_tokens(), min_len,
             mean_len, p50, p99, max_len);
  if (j.contains("document")) {
    const auto& doc = j["document"];
    fmt::print("\ndocument {} ({} tokens)\nids: {}\n", *o.show_document, doc["tokens"].get<int64_t>(),
               doc["ids"].dump());
    if (doc.contains("text")) fmt::print("text:\n{}\n", doc["text"].get<std::string>());
  }
  return 0;
}

}  // namespace

CommandFn add_data_command(CLI::App& app) {
  auto o = std::make_shared<DataOptions>();
  CLI::App* data = app.add_subcommand("data", "Tokenizers and indexed datasets (Megatron-LM compatible)");
  data->require_subcommand(1);

  CLI::App* tt = data->add_subcommand("train-tokenizer", "Train a SentencePiece tokenizer on text or JSONL documents");
  tt->add_option("--input", o->tok.inputs, "Text (one document per line) or JSONL files")->required();
  tt->add_option("--vocab-size", o->tok.vocab_size, "Vocabulary size")->required();
  tt->add_option("--model-prefix", o->tok.model_prefix, "Writes PREFIX.model and PREFIX.vocab")->required();
  tt->add_option("--model-type", o->tok.model_type, "bpe or unigram")->capture_default_str();
  tt->add_option("--character-coverage", o->tok.character_coverage, "Share of characters the vocabulary covers")
      ->capture_default_str();
  tt->add_option("--eod-piece", o->tok.eod_piece, "The end-of-document token")->capture_default_str();
  tt->add_option("--user-symbol", o->tok.user_symbols, "Another special token, kept whole (repeatable)");
  tt->add_flag("--byte-fallback", o->tok.byte_fallback, "Encode unknown characters as bytes");
  tt->add_option("--json-key", o->tok.json_key, "JSONL key holding the document")->capture_default_str();
  tt->add_option("--input-format", o->tok_format, "auto (by extension), text or jsonl")->capture_default_str();
  tt->add_option("--max-sentences", o->tok.max_sentences, "Train on a sample of this many sentences (0: all)")
      ->capture_default_str();
  tt->add_option("--threads", o->tok.threads, "Training threads (0: all cores)")->capture_default_str();
  tt->add_option("--seed", o->tok.seed, "Random seed")->capture_default_str();
  tt->add_flag("--skip-bad-lines", o->tok.skip_bad_lines, "Count and skip bad input lines instead of failing");
  tt->add_flag("--overwrite", o->tok.overwrite, "Replace an existing model");
  tt->add_flag("-v,--verbose", o->verbose, "Show SentencePiece's own log");

  CLI::App* pp = data->add_subcommand("preprocess", "Tokenize documents into PREFIX.bin + PREFIX.idx");
  pp->add_option("--input", o->pre.input, "Text (one document per line) or JSONL file")->required();
  pp->add_option("--tokenizer-model", o->pre.tokenizer_model,
                 "SentencePiece .model, GPT-2 vocab.json (+ merges.txt), *.tiktoken or tokenizer.json")->required();
  pp->add_option("--tokenizer-pattern", o->pre.tokenizer_pattern,
                 "A tiktoken file's pattern: r50k, p50k, cl100k, o200k or a regex (default: from the file name)");
  pp->add_option("--output-prefix", o->pre.output_prefix, "Writes PREFIX.bin and PREFIX.idx")->required();
  pp->add_option("--json-key", o->pre.json_key, "JSONL key holding the document")->capture_default_str();
  pp->add_option("--input-format", o->pre_format, "auto (by extension), text or jsonl")->capture_default_str();
  pp->add_option("--workers", o->pre_workers, "Encoding threads, 1 to 256 (default: one per core)")->type_name("INT");
  pp->add_option("--eod-piece", o->pre.eod_piece, "End-of-document token (default: the model's end-of-sentence)");
  pp->add_flag("--no-eod", o->no_eod, "Do not append the end-of-document token");
  pp->add_flag("--skip-bad-lines", o->pre.skip_bad_lines, "Count and skip bad input lines instead of failing");
  pp->add_flag("--overwrite", o->pre.overwrite, "Replace an existing dataset");
  pp->add_flag("--no-progress", o->no_progress, "No progress line (it shows only on a terminal anyway)");
  pp->add_flag("--no-word-cache", o->no_word_cache, "Encode every document whole (the same ids, slower)");
  pp->add_flag("-v,--verbose", o->verbose, "Debug logging");

  CLI::App* in = data->add_subcommand("inspect", "Describe an indexed dataset; decode one document");
  in->add_option("prefix", o->inspect_prefix, "PREFIX of PREFIX.bin + PREFIX.idx")->required();
  in->add_flag("--json", o->json, "One JSON object on stdout");
  in->add_option("--tokenizer-model", o->inspect_tokenizer, "Tokenizer to decode with (as for preprocess)");
  in->add_option("--tokenizer-pattern", o->inspect_pattern, "A tiktoken file's pattern (as for preprocess)");
  in->add_option("--eod-piece", o->inspect_eod, "End-of-document token of the tokenizer");
  in->add_option("--show-document", o->show_document, "Print document I (its ids; its text with a tokenizer)");
  in->add_flag("-v,--verbose", o->verbose, "Debug logging");

  CLI::App* en = data->add_subcommand("encode", "Encode a text file (all of it, one text) to a JSON array of ids");
  CLI::App* de = data->add_subcommand("decode", "Decode a JSON array of ids to the exact bytes of its text");
  for (CLI::App* c : {en, de}) {
    c->add_option("--tokenizer-model", o->codec_tokenizer, "Tokenizer (as for preprocess)")->required();
    c->add_option("--tokenizer-pattern", o->codec_pattern, "A tiktoken file's pattern (as for preprocess)");
    c->add_option("--input", o->codec_input, "The file to read")->required();
    c->add_option("--output", o->codec_output, "The file to write (default: stdout)");
    c->add_flag("-v,--verbose", o->verbose, "Debug logging");
  }
  en->add_flag("--special-tokens", o->codec_specials,
               "Special tokens written in the text (<|endoftext|>) are their ids (default: plain text)");

  return [o, tt, pp, in, en, de] {
    if (tt->parsed()) return run_train_tokenizer(*o);
    if (pp->parsed()) return run_preprocess(*o);
    if (in->parsed()) return run_inspect(*o);
    if (en->parsed()) return run_encode(*o);
    if (de->parsed()) return run_decode(*o);
    return 2;
  };
}

}  // namespace tripod
