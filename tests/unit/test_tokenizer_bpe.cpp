// Byte-level BPE on small hand-made vocabularies: the byte table, the merge order, the three
// readers and their refusals, pre-tokenization, the caches, streamed decoding, and the
// checkpoint's tokenizer record. (Real vocabularies against the reference implementations:
// tests/tokenizer/compare.sh.)
#include <gtest/gtest.h>

#include <random>
#include <set>

#include "core/error.h"
#include "input_error.h"
#include "data/bpe.h"
#include "data/nfc.h"
#include "data/regex_splitter.h"
#include "data/tokenizer.h"
#include "test_data_helpers.h"
#include "test_util.h"

namespace tripod {
namespace {

using namespace tripod::testing;
using nlohmann::json;

std::string bl(std::string_view bytes) {
  std::string s;
  for (unsigned char c : bytes) s += byte_level_char(c);
  return s;
}

// 256 byte tokens (ids 0..255 in byte order), then one token per merge, then <|endoftext|>.
struct SmallVocab {
  json vocab = json::object();
  std::vector<std::string> merges;  // "A B" in the byte table
  int next = 256;
  SmallVocab(const std::vector<std::pair<std::string, std::string>>& pairs) {
    for (int b = 0; b < 256; ++b) vocab[bl(std::string(1, static_cast<char>(b)))] = b;
    for (const auto& [a, b] : pairs) {
      vocab[bl(a + b)] = next++;
      merges.push_back(bl(a) + " " + bl(b));
    }
    vocab["<|endoftext|>"] = next++;
  }
  std::string merges_txt() const {
    std::string s = "#version: 0.2\n";
    for (const auto& m : merges) s += m + "\n";
    return s;
  }
  int id(const std::string& bytes) const { return vocab.at(bl(bytes)).get<int>(); }
};

const std::vector<std::pair<std::string, std::string>> kPairs = {
    {" ", "t"}, {"h", "e"}, {" t", "he"}, {"i", "n"}, {"in", "g"}, {"a", "a"}, {"aa", "aa"}, {"'", "s"}, {"e", "r"}};

BpeModel small_gpt2() {
  SmallVocab v(kPairs);
  return BpeModel::from_gpt2(v.vocab.dump(), "vocab.json", v.merges_txt(), "merges.txt");
}

std::vector<int> encode(const BpeModel& m, std::string_view text, bool specials = false) {
  BpeScratch s;
  std::vector<int> ids;
  m.encode(text, ids, s, specials);
  return ids;
}

std::string decode(const BpeModel& m, const std::vector<int>& ids) {
  std::string out;
  for (int id : ids) m.decode_append(id, out);
  return out;
}

using test::expect_input_error;

TEST(BpeByteTable, EveryByteIsOneCharacterAndComesBack) {
  std::set<std::string> seen;
  for (int b = 0; b < 256; ++b) {
    const std::string c = byte_level_char(static_cast<uint8_t>(b));
    EXPECT_TRUE(seen.insert(c).second) << b;
    std::string back;
    ASSERT_TRUE(byte_level_decode(c, back));
    EXPECT_EQ(back, std::string(1, static_cast<char>(b)));
  }
  // GPT-2's table: printable bytes are themselves; space is U+0120 (Ġ), newline U+010A (Ċ).
  EXPECT_EQ(byte_level_char('a'), "a");
  EXPECT_EQ(byte_level_char(' '), "\xC4\xA0");
  EXPECT_EQ(byte_level_char('\n'), "\xC4\x8A");
  EXPECT_EQ(byte_level_char(0xAD), "\xC5\x83");  // the soft hyphen is shifted (U+0143), the last of the 68
  std::string out;
  EXPECT_FALSE(byte_level_decode("\xE5\xA4\xA9", out));  // a CJK character is not in the table
}

TEST(BpeModel, MergesInRankOrder) {
  SmallVocab v(kPairs);
  BpeModel m = small_gpt2();
  // " the": " "+"t" (rank 0) and "h"+"e" (rank 1), then " t"+"he" (rank 2): one token.
  EXPECT_EQ(encode(m, " the"), std::vector<int>({v.id(" the")}));
  // "thing" -> t h in g: "h e" never forms; i+n, then in+g.
  EXPECT_EQ(encode(m, "thing"), std::vector<int>({v.id("t"), v.id("h"), v.id("ing")}));
  // "aaaaa": a+a at the leftmost pair first, then aa+aa: "aaaa" "a".
  EXPECT_EQ(encode(m, "aaaaa"), std::vector<int>({v.id("aaaa"), v.id("a")}));
  // GPT-2's pattern: contractions, space-prefixed words, digits, whitespace runs.
  EXPECT_EQ(encode(m, "it's"), std::vector<int>({v.id("i"), v.id("t"), v.id("'s")}));
  EXPECT_EQ(decode(m, encode(m, "Hello  world\n\n 123 it's")), "Hello  world\n\n 123 it's");
  EXPECT_EQ(m.vocab_size(), v.next);
  EXPECT_EQ(m.default_eod(), v.vocab["<|endoftext|>"].get<int>());
}

TEST(BpeModel, SpecialTokensOnlyWhenAsked) {
  BpeModel m = small_gpt2();
  const int eot = m.default_eod();
  const std::vector<int> plain = encode(m, "a<|endoftext|>b"), special = encode(m, "a<|endoftext|>b", true);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), eot), 0);
  EXPECT_EQ(special.size(), 3u);
  EXPECT_EQ(special[1], eot);
  EXPECT_EQ(decode(m, plain), "a<|endoftext|>b");
  EXPECT_EQ(decode(m, special), "a<|endoftext|>b");
}

TEST(BpeModel, HeapAndScanMergeAlike) {
  // Long pieces are merged with a heap, short ones by scanning: the same ids on random text
  // over a small alphabet (long runs, many equal-rank pairs).
  SmallVocab v(kPairs);
  BpeModel scan = BpeModel::from_gpt2(v.vocab.dump(), "vocab.json", v.merges_txt(), "merges.txt");
  BpeModel heap = BpeModel::from_gpt2(v.vocab.dump(), "vocab.json", v.merges_txt(), "merges.txt");
  scan.scan_limit = 1 << 20;
  heap.scan_limit = 0;
  std::mt19937 rng(7);
  const std::string alphabet = "aaaathinge'sr ";
  for (int t = 0; t < 200; ++t) {
    std::string text;
    const int n = 1 + static_cast<int>(rng() % 300);
    for (int i = 0; i < n; ++i) text += alphabet[rng() % alphabet.size()];
    const auto a = encode(scan, text), b = encode(heap, text);
    ASSERT_EQ(a, b) << text;
    ASSERT_EQ(decode(scan, a), text);
  }
}

TEST(BpeModel, WordCacheGivesTheSameIds) {
  BpeModel m = small_gpt2();
  BpeScratch cached(4, true), uncached(0, false);  // a small cache: it fills and starts over
  const std::string text = "the thing is the thing, aaaa the the thing's\n";
  for (int i = 0; i < 5; ++i) {
    std::vector<int> a, b;
    m.encode(text + std::to_string(i), a, cached, false);
    m.encode(text + std::to_string(i), b, uncached, false);
    ASSERT_EQ(a, b);
  }
}

TEST(BpeModel, TiktokenRanksMergeByTheMergedTokensRank) {
  // Ranks: the 256 bytes, then "ab" (256), "bc" (257), "abc" (258). "abc" is reachable from
  // "ab"+"c" and from "a"+"bc"; tiktoken looks the whole piece up first.
  const auto& b64 = test::base64;
  std::string file;
  for (int b = 0; b < 256; ++b) file += b64(std::string(1, static_cast<char>(b))) + " " + std::to_string(b) + "\n";
  file += b64("ab") + " 256\n" + b64("bc") + " 257\n" + b64("abc") + " 258\n" + b64("bcd") + " 259\n";
  BpeModel m = BpeModel::from_tiktoken(file, "test.tiktoken", "\\S+|\\s+");
  EXPECT_EQ(encode(m, "abc"), std::vector<int>({258}));
  // "abcd": ab(256) < bc(257): ab, then "ab"+"c" makes abc(258) ... and "abc"+"d" is no token.
  EXPECT_EQ(encode(m, "abcd"), std::vector<int>({258, 'd'}));
  EXPECT_EQ(encode(m, "bcd"), std::vector<int>({259}));
  EXPECT_EQ(decode(m, encode(m, "zabcd abc\n")), "zabcd abc\n");
  // Named patterns bring their special tokens; the file name names the pattern.
  BpeModel named = BpeModel::from_tiktoken(file, "dir/cl100k_base.tiktoken", "");
  EXPECT_EQ(named.pattern_description(), "cl100k");
  EXPECT_EQ(named.default_eod(), 100257);
  EXPECT_EQ(named.vocab_size(), 100277);
  EXPECT_FALSE(named.has_token(100256));
  expect_input_error([&] { BpeModel::from_tiktoken(file, "ranks.tiktoken", ""); }, {"ranks.tiktoken", "pattern"});
  expect_input_error([&] { BpeModel::from_tiktoken(file, "r.tiktoken", "(unclosed"); }, {"r.tiktoken", "compile"});
  expect_input_error([&] { BpeModel::from_tiktoken(file + "QQ=Q 260\n", "r.tiktoken", "cl100k"); },
                     {"r.tiktoken:261", "bad base64", "QQ=Q"});
  expect_input_error([&] { BpeModel::from_tiktoken(file + "QUJD -3\n", "r.tiktoken", "cl100k"); },
                     {"r.tiktoken:261", "rank"});
  expect_input_error([&] { BpeModel::from_tiktoken(file + "QUJD\n", "r.tiktoken", "cl100k"); },
                     {"r.tiktoken:261", "BASE64 RANK"});
  expect_input_error([&] { BpeModel::from_tiktoken(file + "QUJD 7\n", "r.tiktoken", "cl100k"); },
                     {"r.tiktoken:261", "id 7"});
  expect_input_error([&] { BpeModel::from_tiktoken(b64("a") + " 0\n", "r.tiktoken", "cl100k"); },
                     {"r.tiktoken", "byte 0x00"});
}

TEST(BpeModel, Gpt2FilesRefusals) {
  SmallVocab v(kPairs);
  const std::string merges = v.merges_txt();
  expect_input_error([&] { BpeModel::from_gpt2("[1, 2]", "v.json", merges, "m.txt"); }, {"v.json", "object"});
  expect_input_error([&] { BpeModel::from_gpt2("{\"a\": \"x\"}", "v.json", merges, "m.txt"); },
                     {"v.json", "'a'", "integer"});
  expect_input_error([&] { BpeModel::from_gpt2("{\"a\": -1}", "v.json", merges, "m.txt"); }, {"v.json", "-1"});
  expect_input_error([&] { BpeModel::from_gpt2("{\"a\": 1, \"b\": 1}", "v.json", "", "m.txt"); },
                     {"v.json", "id 1"});
  expect_input_error([&] { BpeModel::from_gpt2("{nope", "v.json", merges, "m.txt"); }, {"v.json", "not JSON"});
  expect_input_error([&] { BpeModel::from_gpt2(v.vocab.dump(), "v.json", merges + "zz qq\n", "m.txt"); },
                     {"m.txt:11", "'zz'", "v.json"});
  expect_input_error([&] { BpeModel::from_gpt2(v.vocab.dump(), "v.json", merges + "x y z\n", "m.txt"); },
                     {"m.txt:11", "not a merge"});
  expect_input_error([&] { BpeModel::from_gpt2(v.vocab.dump(), "v.json", merges + "x y\n", "m.txt"); },
                     {"m.txt:11", "not in v.json"});
}

json hf_json(const SmallVocab& v) {
  return {{"version", "1.0"},
          {"added_tokens", json::array({{{"id", v.vocab["<|endoftext|>"]}, {"content", "<|endoftext|>"},
                                          {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                                          {"normalized", true}, {"special", true}}})},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
          {"post_processor", nullptr},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"vocab", v.vocab},
                     {"merges", v.merges}}}};
}

TEST(BpeModel, HuggingFaceJsonLikeGpt2Files) {
  SmallVocab v(kPairs);
  BpeModel files = small_gpt2();
  json j = hf_json(v);
  BpeModel hf = BpeModel::from_hf_json(j.dump(), "tokenizer.json");
  const std::string text = "the thing's aaaaa\n\n  in  ing";
  EXPECT_EQ(encode(hf, text), encode(files, text));
  // Merges as pairs, Split + ByteLevel(use_regex false) with the same pattern: the same ids.
  json pairs = j;
  pairs["model"]["merges"] = json::array();
  for (const auto& m : v.merges) pairs["model"]["merges"].push_back({m.substr(0, m.find(' ')), m.substr(m.find(' ') + 1)});
  pairs["pre_tokenizer"] = {{"type", "Sequence"},
                            {"pretokenizers",
                             {{{"type", "Split"},
                               {"pattern", {{"Regex", "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"}}},
                               {"behavior", "Isolated"}, {"invert", false}},
                              {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  EXPECT_EQ(encode(BpeModel::from_hf_json(pairs.dump(), "t.json"), text), encode(files, text));
  // add_prefix_space: " the" for "the".
  json prefix = j;
  prefix["pre_tokenizer"]["add_prefix_space"] = true;
  EXPECT_EQ(encode(BpeModel::from_hf_json(prefix.dump(), "t.json"), "the"), std::vector<int>({v.id(" the")}));
  // ignore_merges: a piece that is a token is that token, even where the merges would not make it.
  json ignore = j;
  ignore["model"]["vocab"][bl("thi")] = 400;
  EXPECT_EQ(encode(BpeModel::from_hf_json(ignore.dump(), "t.json"), "thi").size(), 3u);
  ignore["model"]["ignore_merges"] = true;
  EXPECT_EQ(encode(BpeModel::from_hf_json(ignore.dump(), "t.json"), "thi"), std::vector<int>({400}));
}

TEST(BpeModel, HuggingFaceByteFallbackAndUnk) {
  SmallVocab v({});
  json j = hf_json(v);
  json vocab = json::object();
  for (int b = 0; b < 128; ++b) vocab[bl(std::string(1, static_cast<char>(b)))] = b;
  for (int b = 0; b < 256; ++b) vocab[fmt::format("<0x{:02X}>", b)] = 1000 + b;
  vocab["<unk>"] = 2000;
  j["model"]["vocab"] = vocab;
  j["model"]["merges"] = json::array();
  j["added_tokens"] = json::array();
  j["model"]["unk_token"] = "<unk>";
  // "é" is two bytes the vocabulary lacks: byte fallback gives <0xC3> <0xA9>.
  j["model"]["byte_fallback"] = true;
  EXPECT_EQ(encode(BpeModel::from_hf_json(j.dump(), "t.json"), "a\xC3\xA9"), std::vector<int>({'a', 1000 + 0xC3, 1000 + 0xA9}));
  j["model"]["byte_fallback"] = false;
  EXPECT_EQ(encode(BpeModel::from_hf_json(j.dump(), "t.json"), "a\xC3\xA9"), std::vector<int>({'a', 2000, 2000}));
  j["model"]["fuse_unk"] = true;
  EXPECT_EQ(encode(BpeModel::from_hf_json(j.dump(), "t.json"), "a\xC3\xA9"), std::vector<int>({'a', 2000}));
}

TEST(Nfc, ComposesReordersAndKeepsWhatIsNotUtf8) {
  if (!nfc_available()) GTEST_SKIP() << "built without ICU (TRIPOD_ICU=OFF)";
  std::string out;
  nfc_normalize("plain ASCII", out);
  EXPECT_EQ(out, "plain ASCII");
  // e + COMBINING ACUTE ACCENT -> U+00E9; Hangul jamo L V T -> one syllable (U+D55C).
  nfc_normalize("cafe\u0301 \u1112\u1161\u11ab", out);
  EXPECT_EQ(out, "caf\u00e9 \ud55c");
  // Canonical order: dot below (ccc 220) before dot above (ccc 230); q has no precomposed form
  // with either, so the marks are only reordered.
  nfc_normalize("q\u0307\u0323", out);
  EXPECT_EQ(out, "q\u0323\u0307");
  // Singletons go to their canonical forms: OHM SIGN -> GREEK CAPITAL OMEGA, ANGSTROM -> A-ring.
  nfc_normalize("\u2126 \u212b", out);
  EXPECT_EQ(out, "\u03a9 \u00c5");
  // Already NFC (precomposed, CJK, emoji): unchanged.
  const std::string stable = "\u00e9t\u00e9 \u4e2d\u6587 \U0001F44D\U0001F3FD";
  nfc_normalize(stable, out);
  EXPECT_EQ(out, stable);
  // Bytes that are not UTF-8 pass through; the text around them is normalized.
  nfc_normalize("e\u0301\xff e\u0301\xc3", out);
  EXPECT_EQ(out, "\u00e9\xff \u00e9\xc3");
  EXPECT_TRUE(nfc_quick_yes("abc \u00e9\u00ff\u02ff"));
  EXPECT_FALSE(nfc_quick_yes("e\u0301"));
}

// A tokenizer.json "NFC" normalizer (Qwen 2's): text is composed before it is split, so a
// decomposed and a precomposed spelling give the same ids; added tokens that are not
// "normalized" are found in the text as given, the "normalized" ones after normalization.
TEST(BpeModel, HuggingFaceNfcNormalizer) {
  if (!nfc_available()) GTEST_SKIP() << "built without ICU (TRIPOD_ICU=OFF)";
  SmallVocab v({{"\xc3", "\xa9"}, {"t", "\xc3\xa9"}});
  json j = hf_json(v);
  j["normalizer"] = {{"type", "NFC"}};
  const BpeModel m = BpeModel::from_hf_json(j.dump(), "qwen/tokenizer.json");
  EXPECT_TRUE(m.normalizes_nfc());
  EXPECT_NE(m.pattern_description().find("NFC"), std::string::npos) << m.pattern_description();
  const std::vector<int> composed = encode(m, "t\u00e9");
  EXPECT_EQ(composed, std::vector<int>({v.id("t\xc3\xa9")}));
  EXPECT_EQ(encode(m, "te\u0301"), composed);
  // Without the normalizer the decomposed spelling is other bytes, other ids.
  EXPECT_NE(encode(BpeModel::from_hf_json(hf_json(v).dump(), "t.json"), "te\u0301"), composed);
  // Special tokens: "<|endoftext|>" is normalized (true in hf_json); add one that is not, whose
  // content is not NFC: it is found only where the text spells it exactly so.
  j["added_tokens"].push_back({{"id", 600}, {"content", "<e\u0301>"}, {"normalized", false}, {"special", true}});
  j["added_tokens"].push_back({{"id", 601}, {"content", "[\u212b]"}, {"normalized", true}, {"special", false}});
  const BpeModel s = BpeModel::from_hf_json(j.dump(), "qwen/tokenizer.json");
  EXPECT_EQ(encode(s, "<e\u0301>", true), std::vector<int>({600}));
  EXPECT_NE(encode(s, "<\u00e9>", true), std::vector<int>({600}));
  // A normalized token's content is normalized too: "[\u212b]" and "[\u00c5]" both find it.
  EXPECT_EQ(encode(s, "[\u212b]", true), std::vector<int>({601}));
  EXPECT_EQ(encode(s, "[\u00c5]", true), std::vector<int>({601}));
  EXPECT_EQ(encode(s, "<|endoftext|>t\u00e9", true), std::vector<int>({v.id("<|endoftext|>"), v.id("t\xc3\xa9")}));
  // NFC runs on the text between raw-matched tokens: a mark after one stays a lone mark.
  EXPECT_EQ(encode(s, "<e\u0301>\u0301", true), std::vector<int>({600, 0xCC, 0x81}));
}

TEST(BpeModel, HuggingFaceRefusalsNameTheField) {
  SmallVocab v(kPairs);
  const json j = hf_json(v);
  auto refused = [&](const std::function<void(json&)>& edit, const std::vector<std::string>& parts) {
    json e = j;
    edit(e);
    expect_input_error([&] { BpeModel::from_hf_json(e.dump(), "tok/tokenizer.json"); }, parts);
  };
  refused([](json& e) { e["model"]["type"] = "WordPiece"; }, {"tok/tokenizer.json", "model.type", "WordPiece"});
  refused([](json& e) { e["model"]["type"] = "Unigram"; }, {"model.type", "Unigram"});
  refused([](json& e) { e["normalizer"] = {{"type", "NFKC"}}; }, {"normalizer.type", "NFKC"});
  refused([](json& e) { e["normalizer"] = {{"type", "NFD"}}; }, {"normalizer.type", "NFD", "NFC"});
  refused([](json& e) {
    e["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}, {{"type", "Lowercase"}}}}};
  }, {"normalizer.type", "Sequence"});
  refused([](json& e) { e["pre_tokenizer"] = {{"type", "Whitespace"}}; }, {"pre_tokenizer.type", "Whitespace"});
  refused([](json& e) { e["pre_tokenizer"] = nullptr; }, {"pre_tokenizer"});
  refused([](json& e) {
    e["pre_tokenizer"] = {{"type", "Sequence"},
                          {"pretokenizers", {{{"type", "ByteLevel"}}, {{"type", "Digits"}}}}};
  }, {"pre_tokenizer.pretokenizers[1]", "Digits"});
  refused([](json& e) {
    e["pre_tokenizer"] = {{"type", "Sequence"},
                          {"pretokenizers", {{{"type", "Split"}, {"pattern", {{"Regex", "\\s+"}}}, {"behavior", "Removed"}},
                                             {{"type", "ByteLevel"}}}}};
  }, {"pre_tokenizer.pretokenizers[0].behavior", "Removed"});
  refused([](json& e) { e["decoder"] = {{"type", "WordPiece"}}; }, {"decoder.type"});
  refused([](json& e) { e["model"]["vocab"] = json::array(); }, {"model.vocab"});
  refused([](json& e) { e["model"]["vocab"]["x"] = "seven"; }, {"model.vocab['x']", "integer"});
  refused([](json& e) { e["model"]["merges"].push_back("nope nah"); }, {"model.merges[9]", "'nope'"});
  refused([](json& e) { e["model"]["merges"].push_back(42); }, {"model.merges[9]"});
  refused([](json& e) { e["model"]["dropout"] = 0.1; }, {"model.dropout"});
  refused([](json& e) { e["model"]["continuing_subword_prefix"] = "##"; }, {"model.continuing_subword_prefix"});
  refused([](json& e) { e["added_tokens"][0]["lstrip"] = true; }, {"added_tokens[0].lstrip"});
  refused([](json& e) { e["model"].erase("merges"); }, {"model.merges"});
  expect_input_error([] { BpeModel::from_hf_json("[1]", "t.json"); }, {"t.json"});
  expect_input_error([] { BpeModel::from_hf_json("{", "t.json"); }, {"t.json", "not JSON"});
}

TEST(RegexSplitter, PiecesCoverTheTextAndLookaheadWorks) {
  RegexSplitter re("\\s+(?!\\S)|\\s+|\\S+", "test");
  RegexScratch s = re.make_scratch();
  std::vector<std::string> pieces;
  // Invalid UTF-8 never matches: it travels in the runs between matches.
  const std::string text = "a   b\xff\xfe c  ";
  re.split(text, s, [&](std::string_view p) { pieces.emplace_back(p); });
  std::string joined;
  for (const auto& p : pieces) joined += p;
  EXPECT_EQ(joined, text);
  // "\s+(?!\S)" leaves the last space of a run for the next word (GPT-2's " b").
  EXPECT_EQ(pieces[0], "a");
  EXPECT_EQ(pieces[1], "  ");
  EXPECT_EQ(pieces.back(), "  ");
  // A long whitespace run does not overflow the JIT stack: all but its last space, then " ", "x".
  std::vector<std::string> big;
  re.split(std::string(1 << 20, ' ') + "x", s, [&](std::string_view p) { big.emplace_back(p); });
  ASSERT_EQ(big.size(), 3u);
  EXPECT_EQ(big[0].size(), (1u << 20) - 1);
  EXPECT_EQ(big[2], "x");
  expect_input_error([] { RegexSplitter bad("(", "data.tokenizer_pattern"); }, {"data.tokenizer_pattern"});
}

class TokenizerFilesTest : public ::testing::Test {
 protected:
  TempDir dir_;
  SmallVocab v_{kPairs};
  void write_gpt2(const std::string& folder, const std::string& prefix = "") {
    std::filesystem::create_directories(dir_ / folder);
    write_text(dir_ / (folder + "/" + prefix + "vocab.json"), v_.vocab.dump());
    write_text(dir_ / (folder + "/" + prefix + "merges.txt"), v_.merges_txt());
  }
};

TEST_F(TokenizerFilesTest, DetectsEveryKindAndEncodesAlike) {
  write_gpt2("gpt2");
  write_gpt2("megatron", "gpt2-");
  std::filesystem::create_directories(dir_ / "hf");
  write_text(dir_ / "hf/tokenizer.json", hf_json(v_).dump());
  Tokenizer folder(dir_ / "gpt2"), file(dir_ / "gpt2/vocab.json"), megatron(dir_ / "megatron/gpt2-vocab.json"),
      hf(dir_ / "hf"), hf_file(dir_ / "hf/tokenizer.json");
  EXPECT_EQ(folder.kind(), "gpt2-bpe");
  EXPECT_EQ(hf.kind(), "hf-bpe");
  EXPECT_EQ(folder.fingerprint(), file.fingerprint());
  EXPECT_EQ(folder.fingerprint(), megatron.fingerprint());
  EXPECT_NE(folder.fingerprint(), hf.fingerprint());
  EXPECT_EQ(Tokenizer::identify(dir_ / "hf").fingerprint, hf.fingerprint());
  const std::string text = "the thing's aaaaa\n  ing";
  std::vector<int> a, b, c;
  WordCache cache;
  folder.encode(text, a);
  hf.encode(text, b, &cache);
  megatron.encode(text, c, &cache);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a, c);
  EXPECT_EQ(folder.decode(a), text);
  EXPECT_EQ(folder.eod_id(), v_.vocab["<|endoftext|>"].get<int>());
  EXPECT_EQ(Tokenizer(dir_ / "gpt2", "aaaa").eod_id(), v_.id("aaaa"));
  expect_input_error([&] { Tokenizer t(dir_ / "gpt2", "<|nope|>"); }, {"<|nope|>"});
  expect_input_error([&] { Tokenizer t(dir_ / "gpt2", "", "cl100k"); }, {"cl100k", "tiktoken"});
  std::filesystem::remove(dir_ / "megatron/gpt2-merges.txt");
  expect_input_error([&] { Tokenizer t(dir_ / "megatron/gpt2-vocab.json"); }, {"gpt2-merges.txt", "no such file"});
  expect_input_error([&] { Tokenizer t(dir_.path()); }, {dir_.path(), "tokenizer.json"});
  // Ids the files do not define are refused on decoding.
  const std::vector<int32_t> outside = {static_cast<int32_t>(folder.vocab_size())};
  expect_input_error([&] { folder.decode(outside); }, {"outside the vocabulary"});
}

TEST_F(TokenizerFilesTest, CheckpointRecordRefusesAnotherTokenizer) {
  write_gpt2("a");
  write_gpt2("b");
  write_text(dir_ / "b/merges.txt", v_.merges_txt() + bl("t") + " " + bl("h") + "\n");
  const json rec = tokenizer_record(dir_ / "a", "");
  EXPECT_EQ(rec["kind"], "gpt2-bpe");
  EXPECT_EQ(rec["fingerprint"], Tokenizer(dir_ / "a").fingerprint());
  check_tokenizer_record(rec, Tokenizer::identify(dir_ / "a"), dir_ / "a", "ck/iter_1");  // the same: accepted
  const auto other = Tokenizer::identify(dir_ / "b");
  expect_input_error([&] { check_tokenizer_record(rec, other, dir_ / "b", "ck/iter_1"); },
                     {"ck/iter_1", other.fingerprint, rec["fingerprint"].get<std::string>(), dir_ / "a", dir_ / "b"});
  EXPECT_TRUE(tokenizer_record("", "").is_null());
  EXPECT_TRUE(tokenizer_record(dir_ / "gone", "").contains("error"));
  check_tokenizer_record(json(nullptr), other, dir_ / "b", "ck");  // no record: nothing to check
}

TEST_F(TokenizerFilesTest, DecodeStreamHoldsPartialCharacters) {
  write_gpt2("gpt2");
  Tokenizer tok(dir_ / "gpt2");
  // "é👍x": byte tokens, so the stream sees characters arrive one byte at a time.
  const std::string text = "\xC3\xA9\xF0\x9F\x91\x8Dx";
  std::vector<int> ids;
  tok.encode(text, ids);
  ASSERT_EQ(ids.size(), text.size());
  DecodeStream stream(tok, {});
  std::vector<std::string> out = {stream.start()};
  for (int id : ids) out.push_back(stream.push(id));
  out.push_back(stream.finish());
  EXPECT_EQ(out, std::vector<std::string>({"", "", "\xC3\xA9", "", "", "", "\xF0\x9F\x91\x8D", "x", ""}));
  // A character never completed comes out at the end, as it is.
  DecodeStream cut(tok, {});
  EXPECT_EQ(cut.push(ids[2]), "");
  EXPECT_EQ(cut.push(ids[3]), "");
  EXPECT_EQ(cut.finish(), "\xF0\x9F");
}

}  // namespace
}  // namespace tripod
