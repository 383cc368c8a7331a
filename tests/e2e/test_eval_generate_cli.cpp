// `tripod eval` and `tripod generate` end to end, alone and under mpirun, and the periodic
// evaluation of `tripod train` as the report reads it. Bad input: one "error:" line, exit 2.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "train/report.h"

namespace tripod {
namespace {

using test::run_cmd;

const char* kTiny = R"([model]
n_layers = 2
n_heads = 4
d_model = 32
seq_len = 16
vocab_size = 512
[train]
micro_batch_size = 2
global_batch_size = 8
steps = 4
log_interval = 1
eval_steps = 2
[data]
synthetic = true
)";

std::string tripod(const std::string& args) { return test::tripod_bin() + " " + args; }

void expect_error(const test::CmdResult& r, const std::string& what, const std::string& label) {
  EXPECT_EQ(r.status, 2) << label << ": " << r.err;
  EXPECT_EQ(test::count_lines_starting(r.err, "error: "), 1) << label << ": " << r.err;
  EXPECT_NE(r.err.find(what), std::string::npos) << label << ": " << r.err;
}

class EvalGenerateCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::scratch_dir("evalgen");
    cfg_ = (dir_ / "c.toml").string();
    test::write_file(cfg_, kTiny);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
  std::string cfg_;
};

TEST_F(EvalGenerateCli, EvalIsTheSameOnEveryGridAndPrintsJson) {
  auto eval = [&](const std::string& extra) {
    return run_cmd(tripod("eval --config " + cfg_ + " --init-seed 7 --json " + extra));
  };
  auto one = eval("");
  ASSERT_EQ(one.status, 0) << one.err;
  auto j = nlohmann::json::parse(one.out);
  EXPECT_EQ(j["split"], "valid");
  EXPECT_EQ(j["tokens"], 2 * 8 * 16);  // train.eval_steps global batches
  EXPECT_NEAR(j["loss"].get<double>(), std::log(512.0), 0.1) << "random weights guess about uniformly";
  EXPECT_NEAR(j["perplexity"].get<double>(), std::exp(j["loss"].get<double>()), 1e-6 * j["perplexity"].get<double>());
  for (const char* grid : {"--set parallel.tp=2", "--set parallel.pp=2"}) {
    auto r = run_cmd(test::mpirun(2) + tripod("eval --config " + cfg_ + " --init-seed 7 --json " + grid));
    ASSERT_EQ(r.status, 0) << grid << ": " << r.err;
    EXPECT_NEAR(nlohmann::json::parse(r.out)["loss"].get<double>(), j["loss"].get<double>(),
                1e-6 * j["loss"].get<double>()) << grid;
  }
  auto test_split = eval("--split test --samples 5");
  ASSERT_EQ(test_split.status, 0) << test_split.err;
  auto t = nlohmann::json::parse(test_split.out);
  EXPECT_EQ(t["split"], "test");
  EXPECT_EQ(t["tokens"], 5 * 16);
  EXPECT_NE(t["loss"].get<double>(), j["loss"].get<double>());
  auto text = run_cmd(tripod("eval --config " + cfg_ + " --init-seed 7"));
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_EQ(text.out.rfind("eval valid: loss ", 0), 0u) << text.out;
  EXPECT_NE(text.out.find("perplexity"), std::string::npos) << text.out;

  expect_error(run_cmd(tripod("eval --config " + cfg_)), "--init-seed", "no weights");
  expect_error(eval("--split train"), "--split 'train'", "train split");
  expect_error(eval("--samples -3"), "--samples -3", "negative samples");
  expect_error(run_cmd(tripod("eval --config " + cfg_ + " --load " + (dir_ / "nothing").string())),
               (dir_ / "nothing").string() + " does not exist", "a missing checkpoint");
}

TEST_F(EvalGenerateCli, TrainingEvaluatesEveryIntervalAndTheReportReadsIt) {
  const auto run = dir_ / "run";
  auto r = run_cmd(tripod("train --config " + cfg_ + " --set train.eval_interval=2 --set train.output_dir=" +
                          run.string()));
  ASSERT_EQ(r.status, 0) << r.err;
  std::ifstream in(run / "metrics.jsonl");
  std::string line;
  std::vector<int64_t> eval_steps;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (!j.value("eval", false)) continue;
    eval_steps.push_back(j["step"]);
    EXPECT_EQ(j["val_loss"], j["loss"]);
    EXPECT_NEAR(j["val_ppl"].get<double>(), std::exp(j["val_loss"].get<double>()), 1e-9 * j["val_ppl"].get<double>());
  }
  EXPECT_EQ(eval_steps, (std::vector<int64_t>{2, 4}));
  RunMetrics m = read_metrics((run / "metrics.jsonl").string());
  ASSERT_EQ(m.eval.size(), 2u);
  EXPECT_EQ(m.eval[0].split, "valid");
  EXPECT_EQ(m.train.size(), 4u);
}

TEST_F(EvalGenerateCli, GenerateIsDeterministicAndTheSameAtTpTwo) {
  auto tok = run_cmd(tripod("data train-tokenizer --input " + std::string(TRIPOD_SOURCE_PATH) +
                            "/tests/fixtures/data/genesis_1_8.jsonl --vocab-size 400 --model-prefix " +
                            (dir_ / "tok").string()));
  ASSERT_EQ(tok.status, 0) << tok.err;
  // GPT-2 and a Llama-family model (2 key/value heads: one per rank at tp = 2, rope at the cached positions).
  for (const std::string arch : {"", "--set model.arch=llama --set model.n_kv_heads=2 "})
  for (const std::string sampling : {"--temperature 0", "--temperature 0.8 --top-k 50 --top-p 0.9 --seed 11"}) {
    SCOPED_TRACE(arch + sampling);
    const std::string base = "generate --config " + cfg_ + " --set data.tokenizer=" + (dir_ / "tok.model").string() +
                             " --init-seed 3 --prompt 'And God said' --max-tokens 10 " + arch;
    auto a = run_cmd(tripod(base + sampling));
    ASSERT_EQ(a.status, 0) << a.err;
    EXPECT_GT(a.out.size(), 1u) << "some text streamed";
    auto b = run_cmd(tripod(base + sampling));
    EXPECT_EQ(a.out, b.out) << sampling << ": the same seed, the same text";
    auto tp2 = run_cmd(test::mpirun(2) + tripod(base + sampling + " --set parallel.pp=2"));
    ASSERT_EQ(tp2.status, 0) << tp2.err;
    EXPECT_EQ(tp2.out, a.out) << sampling << ": tp=2 generates what tp=1 does";
    EXPECT_NE(tp2.err.find("tp=2"), std::string::npos) << tp2.err;
  }

  const std::string with_tok = "generate --config " + cfg_ + " --init-seed 3 --set data.tokenizer=" +
                               (dir_ / "tok.model").string();
  expect_error(run_cmd(tripod("generate --config " + cfg_ + " --init-seed 3 --prompt hi")), "data.tokenizer",
               "no tokenizer");
  expect_error(run_cmd(tripod("generate --config " + cfg_ + " --init-seed 3 --prompt hi --set data.tokenizer=" +
                              (dir_ / "missing.model").string())),
               "missing.model", "missing tokenizer file");
  expect_error(run_cmd(tripod(with_tok + " --prompt ''")), "--prompt", "empty prompt");
  expect_error(run_cmd(tripod(with_tok + " --prompt 'And God said' --max-tokens 16")), "model holds 16 positions",
               "beyond seq_len");
  expect_error(run_cmd(tripod(with_tok + " --prompt hi --temperature -1")), "--temperature -1", "temperature");
  expect_error(run_cmd(tripod(with_tok + " --prompt hi --top-p 0")), "--top-p 0", "top-p 0");
  expect_error(run_cmd(tripod(with_tok + " --prompt hi --top-p 1.5")), "--top-p 1.5", "top-p 1.5");
  expect_error(run_cmd(tripod(with_tok + " --prompt hi --top-k -2")), "--top-k -2", "top-k");
  expect_error(run_cmd(tripod(with_tok + " --prompt hi --set model.vocab_size=300")), "model.vocab_size = 300",
               "tokenizer larger than the model");
}

}  // namespace
}  // namespace tripod
