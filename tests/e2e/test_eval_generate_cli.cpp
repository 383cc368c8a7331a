// `tripod eval` and `tripod generate` end to end, alone and under mpirun, and the periodic
// evaluation of `tripod train` as the report reads it. Bad input: one "error:" line, exit 2.
#include <cmath>
#include <map>

#include "checkpoint/safetensors.h"
#include "e2e_test.h"
#include "report/report.h"
#include "train/metrics.h"
#include "train/run_files.h"

namespace tripod {
namespace {

using test::run_tripod;

void expect_error(const test::CmdResult& r, const std::string& what, const std::string& label) {
  SCOPED_TRACE(label);
  test::expect_refused(r, what);
}

class EvalGenerateCli : public test::E2eTest {
 protected:
  void SetUp() override {
    E2eTest::SetUp();
    cfg_ = write_config({{"model.vocab_size", "512"}, {"train.steps", "4"}, {"train.eval_steps", "2"}}).string();
  }
  // Trains a SentencePiece model of 400 pieces on the fixture text, as dir_/tok.model.
  void train_tokenizer() {
    auto tok =
        run_tripod("data train-tokenizer --input " + std::string(TRIPOD_SOURCE_PATH) +
                   "/tests/fixtures/data/genesis_1_8.jsonl --vocab-size 400 --model-prefix " + (dir_ / "tok").string());
    ASSERT_EQ(tok.status, 0) << tok.err;
  }
  std::string cfg_;
};

TEST_F(EvalGenerateCli, EvalIsTheSameOnEveryGridAndPrintsJson) {
  auto eval = [&](const std::string& extra) {
    return run_tripod("eval --config " + cfg_ + " --init-seed 7 --json " + extra);
  };
  auto one = eval("");
  ASSERT_EQ(one.status, 0) << one.err;
  auto j = nlohmann::json::parse(one.out);
  EXPECT_EQ(j["split"], "valid");
  EXPECT_EQ(j["tokens"], 2 * 8 * 16);  // train.eval_steps global batches
  EXPECT_NEAR(j["loss"].get<double>(), std::log(512.0), 0.1) << "random weights guess about uniformly";
  EXPECT_NEAR(j["perplexity"].get<double>(), std::exp(j["loss"].get<double>()), 1e-6 * j["perplexity"].get<double>());
  for (const char* grid : {"--set parallel.tp=2", "--set parallel.pp=2"}) {
    auto r = run_tripod("eval --config " + cfg_ + " --init-seed 7 --json " + grid, {.np = 2});
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
  auto text = run_tripod("eval --config " + cfg_ + " --init-seed 7");
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_EQ(text.out.rfind("eval valid: loss ", 0), 0u) << text.out;
  EXPECT_NE(text.out.find("perplexity"), std::string::npos) << text.out;

  expect_error(run_tripod("eval --config " + cfg_), "--init-seed", "no weights");
  expect_error(eval("--split train"), "--split 'train'", "train split");
  expect_error(eval("--samples -3"), "--samples -3", "negative samples");
  expect_error(run_tripod("eval --config " + cfg_ + " --load " + (dir_ / "nothing").string()),
               (dir_ / "nothing").string() + " does not exist", "a missing checkpoint");
}

TEST_F(EvalGenerateCli, TrainingEvaluatesEveryIntervalAndTheReportReadsIt) {
  const auto run = dir_ / "run";
  auto r = run_tripod("train --config " + cfg_ + " --set train.eval_interval=2 --set train.output_dir=" + run.string());
  ASSERT_EQ(r.status, 0) << r.err;
  std::vector<int64_t> eval_steps;
  for (const auto& j : test::metrics(run)) {
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

// Packed documents through the executable: training with the three flags on 2 ranks (cp = 2)
// records the resolved end-of-document id and its checkpoints the flags; `tripod eval` of such a
// checkpoint averages over the tokens that count; a resume with other flags says which.
TEST_F(EvalGenerateCli, PackedDocumentsTrainEvaluateAndResume) {
  ASSERT_NO_FATAL_FAILURE(train_tokenizer());
  const std::string src = std::string(TRIPOD_SOURCE_PATH) + "/tests/fixtures/data/genesis_1_8.jsonl";
  auto pre = run_tripod("data preprocess --input " + src + " --tokenizer-model " + (dir_ / "tok.model").string() +
                        " --output-prefix " + (dir_ / "gen").string() + " --workers 1");
  ASSERT_EQ(pre.status, 0) << pre.err;
  const auto cfg = write_config({{"model.vocab_size", "512"}, {"train.steps", "2"}, {"data.synthetic", ""},
                                 {"data.prefixes", "[" + nlohmann::json((dir_ / "gen").string()).dump() + "]"},
                                 {"data.tokenizer", nlohmann::json((dir_ / "tok.model").string()).dump()},
                                 {"data.split", "\"6,1,1\""}, {"data.reset_position_ids", "true"},
                                 {"data.reset_attention_mask", "true"}, {"data.eod_mask_loss", "true"}},
                                "packed.toml");
  const auto run = dir_ / "run", ck = dir_ / "ck";
  auto r = run_tripod("train --config " + cfg.string() + " --set parallel.cp=2 --set train.output_dir=" +
                          run.string() + " --set checkpoint.dir=" + ck.string(),
                      {.np = 2});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(test::slurp(run / "config.toml").find("eod_token = 2"), std::string::npos)
      << "the tokenizer's end-of-document id, resolved";
  for (const auto& [step, loss] : test::losses(run)) EXPECT_TRUE(std::isfinite(loss)) << step;
  const auto meta = nlohmann::json::parse(test::slurp(ck / "iter_0000002" / "metadata.json"));
  EXPECT_EQ(meta["documents"]["reset_attention_mask"], true);
  EXPECT_EQ(meta["documents"]["eod_token"], 2);

  auto e = run_tripod("eval --load " + ck.string() + " --samples 100 --json");
  ASSERT_EQ(e.status, 0) << e.err;
  const auto j = nlohmann::json::parse(e.out);
  EXPECT_LT(j["tokens"].get<int64_t>(), 100 * 16) << "the end-of-document positions do not count";
  EXPECT_GT(j["tokens"].get<int64_t>(), 90 * 16);

  auto resumed = run_tripod("train --config " + cfg.string() + " --set train.steps=3 --set train.output_dir=" +
                            run.string() + " --set checkpoint.dir=" + ck.string() +
                            " --set checkpoint.load=latest --set data.reset_attention_mask=false");
  ASSERT_EQ(resumed.status, 0) << resumed.err;
  EXPECT_NE(resumed.err.find("data.reset_attention_mask = false (the checkpoint: true)"), std::string::npos)
      << resumed.err;
}

TEST_F(EvalGenerateCli, GenerateIsDeterministicAndTheSameAtTpTwo) {
  ASSERT_NO_FATAL_FAILURE(train_tokenizer());
  // GPT-2 and a Llama-family model (2 key/value heads: one per rank at tp = 2, rope at the cached positions).
  for (const std::string arch : {"", "--set model.arch=llama --set model.n_kv_heads=2 "})
  for (const std::string sampling : {"--temperature 0", "--temperature 0.8 --top-k 50 --top-p 0.9 --seed 11"}) {
    SCOPED_TRACE(arch + sampling);
    const std::string base = "generate --config " + cfg_ + " --set data.tokenizer=" + (dir_ / "tok.model").string() +
                             " --init-seed 3 --prompt 'And God said' --max-tokens 10 " + arch;
    auto a = run_tripod(base + sampling);
    ASSERT_EQ(a.status, 0) << a.err;
    EXPECT_GT(a.out.size(), 1u) << "some text streamed";
    auto b = run_tripod(base + sampling);
    EXPECT_EQ(a.out, b.out) << sampling << ": the same seed, the same text";
    auto tp2 = run_tripod(base + sampling + " --set parallel.pp=2", {.np = 2});
    ASSERT_EQ(tp2.status, 0) << tp2.err;
    EXPECT_EQ(tp2.out, a.out) << sampling << ": tp=2 generates what tp=1 does";
    EXPECT_NE(tp2.err.find("tp=2"), std::string::npos) << tp2.err;
  }

  const std::string with_tok = "generate --config " + cfg_ + " --init-seed 3 --set data.tokenizer=" +
                               (dir_ / "tok.model").string();
  expect_error(run_tripod("generate --config " + cfg_ + " --init-seed 3 --prompt hi"), "data.tokenizer",
               "no tokenizer");
  expect_error(run_tripod("generate --config " + cfg_ +
                          " --init-seed 3 --prompt hi --set data.tokenizer=" + (dir_ / "missing.model").string()),
               "missing.model", "missing tokenizer file");
  expect_error(run_tripod(with_tok + " --prompt ''"), "--prompt", "empty prompt");
  expect_error(run_tripod(with_tok + " --prompt 'And God said' --max-tokens 16"), "model holds 16 positions",
               "beyond seq_len");
  expect_error(run_tripod(with_tok + " --prompt hi --temperature -1"), "--temperature -1", "temperature");
  expect_error(run_tripod(with_tok + " --prompt hi --top-p 0"), "--top-p 0", "top-p 0");
  expect_error(run_tripod(with_tok + " --prompt hi --top-p 1.5"), "--top-p 1.5", "top-p 1.5");
  expect_error(run_tripod(with_tok + " --prompt hi --top-k -2"), "--top-k -2", "top-k");
  expect_error(run_tripod(with_tok + " --prompt hi --set model.vocab_size=300"), "model.vocab_size = 300",
               "tokenizer larger than the model");
}

TEST_F(EvalGenerateCli, ACheckpointAloneIsEnoughAndEvalFitsItsGridToTheWorld) {
  ASSERT_NO_FATAL_FAILURE(train_tokenizer());
  const std::string ckpt = (dir_ / "ckpt").string();
  auto train = run_tripod("train --config " + cfg_ + " --set train.steps=2 --set checkpoint.dir=" + ckpt +
                          " --set data.tokenizer=" + (dir_ / "tok.model").string() +
                          " --set train.output_dir=" + (dir_ / "run").string());
  ASSERT_EQ(train.status, 0) << train.err;

  // eval: the checkpoint's config (grid dp = pp = tp = 1) on one rank, and refitted to two.
  auto one = run_tripod("eval --load " + ckpt + " --json");
  ASSERT_EQ(one.status, 0) << one.err;
  auto with_config = run_tripod("eval --config " + cfg_ + " --load " + ckpt + " --json");
  ASSERT_EQ(with_config.status, 0) << with_config.err;
  EXPECT_EQ(one.out, with_config.out);
  auto two = run_tripod("eval --load " + ckpt + " --json", {.np = 2});
  ASSERT_EQ(two.status, 0) << two.err;
  EXPECT_NE(two.err.find("eval runs on grid (dp=2, pp=1, tp=1)"), std::string::npos) << two.err;
  const double loss = nlohmann::json::parse(one.out)["loss"].get<double>();
  EXPECT_NEAR(nlohmann::json::parse(two.out)["loss"].get<double>(), loss, 1e-6 * loss);
  EXPECT_EQ(nlohmann::json::parse(two.out)["tokens"], nlohmann::json::parse(one.out)["tokens"]);
  // Context parallelism: the two ranks split every sequence; the same loss and tokens.
  auto cp2 = run_tripod("eval --load " + ckpt + " --json --set parallel.cp=2", {.np = 2});
  ASSERT_EQ(cp2.status, 0) << cp2.err;
  EXPECT_NEAR(nlohmann::json::parse(cp2.out)["loss"].get<double>(), loss, 1e-6 * loss);
  EXPECT_EQ(nlohmann::json::parse(cp2.out)["tokens"], nlohmann::json::parse(one.out)["tokens"]);
  // A grid given with --set is honoured exactly, so this one does not fit two ranks.
  expect_error(run_tripod("eval --load " + ckpt + " --set parallel.dp=1", {.np = 2}), "world size is 2",
               "explicit grid");

  // generate: the tokenizer comes from the checkpoint's config too.
  const std::string gen = " --prompt 'And God said' --max-tokens 6 --temperature 0";
  auto alone = run_tripod("generate --load " + ckpt + gen);
  ASSERT_EQ(alone.status, 0) << alone.err;
  auto given = run_tripod("generate --config " + cfg_ + " --set data.tokenizer=" + (dir_ / "tok.model").string() +
                          " --load " + ckpt + gen);
  ASSERT_EQ(given.status, 0) << given.err;
  EXPECT_EQ(alone.out, given.out);
  // Decoding does not split sequences: a config with cp = 2 generates with cp = 1, the same text.
  auto cp_gen = run_tripod("generate --load " + ckpt + gen + " --set parallel.cp=2");
  ASSERT_EQ(cp_gen.status, 0) << cp_gen.err;
  EXPECT_EQ(cp_gen.out, alone.out);
  EXPECT_NE(cp_gen.err.find("cp=1"), std::string::npos) << cp_gen.err;
  std::filesystem::rename(dir_ / "tok.model", dir_ / "moved.model");
  expect_error(run_tripod("generate --load " + ckpt + gen), "data.tokenizer = \"" + (dir_ / "tok.model").string(),
               "a tokenizer that moved");
  auto moved = run_tripod("generate --load " + ckpt + " --set data.tokenizer=" + (dir_ / "moved.model").string() + gen);
  ASSERT_EQ(moved.status, 0) << moved.err;
  EXPECT_EQ(moved.out, alone.out);

  expect_error(run_tripod("eval --init-seed 1"), "give --config F.toml, or --load CKPT", "no config at all");
  expect_error(run_tripod("eval --load latest"), "--load latest looks in checkpoint.dir", "latest, no config");
}

// [eval] tasks during training: scored at every evaluation after the validation loss, written to
// metrics.jsonl, TensorBoard and the checkpoint; `tripod eval --task` from that checkpoint (its
// config names the tasks) gives the figures training logged at that step.
TEST_F(EvalGenerateCli, TrainingScoresItsTasksAsEvalDoesFromTheCheckpoint) {
  const std::string fx = std::string(TRIPOD_SOURCE_PATH) + "/tests/fixtures/eval";
  const auto run = dir_ / "run", ck = dir_ / "ck", tb = dir_ / "tb";
  const std::string tasks = "--set 'eval.tasks=[{name=\"multiple_choice\", path=\"" + fx + "/choices.jsonl\", tag=\"mc\"}, "
                            "{name=\"bits_per_byte\", path=\"" + fx + "/text.jsonl\"}]' --set data.tokenizer=" + fx +
                            "/gpt2_bpe";
  auto r = run_tripod("train --config " + cfg_ + " " + tasks + " --set train.eval_interval=2 --set train.output_dir=" +
                      run.string() + " --set checkpoint.dir=" + ck.string() + " --set checkpoint.interval=2" +
                      " --set train.tensorboard_dir=" + tb.string());
  ASSERT_EQ(r.status, 0) << r.err;
  std::map<std::pair<std::string, int64_t>, nlohmann::json> records;
  for (const auto& j : test::metrics(run))
    if (j.value("eval_task", false)) records[{j["task"], j["step"]}] = j;
  ASSERT_EQ(records.size(), 4u) << "two tasks at steps 2 and 4";
  const nlohmann::json& mc = records.at({"mc", 4});
  EXPECT_EQ(mc["kind"], "multiple_choice");
  EXPECT_EQ(mc["examples"], 5);
  for (const char* k : {"acc", "acc_stderr", "acc_norm", "acc_norm_stderr", "consumed_samples", "eval_time_s"})
    EXPECT_TRUE(mc.contains(k)) << k;
  const nlohmann::json& bpb = records.at({"bits_per_byte", 4});
  EXPECT_GT(bpb["bits_per_byte"].get<double>(), 0);
  EXPECT_NE(records.at({"bits_per_byte", 2})["bits_per_byte"], bpb["bits_per_byte"]) << "the weights moved";
  // TensorBoard: TASK/METRIC tags.
  std::string events;
  for (const auto& e : std::filesystem::directory_iterator(tb)) events += test::slurp(e.path());
  for (const char* tag : {"mc/acc", "mc/acc_norm", "bits_per_byte/bits_per_byte", "bits_per_byte/word_perplexity",
                          "mc/acc_norm vs samples"})
    EXPECT_NE(events.find(tag), std::string::npos) << tag;
  // The report reads the records and draws the tasks over the steps.
  const RunMetrics rm = read_metrics((run / "metrics.jsonl").string());
  ASSERT_EQ(rm.tasks.size(), 4u);
  EXPECT_EQ(rm.other_records, 0);
  EXPECT_EQ(rm.tasks.back().task, "mc");
  ASSERT_TRUE(rm.tasks.back().find("acc_norm"));
  EXPECT_EQ(rm.tasks.back().find("acc_norm")->value, mc["acc_norm"].get<double>());
  const std::string page = render_report(run.string());
  for (const char* panel : {"panel-tasks-acc", "panel-tasks-bpb", "mc acc_norm"})
    EXPECT_NE(page.find(panel), std::string::npos) << panel;
  // The checkpoint of step 4 records the figures, and evaluating it gives them again.
  const nlohmann::json meta = nlohmann::json::parse(test::slurp(ck / "iter_0000004" / "metadata.json"));
  EXPECT_EQ(meta["eval_tasks"]["step"], 4);
  EXPECT_EQ(meta["eval_tasks"]["tasks"]["mc"]["acc_norm"], mc["acc_norm"]);
  auto again = run_tripod("eval --load " + (ck / "iter_0000004").string() + " --task mc --task bits_per_byte --json");
  ASSERT_EQ(again.status, 0) << again.err;
  const nlohmann::json j = nlohmann::json::parse(again.out);
  EXPECT_EQ(j["tasks"]["mc"]["acc"], mc["acc"]);
  EXPECT_EQ(j["tasks"]["mc"]["acc_norm"], mc["acc_norm"]);
  EXPECT_NEAR(j["tasks"]["bits_per_byte"]["bits_per_byte"].get<double>(), bpb["bits_per_byte"].get<double>(),
              1e-12 * bpb["bits_per_byte"].get<double>());
}

// Downstream tasks from a checkpoint imported from Hugging Face weights (the fixtures of
// make_eval_golden.py): tripod's export of it is those weights exactly, and `tripod eval --task`
// gives every choice and document the log-likelihood the PyTorch reference computed from them,
// alone and at tp = 2; the config's [eval] tasks are found by name; bad task options are refused.
TEST_F(EvalGenerateCli, DownstreamTasksMatchTheReferenceOfTheHuggingFaceExport) {
  const std::string fx = std::string(TRIPOD_SOURCE_PATH) + "/tests/fixtures/eval";
  const nlohmann::json golden = nlohmann::json::parse(test::slurp(fx + "/golden.json"));
  const std::string files = " --task hellaswag --task-file " + fx + "/hellaswag.jsonl --task multiple_choice --task-file " +
                            fx + "/choices.jsonl --task bits_per_byte --task-file " + fx + "/text.jsonl";
  for (const std::string model : {"gpt2", "llama"}) {
    SCOPED_TRACE(model);
    const std::string hf = fx + (model == "gpt2" ? "/gpt2.safetensors" : "/llama_hf");
    const std::string ck = (dir_ / ("ck_" + model)).string(), out = (dir_ / ("export_" + model)).string();
    auto imp = run_tripod("ckpt convert " + hf + " --from safetensors " + ck);
    ASSERT_EQ(imp.status, 0) << imp.err;
    auto exp = run_tripod("ckpt convert " + ck + " --to safetensors " + out);
    ASSERT_EQ(exp.status, 0) << exp.err;
    // The weights the reference scored are tripod's Hugging Face export of this checkpoint.
    const SafetensorsFile a = read_safetensors(model == "gpt2" ? hf : hf + "/model.safetensors");
    const SafetensorsFile b = read_safetensors(model == "gpt2" ? out : out + "/model.safetensors");
    ASSERT_EQ(a.tensors.size(), b.tensors.size());
    for (const NamedTensor& t : a.tensors) {
      auto it = std::find_if(b.tensors.begin(), b.tensors.end(), [&](const NamedTensor& u) { return u.name == t.name; });
      ASSERT_NE(it, b.tensors.end()) << t.name;
      EXPECT_EQ(it->shape, t.shape) << t.name;
      EXPECT_EQ(it->data, t.data) << t.name;
    }

    const std::string samples = (dir_ / ("samples_" + model + ".jsonl")).string();
    const std::string eval = "eval --load " + ck + " --set data.tokenizer=" + fx + "/gpt2_bpe" + files;
    auto r = run_tripod(eval + " --json --samples-out " + samples);
    ASSERT_EQ(r.status, 0) << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    const nlohmann::json& want = golden["models"][model];
    for (const char* task : {"hellaswag", "multiple_choice", "bits_per_byte"})
      for (const auto& [key, value] : want[task].items()) {
        if (key == "loglikelihoods") continue;
        EXPECT_NEAR(j["tasks"][task][key].get<double>(), value.get<double>(), 2e-6 * std::abs(value.get<double>()))
            << task << " " << key;
      }
    EXPECT_EQ(j["tasks"]["hellaswag"]["examples"], 6);
    std::map<std::string, std::vector<nlohmann::json>> by_task;
    std::ifstream in(samples);
    for (std::string line; std::getline(in, line);) {
      const nlohmann::json s = nlohmann::json::parse(line);
      by_task[s["task"]].push_back(s);
    }
    for (const char* task : {"hellaswag", "multiple_choice", "bits_per_byte"}) {
      const nlohmann::json& lls = want[task]["loglikelihoods"];
      ASSERT_EQ(by_task[task].size(), lls.size()) << task;
      for (size_t e = 0; e < lls.size(); ++e) {
        const nlohmann::json& ours = by_task[task][e];
        const nlohmann::json mine = ours.contains("loglikelihoods") ? ours["loglikelihoods"]
                                                                    : nlohmann::json::array({ours["loglikelihood"]});
        const nlohmann::json theirs = lls[e].is_array() ? lls[e] : nlohmann::json::array({lls[e]});
        ASSERT_EQ(mine.size(), theirs.size());
        for (size_t c = 0; c < mine.size(); ++c)
          EXPECT_NEAR(mine[c].get<double>(), theirs[c].get<double>(), 2e-6 * std::abs(theirs[c].get<double>()))
              << task << " example " << e << " choice " << c;
      }
    }
    // At tp = 2 under mpirun: the same figures.
    auto tp2 = run_tripod(eval + " --json --set parallel.tp=2", {.np = 2});
    ASSERT_EQ(tp2.status, 0) << tp2.err;
    const nlohmann::json k = nlohmann::json::parse(tp2.out);
    for (const char* task : {"hellaswag", "multiple_choice"})
      for (const char* m : {"acc", "acc_norm"}) EXPECT_EQ(k["tasks"][task][m], j["tasks"][task][m]) << task << m;
    EXPECT_NEAR(k["tasks"]["bits_per_byte"]["bits_per_byte"].get<double>(),
                j["tasks"]["bits_per_byte"]["bits_per_byte"].get<double>(), 1e-6);
  }

  // The table, and a task of the config's [eval] found by its tag, with --limit.
  const std::string ck = (dir_ / "ck_gpt2").string();
  const std::string tasks = "--set 'eval.tasks=[{name=\"multiple_choice\", path=\"" + fx +
                            "/choices.jsonl\", tag=\"piqa_like\"}]' --set data.tokenizer=" + fx + "/gpt2_bpe";
  auto table = run_tripod("eval --load " + ck + " " + tasks + " --task piqa_like --limit 2");
  ASSERT_EQ(table.status, 0) << table.err;
  EXPECT_NE(table.out.find("task"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("piqa_like            acc_norm"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("        2\n"), std::string::npos) << "2 examples: " << table.out;

  const std::string base = "eval --load " + ck + " --set data.tokenizer=" + fx + "/gpt2_bpe ";
  expect_error(run_tripod(base + "--task hellaswg --task-file " + fx + "/hellaswag.jsonl"), "--task 'hellaswg' is not a task",
               "unknown task");
  expect_error(run_tripod(base + "--task hellaswag"), "--task 'hellaswag' without --task-file", "no file");
  expect_error(run_tripod(base + "--task hellaswag --task-file " + fx + "/hellaswag.jsonl --limit 0"), "--limit 0",
               "limit 0");
  expect_error(run_tripod(base + "--task hellaswag --task-file " + fx + "/hellaswag.jsonl --samples 3"), "--samples",
               "samples with tasks");
  expect_error(run_tripod(base + "--task-file " + fx + "/hellaswag.jsonl"), "go with --task", "file without task");
  expect_error(run_tripod("eval --load " + ck + " --task hellaswag --task-file " + fx + "/hellaswag.jsonl"),
               "data.tokenizer", "no tokenizer");
  expect_error(run_tripod(base + "--task bits_per_byte --task-file " + fx + "/text.jsonl --task bits_per_byte "
                          "--task-file " + fx + "/text.jsonl"), "another task", "two tasks, one tag");
}

// A mixture of experts (Qwen3-MoE-like: q/k norms, a dense first layer, 4 experts of which 2 per
// token, a shared expert): training logs each MoE layer's expert load, losses and dropped pairs
// (metrics.jsonl, and the TensorBoard scalars from the same record); its checkpoint evaluates to
// the same loss on one rank, tp = 2, pp = 2 and cp = 2, and generates the same greedy text on one
// rank and at tp = 2.
TEST_F(EvalGenerateCli, AMixtureOfExpertsTrainsEvaluatesAndGeneratesOnEveryGrid) {
  ASSERT_NO_FATAL_FAILURE(train_tokenizer());
  const std::string moe = " --set model.arch=llama --set model.n_kv_heads=2 --set model.qk_norm=true"
                          " --set moe.experts=4 --set moe.top_k=2 --set moe.ffn_hidden=32 --set moe.shared_experts=1"
                          " --set moe.layers={first_dense=1} --set moe.aux_loss_coeff=0.01 --set moe.capacity_factor=1.0"
                          " --set data.tokenizer=" + (dir_ / "tok.model").string();
  const std::string ckpt = (dir_ / "ckpt").string(), run = (dir_ / "run").string();
  auto train = run_tripod("train --config " + cfg_ + moe + " --set checkpoint.dir=" + ckpt +
                          " --set train.output_dir=" + run);
  ASSERT_EQ(train.status, 0) << train.err;
  EXPECT_NE(train.err.find("active: 4 experts, top 2, 1 shared, layers 1+"), std::string::npos) << train.err;
  EXPECT_NE(train.err.find("max/mean load"), std::string::npos) << train.err;
  int records = 0;
  for (const auto& j : test::metrics(run)) {
    if (!j.contains("moe")) continue;
    ++records;
    const auto& m = j["moe"];
    EXPECT_EQ(m["layers"], nlohmann::json({1}));  // layer 0 is dense
    int64_t pairs = 0;
    for (const auto& c : m["tokens_per_expert"][0]) pairs += c.get<int64_t>();
    EXPECT_EQ(pairs, 2 * 8 * 16) << "every token of the batch, 2 choices each";
    EXPECT_GE(m["dropped_tokens"][0].get<int64_t>(), 0);
    EXPECT_GT(m["load_balancing_loss"][0].get<double>(), 1.0);
    EXPECT_GT(m["z_loss"][0].get<double>(), 0.0);
    EXPECT_GE(m["max_over_mean_load"][0].get<double>(), 1.0);
    // The TensorBoard scalars of the same record.
    StepRecord sm;
    sm.moe.push_back({.layer = 1, .tokens_per_expert = m["tokens_per_expert"][0].get<std::vector<double>>(),
                      .dropped = m["dropped_tokens"][0].get<double>(),
                      .load_balancing_loss = m["load_balancing_loss"][0].get<double>(),
                      .z_loss = m["z_loss"][0].get<double>()});
    std::map<std::string, double> tags;
    for (const auto& [tag, v] : tensorboard_scalars(sm)) tags[tag] = v;
    EXPECT_EQ(tags.at("load_balancing_loss"), m["load_balancing_loss"][0].get<double>());
    EXPECT_EQ(tags.at("moe/dropped_tokens_layer_1"), m["dropped_tokens"][0].get<double>());
    EXPECT_EQ(tags.at("moe/tokens_per_expert_layer_1/expert_3"), m["tokens_per_expert"][0][3].get<double>());
    EXPECT_TRUE(tags.count("moe/max_over_mean_load_layer_1") && tags.count("z_loss"));
  }
  EXPECT_EQ(records, 4);

  auto one = run_tripod("eval --load " + ckpt + " --json");
  ASSERT_EQ(one.status, 0) << one.err;
  const double loss = nlohmann::json::parse(one.out)["loss"].get<double>();
  for (const char* grid : {"--set parallel.tp=2", "--set parallel.pp=2", "--set parallel.cp=2"}) {
    auto r = run_tripod("eval --load " + ckpt + " --json " + grid, {.np = 2});
    ASSERT_EQ(r.status, 0) << grid << ": " << r.err;
    // (cp = 2: each rank's capacity is its own tokens', so dropped pairs may differ slightly.)
    EXPECT_NEAR(nlohmann::json::parse(r.out)["loss"].get<double>(), loss,
                (std::string(grid).find("cp") != std::string::npos ? 1e-3 : 1e-6) * loss)
        << grid;
  }
  const std::string gen = " --prompt 'And God said' --max-tokens 8 --temperature 0";
  auto alone = run_tripod("generate --load " + ckpt + gen);
  ASSERT_EQ(alone.status, 0) << alone.err;
  EXPECT_GT(alone.out.size(), 1u);
  auto tp2 = run_tripod("generate --load " + ckpt + gen + " --set parallel.tp=2", {.np = 2});
  ASSERT_EQ(tp2.status, 0) << tp2.err;
  EXPECT_EQ(tp2.out, alone.out) << "tp=2 generates what tp=1 does";
}

}  // namespace
}  // namespace tripod
