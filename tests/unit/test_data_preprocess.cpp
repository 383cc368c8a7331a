// Tokenizer training and preprocess: documents read back exactly, the same bytes with any
// number of workers, and bad input lines reported as file:line (or counted and skipped).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sentencepiece_trainer.h>

#include <random>

#include "core/error.h"
#include "input_error.h"
#include "jsonl_reference.h"
#include "data/indexed_dataset.h"
#include "data/preprocess.h"
#include "data/tokenizer.h"
#include "test_data_helpers.h"
#include "test_util.h"

namespace tripod {
namespace {

using namespace tripod::testing;

std::vector<std::string> fixture_texts() {
  std::vector<std::string> texts;
  std::ifstream f(fixture("genesis_1_8.jsonl"));
  for (std::string line; std::getline(f, line);) texts.push_back(nlohmann::json::parse(line)["text"]);
  return texts;
}

using test::expect_input_error;

TEST(DataTokenizer, TrainsAndEncodes) {
  TempDir dir;
  std::string model = train_fixture_tokenizer(dir);
  Tokenizer tok(model);
  EXPECT_EQ(tok.vocab_size(), 400);
  EXPECT_EQ(tok.eod_id(), 2);
  EXPECT_EQ(tok.piece(tok.eod_id()), "<|endoftext|>");
  std::vector<int> ids;
  tok.encode("In the beginning God created the heaven and the earth.", ids);
  EXPECT_GT(ids.size(), 3u);
  std::vector<int32_t> v(ids.begin(), ids.end());
  EXPECT_EQ(tok.decode(v), "In the beginning God created the heaven and the earth.");
  // The same input and seed train the same vocabulary.
  TempDir dir2;
  Tokenizer again(train_fixture_tokenizer(dir2));
  ASSERT_EQ(again.vocab_size(), tok.vocab_size());
  for (int i = 0; i < tok.vocab_size(); ++i) ASSERT_EQ(again.piece(i), tok.piece(i)) << "piece " << i;
  // Unigram and extra special tokens.
  TokenizerTrainOptions o;
  o.inputs = {fixture("genesis_1_8.jsonl")};
  o.vocab_size = 300;
  o.model_type = "unigram";
  o.user_symbols = {"<sep>"};
  o.eod_piece = "<eod>";
  o.model_prefix = dir / "uni";
  train_tokenizer(o);
  Tokenizer uni(dir / "uni.model");
  EXPECT_EQ(uni.piece(uni.eod_id()), "<eod>");
  uni.encode("a<sep>b", ids);
  EXPECT_NE(std::find(ids.begin(), ids.end(), Tokenizer(dir / "uni.model", "<sep>").eod_id()), ids.end());
}

TEST(DataTokenizer, WordCacheGivesTheSameIds) {
  TempDir dir;
  Tokenizer tok(train_fixture_tokenizer(dir));
  EXPECT_TRUE(tok.word_splittable());
  std::vector<std::string> texts = fixture_texts();
  for (std::string s : {"", " ", "   ", "a", "  lead", "trail  ", "many     spaces   between", "tab\there\tand\tthere",
                        "new\nline \n  and\r\ncrlf", "ctrl\x01char \x7f del", "digits 1 22 333 4444 12345678",
                        "Punct: (a), [b]; {c}! d? e... 'f' \"g\"", "UPPER lower MiXeD", "caf\xc3\xa9 non-ASCII text",
                        "x\xe2\x80\x94y \xe3\x80\x80 wide space"})
    texts.push_back(s);
  WordCache cache(64);  // small: it fills and restarts
  for (int round = 0; round < 2; ++round)
    for (const auto& t : texts) {
      std::vector<int> direct, cached;
      tok.encode(t, direct);
      tok.encode(t, cached, &cache);
      ASSERT_EQ(cached, direct) << "'" << t << "'";
    }
}

// Models for which word-by-word encoding would change the ids must not use it.
TEST(DataTokenizer, WordCacheOffWhenWordsAreNotIndependent) {
  TempDir dir;
  std::string text;
  for (const auto& t : fixture_texts()) text += t + "\n";
  write_text(dir / "gen.txt", text);
  for (auto [flag, value] : {std::pair{"split_by_whitespace", "false"}, std::pair{"remove_extra_whitespaces", "false"},
                             std::pair{"add_dummy_prefix", "false"}, std::pair{"treat_whitespace_as_suffix", "true"}}) {
    std::string prefix = dir / flag;
    auto status = sentencepiece::SentencePieceTrainer::Train(
        {{"input", dir / "gen.txt"}, {"model_prefix", prefix}, {"vocab_size", "400"}, {"model_type", "bpe"},
         {"minloglevel", "2"}, {flag, value}});
    ASSERT_TRUE(status.ok()) << status.ToString();
    Tokenizer tok(prefix + ".model");
    EXPECT_FALSE(tok.word_splittable()) << flag << "=" << value;
    WordCache cache;
    for (const std::string& t : {std::string("In  the beginning   God created"), fixture_texts()[0]}) {
      std::vector<int> direct, cached;
      tok.encode(t, direct);
      tok.encode(t, cached, &cache);
      EXPECT_EQ(cached, direct) << flag;
    }
  }
}

TEST(DataTokenizer, BadModelAndOptions) {
  TempDir dir;
  write_text(dir / "junk.model", "this is not a sentencepiece model");
  expect_input_error([&] { Tokenizer t(dir / "junk.model"); }, {dir / "junk.model", "not a SentencePiece model"});
  expect_input_error([&] { Tokenizer t(dir / "none.model"); }, {dir / "none.model", "no such file"});
  std::string model = train_fixture_tokenizer(dir);
  expect_input_error([&] { Tokenizer t(model, "<nope>"); }, {"no piece \"<nope>\""});
  TokenizerTrainOptions o;
  o.inputs = {fixture("genesis_1_8.jsonl")};
  o.model_prefix = dir / "genesis400";
  o.vocab_size = 400;
  expect_input_error([&] { train_tokenizer(o); }, {"genesis400.model exists", "--overwrite"});
  o.model_prefix = dir / "big";
  o.vocab_size = 100000;
  expect_input_error([&] { train_tokenizer(o); }, {"--vocab-size 100000"});
  EXPECT_FALSE(fs::exists(dir / "big.model"));
  write_text(dir / "empty.txt", "\n\n  \n");
  o.inputs = {dir / "empty.txt"};
  o.vocab_size = 100;
  expect_input_error([&] { train_tokenizer(o); }, {"empty.txt", "no documents"});
  write_text(dir / "bad.jsonl", "{\"text\": \"fine\"}\n{\"txt\": \"no key\"}\n");
  o.inputs = {dir / "bad.jsonl"};
  expect_input_error([&] { train_tokenizer(o); }, {"bad.jsonl:2:", "no key \"text\""});
}

class DataPreprocess : public ::testing::Test {
 protected:
  void SetUp() override { model_ = train_fixture_tokenizer(dir_); }
  PreprocessOptions options(const std::string& input, const std::string& out) {
    PreprocessOptions o;
    o.input = input;
    o.tokenizer_model = model_;
    o.output_prefix = dir_ / out;
    o.block_bytes = 4096;  // many blocks, so the workers interleave
    return o;
  }
  TempDir dir_;
  std::string model_;
};

TEST_F(DataPreprocess, RoundTripEveryDocument) {
  PreprocessOptions o = options(fixture("genesis_1_8.jsonl"), "gen");
  o.workers = 3;
  PreprocessStats st = preprocess(o);
  std::vector<std::string> texts = fixture_texts();
  Tokenizer tok(model_);
  IndexedDataset d(o.output_prefix);
  ASSERT_EQ(d.num_documents(), static_cast<int64_t>(texts.size()));
  EXPECT_EQ(st.documents, d.num_documents());
  EXPECT_EQ(d.num_sequences(), d.num_documents());
  EXPECT_EQ(d.dtype(), TokenDType::U16);
  int64_t tokens = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    std::vector<int> ids;
    tok.encode(texts[i], ids);
    ids.push_back(tok.eod_id());
    EXPECT_EQ(d.document(static_cast<int64_t>(i)), std::vector<int32_t>(ids.begin(), ids.end())) << "document " << i;
    tokens += static_cast<int64_t>(ids.size());
  }
  EXPECT_EQ(d.num_tokens(), tokens);
  EXPECT_EQ(st.tokens, tokens);
}

TEST_F(DataPreprocess, SameBytesForAnyWorkerCountAndTextInput) {
  // The text form: one document per line (JSON-escaped newlines become spaces, which the
  // tokenizer's normalisation treats alike).
  std::string text;
  for (const auto& t : fixture_texts()) {
    std::string line = t;
    std::replace(line.begin(), line.end(), '\n', ' ');
    text += line + "\n";
  }
  write_text(dir_ / "gen.txt", text + "\n   \n");  // trailing blank lines hold no documents
  std::vector<uint8_t> first_bin, first_idx;
  for (int workers : {1, 2, 5}) {
    PreprocessOptions o = options(dir_ / "gen.txt", "w" + std::to_string(workers));
    o.workers = workers;
    PreprocessStats st = preprocess(o);
    EXPECT_EQ(st.documents, 8);
    EXPECT_EQ(st.blank_lines, 2);
    if (workers == 1) {
      first_bin = read_bytes(o.output_prefix + ".bin");
      first_idx = read_bytes(o.output_prefix + ".idx");
    } else {
      EXPECT_EQ(read_bytes(o.output_prefix + ".bin"), first_bin) << workers << " workers";
      EXPECT_EQ(read_bytes(o.output_prefix + ".idx"), first_idx) << workers << " workers";
    }
  }
  PreprocessOptions j = options(fixture("genesis_1_8.jsonl"), "fromjson");
  preprocess(j);
  EXPECT_EQ(read_bytes(j.output_prefix + ".bin"), first_bin);
}

// A tiktoken rank file: the 256 bytes, then a few merged tokens. Named cl100k, it brings
// <|endoftext|> at 100257, so the dataset's tokens are int32.
std::string small_tiktoken() {
  const auto& b64 = test::base64;
  std::string file;
  int rank = 0;
  for (int b = 0; b < 256; ++b) file += b64(std::string(1, static_cast<char>(b))) + " " + std::to_string(rank++) + "\n";
  for (const char* tok : {"th", " t", "he", " the", "in", " a", "nd", " and", "er", "ing", " of", "ed", " God", "ea",
                          "\xc3\xa9", "\xe2\x80"})
    file += b64(tok) + " " + std::to_string(rank++) + "\n";
  return file;
}

// Documents that stress the splitting of the input among workers: blank and whitespace lines,
// CR LF endings, characters of 2 to 4 bytes, lines far longer than a block, and no newline at
// the end. Returns the lines; `docs` gets those that hold a document.
std::vector<std::string> varied_lines(std::vector<std::string>& docs) {
  std::vector<std::string> texts = fixture_texts(), lines;
  for (int rep = 0; rep < 6; ++rep)
    for (size_t i = 0; i < texts.size(); ++i) {
      std::string t = texts[i];
      std::replace(t.begin(), t.end(), '\n', ' ');
      switch ((rep * texts.size() + i) % 7) {
        case 0: t = t.substr(0, 20 + rep); break;
        case 1: t += " caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd 12345"; break;
        case 2: lines.push_back(""); break;
        case 3: lines.push_back(" \t "); break;
        case 4: t = t + " " + t + " " + t; break;
        default: break;
      }
      lines.push_back(t);
    }
  for (const auto& l : lines)
    if (l.find_first_not_of(" \t") != std::string::npos) docs.push_back(l);
  return lines;
}

TEST_F(DataPreprocess, SameBytesAsEncodingOneByOneForAnyWorkersAndBlocks) {
  write_text(dir_ / "cl100k_base.tiktoken", small_tiktoken());
  std::vector<std::string> docs;
  std::vector<std::string> lines = varied_lines(docs);
  std::string text;
  for (size_t i = 0; i < lines.size(); ++i) text += lines[i] + (i + 1 == lines.size() ? "" : i % 5 ? "\n" : "\r\n");
  write_text(dir_ / "varied.txt", text);
  std::string jsonl;
  for (const auto& l : lines) jsonl += nlohmann::json{{"id", 1}, {"text", l}}.dump() + "\n";
  write_text(dir_ / "varied.jsonl", jsonl);

  // The JSONL form's whitespace-only lines are documents (their text is not empty).
  std::vector<std::string> json_docs;
  for (const auto& l : lines)
    if (!l.empty()) json_docs.push_back(l);

  for (const std::string& model : {model_, dir_ / "cl100k_base.tiktoken"}) {
    // The reference: each document encoded alone (no cache), written one by one.
    Tokenizer tok(model);
    const TokenDType dtype = dtype_for_vocab(tok.vocab_size());
    auto reference = [&](const std::vector<std::string>& ds, const std::string& prefix) {
      IndexedDatasetWriter w(prefix, dtype);
      std::vector<int> ids;
      for (const auto& d : ds) {
        tok.encode(d, ids);
        ids.push_back(tok.eod_id());
        w.add_document(std::vector<int32_t>(ids.begin(), ids.end()));
      }
      w.finish();
      return std::make_pair(read_bytes(prefix + ".bin"), read_bytes(prefix + ".idx"));
    };
    const auto text_ref = reference(docs, dir_ / "ref_text"), json_ref = reference(json_docs, dir_ / "ref_json");
    for (const std::string& input : {dir_ / "varied.txt", dir_ / "varied.jsonl"}) {
      const bool jsonl = input.ends_with(".jsonl");
      const auto& want = jsonl ? json_ref : text_ref;
      for (int workers : {1, 2, 3, 8})
        for (size_t block : {size_t{1}, size_t{300}, size_t{1} << 20}) {
          PreprocessOptions o = options(input, "out");
          o.tokenizer_model = model;
          o.overwrite = true;
          o.workers = workers;
          o.block_bytes = block;
          const std::string what = model + " " + input + " workers " + std::to_string(workers) + " block " +
                                   std::to_string(block);
          PreprocessStats st = preprocess(o);
          EXPECT_EQ(st.dtype, dtype) << what;
          EXPECT_EQ(st.workers, workers) << what;
          EXPECT_EQ(st.documents, static_cast<int64_t>(jsonl ? json_docs.size() : docs.size())) << what;
          EXPECT_EQ(st.blank_lines, static_cast<int64_t>(lines.size() - (jsonl ? json_docs.size() : docs.size())))
              << what;
          EXPECT_EQ(st.bytes, static_cast<int64_t>(read_text(input).size())) << what;
          EXPECT_TRUE(read_bytes(o.output_prefix + ".bin") == want.first) << what;
          EXPECT_TRUE(read_bytes(o.output_prefix + ".idx") == want.second) << what;
        }
    }
  }
}

TEST_F(DataPreprocess, BadLineDeepInTheInputNamesItsLineWithManyWorkers) {
  std::vector<std::string> docs;
  std::vector<std::string> lines = varied_lines(docs);
  ASSERT_GT(lines.size(), 40u);
  for (size_t bad : {size_t{0}, size_t{37}, lines.size() - 1}) {
    std::vector<std::string> l = lines;
    l[bad] = "{\"text\": \"fine\"} but \xff not UTF-8";
    std::string text;
    for (const auto& x : l) text += x + "\n";
    write_text(dir_ / "bad.txt", text);
    for (int workers : {1, 3, 8}) {
      PreprocessOptions o = options(dir_ / "bad.txt", "bad");
      o.workers = workers;
      o.block_bytes = 200;
      expect_input_error([&] { preprocess(o); }, {dir_ / ("bad.txt:" + std::to_string(bad + 1) + ":"), "UTF-8"});
      EXPECT_FALSE(fs::exists(o.output_prefix + ".bin"));
      o.skip_bad_lines = true;
      PreprocessStats st = preprocess(o);
      EXPECT_EQ(st.bad_lines, 1);
      const bool bad_was_doc = lines[bad].find_first_not_of(" \t") != std::string::npos;
      EXPECT_EQ(st.documents, static_cast<int64_t>(docs.size()) - (bad_was_doc ? 1 : 0));
      fs::remove(o.output_prefix + ".bin");
      fs::remove(o.output_prefix + ".idx");
    }
  }
}

TEST_F(DataPreprocess, NoEodAndOneTokenDocuments) {
  write_text(dir_ / "short.txt", "a\nGod\nthe\n");
  PreprocessOptions o = options(dir_ / "short.txt", "short");
  o.append_eod = false;
  preprocess(o);
  IndexedDataset d(o.output_prefix);
  Tokenizer tok(model_);
  ASSERT_EQ(d.num_documents(), 3);
  for (int64_t i = 0; i < 3; ++i)
    for (int32_t t : d.document(i)) EXPECT_NE(t, tok.eod_id());
  EXPECT_EQ(tok.decode(d.document(1)), "God");
}

TEST_F(DataPreprocess, BadLinesNameFileAndLine) {
  const std::string good = "{\"text\": \"In the beginning\"}\n";
  struct Case {
    std::string line, what;
  } cases[] = {
      {"{\"text\": \"unterminated\n", "not valid JSON"},
      {"just words\n", "not valid JSON"},
      {"{\"body\": \"x\"}\n", "no key \"text\""},
      {"{\"text\": 42}\n", "holds a number, not a string"},
      {"[1, 2]\n", "must be an object"},
      {"{\"text\": \"caf\xc3\"}\n", "invalid UTF-8"},
      {"{\"text\": \"\xed\xa0\x80 surrogate\"}\n", "invalid UTF-8"},
  };
  int n = 0;
  for (const Case& c : cases) {
    std::string input = dir_ / ("bad" + std::to_string(n) + ".jsonl");
    // The bad line is line 4, after many good lines in other blocks.
    write_text(input, good + good + good + c.line + good);
    PreprocessOptions o = options(input, "out" + std::to_string(n));
    o.workers = 2;
    o.block_bytes = 16;
    expect_input_error([&] { preprocess(o); }, {input + ":4:", c.what});
    EXPECT_FALSE(fs::exists(o.output_prefix + ".bin"));
    EXPECT_FALSE(fs::exists(o.output_prefix + ".idx"));
    o.skip_bad_lines = true;
    PreprocessStats st = preprocess(o);
    EXPECT_EQ(st.bad_lines, 1) << c.line;
    EXPECT_EQ(st.documents, 4) << c.line;
    ++n;
  }
  // Invalid UTF-8 in a text file.
  write_text(dir_ / "bad.txt", "fine\nalso fine\n\xff\xfe bad\n");
  expect_input_error([&] { preprocess(options(dir_ / "bad.txt", "t")); }, {dir_ / "bad.txt:3:", "invalid UTF-8"});
  for (const auto& e : fs::directory_iterator(dir_.path()))
    EXPECT_EQ(e.path().string().find(".tmp-"), std::string::npos) << e.path() << " left behind";
}

TEST_F(DataPreprocess, EmptyInputMissingFilesAndNoOverwrite) {
  write_text(dir_ / "empty.jsonl", "");
  expect_input_error([&] { preprocess(options(dir_ / "empty.jsonl", "e")); }, {"empty.jsonl", "no documents"});
  write_text(dir_ / "blank.txt", "\n \n\t\n");
  expect_input_error([&] { preprocess(options(dir_ / "blank.txt", "e")); }, {"blank.txt", "no documents"});
  expect_input_error([&] { preprocess(options(dir_ / "missing.jsonl", "e")); }, {"missing.jsonl", "no such file"});
  PreprocessOptions o = options(fixture("genesis_1_8.jsonl"), "keep");
  o.tokenizer_model = dir_ / "nope.model";
  expect_input_error([&] { preprocess(o); }, {"nope.model", "no such file"});
  write_text(dir_ / "fake.model", std::string(1000, 'x'));
  o.tokenizer_model = dir_ / "fake.model";
  expect_input_error([&] { preprocess(o); }, {"fake.model", "not a SentencePiece model"});
  o.tokenizer_model = model_;
  preprocess(o);
  auto before = read_bytes(o.output_prefix + ".bin");
  o.input = dir_ / "blank.txt";
  expect_input_error([&] { preprocess(o); }, {"keep.bin exists", "--overwrite"});
  o.overwrite = true;
  expect_input_error([&] { preprocess(o); }, {"no documents"});
  EXPECT_EQ(read_bytes(o.output_prefix + ".bin"), before);  // a failed run replaces nothing
  o.output_prefix = dir_ / "no/such/dir/x";
  o.input = fixture("genesis_1_8.jsonl");
  expect_input_error([&] { preprocess(o); }, {"no/such/dir/x.bin", "cannot create"});
}

TEST(DataDocuments, Utf8Validation) {
  EXPECT_EQ(find_invalid_utf8("plain ascii, long enough for the fast path"), std::string_view::npos);
  EXPECT_EQ(find_invalid_utf8("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"), std::string_view::npos);
  EXPECT_EQ(find_invalid_utf8("ab\x80"), 2u);                  // lone continuation byte
  EXPECT_EQ(find_invalid_utf8("ab\xc0\xaf"), 2u);              // overlong
  EXPECT_EQ(find_invalid_utf8("\xe0\x80\xaf"), 0u);            // overlong 3-byte
  EXPECT_EQ(find_invalid_utf8("x\xed\xa0\x80"), 1u);           // surrogate
  EXPECT_EQ(find_invalid_utf8("\xf4\x90\x80\x80"), 0u);        // above U+10FFFF
  EXPECT_EQ(find_invalid_utf8("abcdefgh\xe2\x82"), 8u);        // truncated at the end
}

// The JSONL reader takes the named key of the line's own object only (not a nested one), its last
// value when the key repeats, and decodes every escape: as nlohmann's parse into an object would.
TEST(DataDocuments, JsonKeyIsTopLevelAndDecodedAsAParsedObjectWouldHaveIt) {
  std::string text, why;
  for (const std::string line : {
           R"({"meta": {"text": "inner"}, "text": "outer", "n": [1, {"text": 2}]})",
           R"({"text": "first", "text": "last"})",
           R"({"text": "esc\"aped \\ \/ \u00e9 \ud83d\ude00 \n\t\r\b\f"})",
           R"( { "id" : 7 , "text" : "spaced" } )",
           R"({"meta": ["text", "no"], "text": "after an array"})",
       }) {
    SCOPED_TRACE(line);
    ASSERT_EQ(extract_document(line, InputFormat::Jsonl, "text", text, why), LineKind::Document) << why;
    EXPECT_EQ(text, nlohmann::json::parse(line)["text"].get<std::string>());
  }
  EXPECT_EQ(extract_document(R"({"id": 3, "text": ""})", InputFormat::Jsonl, "text", text, why), LineKind::Blank);
  struct Bad {
    std::string line, what;
  } bad[] = {
      {R"({"text": {"x": 1}})", "holds an object, not a string"},
      {R"({"text": ["a"]})", "holds an array, not a string"},
      {R"({"text": null})", "holds null, not a string"},
      {R"({"text": true})", "holds a boolean, not a string"},
      {R"({"text": "a", "text": 1.5})", "holds a number, not a string"},
      {R"("just a string")", "must be an object with the document under \"text\", got a string"},
      {R"([{"text": "a"}])", "got an array"},
      {R"({"meta": ["text", "no"]})", "no key \"text\""},
      {R"({"meta": {"text": "nested"}})", "no key \"text\""},
      {R"({"text": "a"} trailing)", "not valid JSON"},
      {R"([1, 2)", "not valid JSON"},
      {R"({"text": "bad escape \x"})", "not valid JSON"},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.line);
    why.clear();
    EXPECT_EQ(extract_document(b.line, InputFormat::Jsonl, "text", text, why), LineKind::Bad);
    EXPECT_NE(why.find(b.what), std::string::npos) << why;
  }
}

// Lines mutated at random from valid ones (edits drawn from JSON's own characters, so most
// mutants are near misses) are read exactly as nlohmann's parse into an object reads them.
TEST(DataDocuments, JsonlLinesAgreeWithAParseIntoAnObject) {
  const std::string seeds[] = {
      R"({"text": "In the beginning God created the heaven and the earth."})",
      R"({"id": 12, "meta": {"text": [1, -2.5e+3, true, false, null, {}]}, "text": "a\u00e9\ud83d\ude00\n\"q\" \\ \/"})",
      R"( {"text":"first","n":0.5E-1,"text" : "last"} )",
      R"({"t\u0065xt": "escaped key", "x": [[[]]], "y": ""})",
      R"({"text": "caf\u00c3 tab\there", "list": ["text", 1e5]})",
  };
  const std::string alphabet = "{}[]\":,\\ \t\r/0123456789-+.eEabfnrtuDdcC\x7f";
  std::mt19937 rng(7);
  int documents = 0, bad = 0;
  for (int i = 0; i < 40000; ++i) {
    std::string line = seeds[rng() % std::size(seeds)];
    for (int edits = 1 + static_cast<int>(rng() % 3); edits > 0; --edits) {
      const size_t at = rng() % (line.size() + 1);
      const char c = alphabet[rng() % alphabet.size()];
      switch (rng() % 3) {
        case 0:
          line.insert(at, 1, c);
          break;
        case 1:
          if (at < line.size()) line.erase(at, 1);
          break;
        default:
          if (at < line.size()) line[at] = c;
      }
    }
    std::string text, why, want;
    const LineKind got = extract_document(line, InputFormat::Jsonl, "text", text, why);
    const LineKind expected = test::reference_jsonl_line(line, "text", want);
    ASSERT_EQ(static_cast<int>(got), static_cast<int>(expected)) << line << "\nwhy: " << why;
    if (got == LineKind::Document) {
      ASSERT_EQ(text, want) << line;
    }
    if (got == LineKind::Bad) {
      ASSERT_FALSE(why.empty()) << line;
    }
    documents += got == LineKind::Document;
    bad += got == LineKind::Bad;
  }
  // Both outcomes are common, so neither side of the reader goes untested.
  EXPECT_GT(documents, 4000);
  EXPECT_GT(bad, 4000);
}

TEST(DataDocuments, BlockReaderKeepsLinesWholeAndCountsThem) {
  TempDir dir;
  std::string text;
  for (int i = 1; i <= 500; ++i) text += "line " + std::to_string(i) + (i % 3 ? "\n" : "\r\n");
  text += "last line without a newline";
  write_text(dir / "lines.txt", text);
  for (size_t block : {size_t{1}, size_t{7}, size_t{64}, size_t{1} << 20}) {
    BlockReader r(dir / "lines.txt", block);
    std::string b;
    int64_t first = 0, expect_line = 1;
    std::vector<std::string> lines;
    while (r.next(b, first)) {
      EXPECT_EQ(first, expect_line) << "block size " << block;
      for_each_line(b, [&](std::string_view l) {
        lines.emplace_back(l);
        ++expect_line;
      });
    }
    ASSERT_EQ(lines.size(), 501u) << "block size " << block;
    EXPECT_EQ(lines[0], "line 1");
    EXPECT_EQ(lines[2], "line 3");  // the \r of \r\n dropped
    EXPECT_EQ(lines[499], "line 500");
    EXPECT_EQ(lines[500], "last line without a newline");
    EXPECT_EQ(r.bytes_read(), static_cast<int64_t>(text.size()));
  }
  // A line far longer than a block arrives whole (read sizes double: no quadratic rescans).
  std::string long_line(8 << 20, 'x');
  write_text(dir / "long.txt", "a\n" + long_line + "\nb\n");
  BlockReader r(dir / "long.txt", 16);
  std::vector<size_t> sizes;
  std::string b;
  int64_t first = 0;
  while (r.next(b, first)) for_each_line(b, [&](std::string_view l) { sizes.push_back(l.size()); });
  EXPECT_EQ(sizes, (std::vector<size_t>{1, long_line.size(), 1}));
}

}  // namespace
}  // namespace tripod
