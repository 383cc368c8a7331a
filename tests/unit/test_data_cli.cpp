// The `tripod data` commands through the built executable: the whole path from JSONL to a
// dataset a training run reads, and every bad input ending with exit status 2 and one
// "error:" line naming the file and the fault.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include <algorithm>

#include "data/indexed_dataset.h"
#include "test_data_helpers.h"

namespace tripod {
namespace {

using namespace tripod::testing;

// Exit status 2 and one "error:" line holding every part; with `only`, nothing else on stderr.
void expect_error(const CliResult& r, const std::vector<std::string>& parts, bool only = true) {
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
  size_t at = r.err.rfind("\nerror: ");
  at = r.err.rfind("error: ", 0) == 0 ? 0 : at == std::string::npos ? at : at + 1;
  ASSERT_NE(at, std::string::npos) << r.err;
  if (only) {
    EXPECT_EQ(at, 0u) << r.err;
  }
  std::string line = r.err.substr(at);
  EXPECT_EQ(std::count(line.begin(), line.end(), '\n'), 1) << "one line: " << line;
  for (const auto& p : parts) EXPECT_NE(line.find(p), std::string::npos) << "'" << p << "' not in: " << line;
}

class DataCli : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(tripod::test::tripod_bin())) << tripod::test::tripod_bin();
  }
  CliResult run(const std::string& args) { return run_tripod(args, dir_); }
  // Tokenizer and dataset from the Genesis fixture.
  void make_dataset() {
    CliResult r = run("data train-tokenizer --input " + quote(fixture("genesis_1_8.jsonl")) +
                      " --vocab-size 400 --model-prefix " + quote(dir_ / "tok"));
    ASSERT_EQ(r.status, 0) << r.err;
    r = run("data preprocess --input " + quote(fixture("genesis_1_8.jsonl")) + " --tokenizer-model " +
            quote(dir_ / "tok.model") + " --output-prefix " + quote(dir_ / "gen") + " --workers 2");
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_TRUE(r.out.empty());
  }
  TempDir dir_;
};

TEST_F(DataCli, TokenizePreprocessInspect) {
  make_dataset();
  CliResult r = run("data inspect " + quote(dir_ / "gen") + " --json");
  ASSERT_EQ(r.status, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);  // exactly one JSON object on stdout
  EXPECT_EQ(j["dtype"], "uint16");
  EXPECT_EQ(j["documents"], 8);
  EXPECT_EQ(j["sequences"], 8);
  EXPECT_GT(j["tokens"].get<int64_t>(), 3000);
  // Document lengths, as packing sees them: the mean, and the nearest-rank p50 and p99 (of 8
  // documents: the 4th and the 8th shortest).
  std::vector<int64_t> lengths;
  {
    IndexedDataset d(dir_ / "gen");
    for (int64_t i = 0; i < d.num_documents(); ++i) lengths.push_back(d.document_tokens(i));
  }
  std::sort(lengths.begin(), lengths.end());
  EXPECT_DOUBLE_EQ(j["document_tokens"]["mean"].get<double>(), j["tokens"].get<double>() / 8);
  EXPECT_EQ(j["document_tokens"]["p50"].get<int64_t>(), lengths[3]);
  EXPECT_EQ(j["document_tokens"]["p99"].get<int64_t>(), lengths[7]);
  r = run("data inspect " + quote(dir_ / "gen") + " --json --tokenizer-model " + quote(dir_ / "tok.model") +
          " --show-document 0");
  ASSERT_EQ(r.status, 0) << r.err;
  j = nlohmann::json::parse(r.out);
  std::string text = j["document"]["text"];
  EXPECT_EQ(text.rfind("Genesis 1 In the beginning God created the heaven and the earth.", 0), 0u) << text;
  EXPECT_EQ(j["document"]["ids"].back(), 2);  // the end-of-document token
  r = run("data inspect " + quote(dir_ / "gen"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("documents  8"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(fmt::format("p50 {}  p99 {}", lengths[3], lengths[7])), std::string::npos) << r.out;
}

TEST_F(DataCli, BadDatasetFiles) {
  make_dataset();
  const std::string p = dir_ / "gen";
  auto idx = read_bytes(p + ".idx"), bin = read_bytes(p + ".bin");
  expect_error(run("data inspect " + quote(dir_ / "nothing")), {dir_ / "nothing.idx", "no such file"});
  fs::remove(p + ".bin");
  expect_error(run("data inspect " + quote(p)), {p + ".bin", "no such file"});
  write_bytes(p + ".bin", std::vector<uint8_t>(bin.begin(), bin.end() - 10));
  expect_error(run("data inspect " + quote(p)), {p + ".bin", "shorter than"});
  write_bytes(p + ".bin", bin);
  auto bad = idx;
  bad[3] = 'x';
  write_bytes(p + ".idx", bad);
  expect_error(run("data inspect " + quote(p)), {p + ".idx", "wrong magic"});
  bad = idx;
  bad[9] = 3;
  write_bytes(p + ".idx", bad);
  expect_error(run("data inspect " + quote(p) + " --json"), {p + ".idx", "version 3"});
  bad = idx;
  bad[34 + 4 * 8 + 8 * 5 + 5] = 0x7f;  // sequence 5's pointer, far out
  write_bytes(p + ".idx", bad);
  expect_error(run("data inspect " + quote(p)), {p + ".idx", "sequence 5 points at bytes"});
  write_bytes(p + ".idx", idx);
  expect_error(run("data inspect " + quote(p) + " --show-document 8"), {"--show-document 8", "0 to 7"});
}

TEST_F(DataCli, PreprocessWithMoreWorkersThanCoresWritesTheSameBytes) {
  make_dataset();  // gen.{bin,idx} with 2 workers
  const std::string common = " --input " + quote(fixture("genesis_1_8.jsonl")) + " --tokenizer-model " +
                             quote(dir_ / "tok.model") + " --output-prefix ";
  for (const char* workers : {"1", "64"}) {
    CliResult r = run("data preprocess" + common + quote(dir_ / ("w" + std::string(workers))) + " --workers " + workers);
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.err.find(std::string("with ") + workers + " workers"), std::string::npos) << r.err;
    EXPECT_EQ(read_bytes(dir_ / ("w" + std::string(workers) + ".bin")), read_bytes(dir_ / "gen.bin")) << workers;
    EXPECT_EQ(read_bytes(dir_ / ("w" + std::string(workers) + ".idx")), read_bytes(dir_ / "gen.idx")) << workers;
  }
}

TEST_F(DataCli, BadInputLines) {
  write_text(dir_ / "in.jsonl", "{\"text\": \"In the beginning\"}\n{\"text\": \"And God said\"}\n{oops}\n");
  CliResult r = run("data train-tokenizer --input " + quote(fixture("genesis_1_8.jsonl")) +
                    " --vocab-size 400 --model-prefix " + quote(dir_ / "tok"));
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string common = " --tokenizer-model " + quote(dir_ / "tok.model") + " --output-prefix " + quote(dir_ / "o");
  expect_error(run("data preprocess --input " + quote(dir_ / "in.jsonl") + common),
               {dir_ / "in.jsonl:3:", "not valid JSON"});
  EXPECT_FALSE(fs::exists(dir_ / "o.bin"));
  r = run("data preprocess --input " + quote(dir_ / "in.jsonl") + common + " --skip-bad-lines");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("1 bad lines skipped"), std::string::npos) << r.err;
  write_text(dir_ / "key.jsonl", "{\"content\": \"x\"}\n");
  expect_error(run("data preprocess --input " + quote(dir_ / "key.jsonl") + common + " --overwrite"),
               {dir_ / "key.jsonl:1:", "no key \"text\""});
  r = run("data preprocess --input " + quote(dir_ / "key.jsonl") + common + " --overwrite --json-key content");
  EXPECT_EQ(r.status, 0) << r.err;
  write_text(dir_ / "utf.txt", "good line\nbad \xc3\x28 line\n");
  expect_error(run("data preprocess --input " + quote(dir_ / "utf.txt") + common + " --overwrite"),
               {dir_ / "utf.txt:2:", "invalid UTF-8"});
  write_text(dir_ / "empty.jsonl", "");
  expect_error(run("data preprocess --input " + quote(dir_ / "empty.jsonl") + common + " --overwrite"),
               {dir_ / "empty.jsonl", "no documents"});
  write_text(dir_ / "not.model", "definitely not protobuf");
  expect_error(run("data preprocess --input " + quote(dir_ / "in.jsonl") + " --tokenizer-model " +
                   quote(dir_ / "not.model") + " --output-prefix " + quote(dir_ / "o2")),
               {dir_ / "not.model", "not a SentencePiece model"});
  expect_error(run("data preprocess --input " + quote(dir_ / "in.jsonl") + common),
               {dir_ / "o.bin", "exists", "--overwrite"});
  const std::vector<uint8_t> before = read_bytes(dir_ / "o.bin");
  for (const std::string bad : {"0", "-1", "abc", "1.5", "2x", "''", "257"}) {
    expect_error(run("data preprocess --input " + quote(fixture("genesis_1_8.jsonl")) + common + " --overwrite --workers " +
                     bad),
                 {"--workers " + bad + ":", "1 to 256"});
    EXPECT_EQ(read_bytes(dir_ / "o.bin"), before) << "--workers " << bad;  // nothing replaced
  }
  expect_error(run("data train-tokenizer --input " + quote(dir_ / "in.jsonl") + " --vocab-size 400 --model-prefix " +
                   quote(dir_ / "t2")),
               {dir_ / "in.jsonl:3:", "not valid JSON"});
  expect_error(run("data preprocess --input x"), {"--tokenizer-model"});  // a missing option
}

TEST_F(DataCli, TrainRefusesTokensBeyondTheVocabulary) {
  make_dataset();  // a 400-piece vocabulary
  write_text(dir_ / "c.toml",
             "[model]\nn_layers = 1\nn_heads = 2\nd_model = 32\nseq_len = 16\nvocab_size = 128\n"
             "[train]\nsteps = 1\noutput_dir = " + nlohmann::json(dir_ / "run").dump() + "\n"
             "[data]\nprefixes = [" + nlohmann::json(dir_ / "gen").dump() + "]\nsplit = \"1\"\n");
  expect_error(run("train --config " + quote(dir_ / "c.toml")),
               {"data.prefixes", dir_ / "gen.bin", "model.vocab_size is 128"}, /*only=*/false);
  CliResult r = run("train --config " + quote(dir_ / "c.toml") + " --set model.vocab_size=400");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(fs::exists(dir_ / "run/metrics.jsonl"));
}

}  // namespace
}  // namespace tripod
