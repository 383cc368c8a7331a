// `tripod train` with train.precision = "fp8", emulated on the CPU, on a text corpus (Genesis 1-8,
// tests/fixtures/data, tokenized here with a 400-token BPE):
//   - the models of configs/tiny.toml and configs/quickstart.toml train 200 steps with each recipe
//     and end within 2% of the same run in f32 (the final loss: the mean of the last 10 steps,
//     which see the same batches in every run);
//   - a delayed-scaling run stopped at a checkpoint and resumed gives the uninterrupted run's
//     losses bit for bit (its scales and amax histories are in the checkpoint), and `ckpt verify`
//     accepts the checkpoint holding them.
#include <fmt/format.h>

#include <numeric>

#include "e2e_test.h"
#include "test_util.h"

namespace tripod {
namespace {

namespace fs = std::filesystem;
using test::run_tripod;

class Fp8Cli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(test::scratch_dir("fp8_cli"));
    const std::string text = test::source_dir() + "/tests/fixtures/data/genesis_1_8.jsonl";
    auto tok = run_tripod(fmt::format("data train-tokenizer --input '{}' --vocab-size 400 --model-prefix '{}/tok'", text,
                                      dir_->string()));
    ASSERT_EQ(tok.status, 0) << tok.err;
    auto pre = run_tripod(fmt::format("data preprocess --input '{}' --tokenizer-model '{}/tok.model' --output-prefix "
                                      "'{}/gen'", text, dir_->string(), dir_->string()));
    ASSERT_EQ(pre.status, 0) << pre.err;
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
  }

  // `tripod train` of configs/FILE on one rank and the corpus, with `sets` after.
  test::CmdResult train(const std::string& file, const fs::path& run, const std::string& sets) {
    const std::string args = fmt::format(
        "train --config '{}/configs/{}' --set 'data.prefixes=[\"{}/gen\"]' --set data.tokenizer='{}/tok.model' "
        "--set data.split=6,2,0 --set data.synthetic=false --set parallel.tp=1 --set parallel.pp=1 "
        "--set parallel.dp=1 --set parallel.vp=1 --set parallel.schedule=1f1b --set parallel.sequence_parallel=false "
        "--set parallel.distributed_optimizer=false --set train.micro_batch_size=2 --set train.global_batch_size=2 "
        "--set train.log_interval=1 --set train.eval_interval=0 --set train.tensorboard_dir='' --set train.trace=false "
        "--set train.output_dir='{}' --set checkpoint.dir='' --set checkpoint.interval=0 {}",
        test::source_dir(), file, dir_->string(), dir_->string(), run.string(), sets);
    return run_tripod(args, {.timeout_s = 600});
  }

  static fs::path* dir_;
};
fs::path* Fp8Cli::dir_ = nullptr;

double final_loss(const std::map<int64_t, double>& l) {
  double s = 0;
  int n = 0;
  for (auto it = l.rbegin(); it != l.rend() && n < 10; ++it, ++n) s += it->second;
  return s / n;
}

TEST_F(Fp8Cli, TinyAndQuickStartModelsFollowF32For200Steps) {
  for (const std::string file : {"tiny.toml", "quickstart.toml"}) {
    SCOPED_TRACE(file);
    const std::string steps = "--set train.steps=200 --set train.warmup_steps=20";
    const fs::path f32_run = *dir_ / (file + "_f32");
    auto r = train(file, f32_run, steps);
    ASSERT_EQ(r.status, 0) << r.err;
    const auto f32 = test::losses(f32_run);
    ASSERT_EQ(f32.size(), 200u);
    const double want = final_loss(f32);
    EXPECT_LT(want, 0.7 * f32.begin()->second) << "the f32 run should learn the corpus";
    for (const char* recipe : {"tensorwise", "delayed"}) {
      const fs::path run = *dir_ / fmt::format("{}_{}", file, recipe);
      r = train(file, run, steps + fmt::format(" --set train.precision=fp8 --set train.fp8_recipe={}", recipe));
      ASSERT_EQ(r.status, 0) << r.err;
      const auto fp8 = test::losses(run);
      ASSERT_EQ(fp8.size(), 200u);
      const double got = final_loss(fp8);
      fmt::print("{} {}: loss {:.4f} -> {:.4f} (f32 {:.4f} -> {:.4f}): {:+.2f}%\n", file, recipe, fp8.begin()->second,
                 got, f32.begin()->second, want, 100 * (got - want) / want);
      EXPECT_NEAR(got, want, 0.02 * want) << recipe;
      // The FP8 figures of every FP8 linear are in the step records.
      const auto last = test::metrics(run).back();
      ASSERT_TRUE(last.contains("fp8")) << last.dump();
      EXPECT_EQ(last["fp8"].size(), 16u);  // 4 layers of 4 linears
      EXPECT_EQ(last["fp8"]["h.0.attn.qkv"]["scale"].size(), 3u);
    }
  }
}

TEST_F(Fp8Cli, DelayedScalingResumesBitExactly) {
  const std::string sets = "--set train.steps=12 --set train.precision=fp8 --set train.fp8_recipe=delayed "
                           "--set train.fp8_amax_history=4 --set train.fp8_margin=1";
  const fs::path whole = *dir_ / "whole", split = *dir_ / "split", ckpt = *dir_ / "ckpt";
  auto r = train("tiny.toml", whole, sets);
  ASSERT_EQ(r.status, 0) << r.err;
  r = train("tiny.toml", split, sets + fmt::format(" --set checkpoint.dir='{}' --set train.exit_interval=7 "
                                                    "--set checkpoint.interval=7", ckpt.string()));
  ASSERT_EQ(r.status, 0) << r.err;
  auto v = run_tripod(fmt::format("ckpt verify '{}'", ckpt.string()));
  EXPECT_EQ(v.status, 0) << v.out << v.err;
  auto inspect = run_tripod(fmt::format("ckpt inspect '{}'", ckpt.string()));
  EXPECT_NE(inspect.out.find("FP8 delayed-scaling state (scales and amax histories) of 16 linears"), std::string::npos)
      << inspect.out;
  r = train("tiny.toml", split, sets + fmt::format(" --set checkpoint.dir='{}' --set checkpoint.load=latest", ckpt.string()));
  ASSERT_EQ(r.status, 0) << r.err;
  const auto a = test::losses(whole), b = test::losses(split);
  ASSERT_EQ(a.size(), 12u);
  ASSERT_EQ(b.size(), 12u);
  for (const auto& [step, loss] : a) EXPECT_EQ(loss, b.at(step)) << "step " << step;  // bit for bit
  // And so are the scales the resumed steps used.
  const auto ma = test::metrics(whole), mb = test::metrics(split);
  EXPECT_EQ(ma.back()["fp8"], mb.back()["fp8"]);
}

}  // namespace
}  // namespace tripod
