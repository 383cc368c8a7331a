// `tripod` end to end on a device, against the CPU: the quick-start model (configs/quickstart.toml)
// on a corpus,
//   - one step on one rank gives the CPU's loss and gradient norm, and every parameter's first
//     moment (its clipped gradient) and updated master weights agree with the CPU's (read back
//     from checkpoints written after the step; per-parameter table in onestep.txt);
//   - 50 steps on one rank follow the CPU's loss curve (bf16 tolerance on a GPU);
//   - the quick-start (tp, pp, dp) = (2, 2, 2) grid, 8 ranks on one device (ranks sharing a GPU
//     stage their messages through MPI), gives the single-rank run's losses;
//   - a checkpoint written on the device evaluates the same on the CPU, training resumes from it
//     on the CPU, and that checkpoint evaluates the same back on the device.
// Environment: TRIPOD_TEST_DEVICE = cuda (default; skipped without a GPU) or cpu (the same checks,
// CPU against CPU: what runs in CI); TRIPOD_CORPUS = a folder with kjv_text_document.{bin,idx} and
// kjv_bpe4096.model (the bundle's; default: a small corpus built here from the test fixture);
// TRIPOD_TEST_STEPS (default 50); TRIPOD_TEST_KEEP = a folder that keeps the runs and curve.txt.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/load.h"
#include "checkpoint/reader.h"
#include "cli_util.h"
#include "kernels/op.h"
#include "test_util.h"
#include "config/config.h"
#include "train/run_files.h"

namespace tripod {
namespace {

namespace fs = std::filesystem;

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

class CudaTrain : public ::testing::Test {
 protected:
  void SetUp() override {
    device_ = env_or("TRIPOD_TEST_DEVICE", "cuda");
    ASSERT_TRUE(device_ == "cuda" || device_ == "cpu") << "TRIPOD_TEST_DEVICE=" << device_ << ": cuda or cpu";
    if (device_ == "cuda" && cuda_device_count() == 0)
      GTEST_SKIP() << "no CUDA GPU (TRIPOD_TEST_DEVICE=cpu runs these checks on the CPU)";
    const std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    const std::string keep = env_or("TRIPOD_TEST_KEEP", "");
    dir_ = keep.empty() ? test::scratch_dir("cuda_train_" + name) : fs::path(keep) / name;
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    keep_ = !keep.empty();
    steps_ = std::stoi(env_or("TRIPOD_TEST_STEPS", "50"));
    corpus_args_ = corpus();
  }
  void TearDown() override {
    if (!keep_ && !dir_.empty()) fs::remove_all(dir_);
  }

  // --set arguments naming the corpus: the bundle's, or one built from the fixture.
  std::string corpus() {
    std::string c = env_or("TRIPOD_CORPUS", "");
    std::string prefix, model;
    if (!c.empty()) {
      prefix = c + "/kjv_text_document";
      model = c + "/kjv_bpe4096.model";
    } else {
      const std::string text = test::source_dir() + "/tests/fixtures/data/genesis_1_8.jsonl";
      const fs::path d = dir_ / "corpus";
      fs::create_directories(d);
      auto tok = tripod(fmt::format("data train-tokenizer --input '{}' --vocab-size 400 --model-prefix '{}/tok'", text,
                                    d.string()));
      EXPECT_EQ(tok.status, 0) << tok.err;
      auto pre = tripod(fmt::format("data preprocess --input '{}' --tokenizer-model '{}/tok.model' --output-prefix '{}/gen'",
                                    text, d.string(), d.string()));
      EXPECT_EQ(pre.status, 0) << pre.err;
      prefix = (d / "gen").string();
      model = (d / "tok.model").string();
    }
    // (The fixture's 8 documents need a larger validation share than the quick start's.)
    return fmt::format("--set 'data.prefixes=[\"{}\"]' --set data.tokenizer='{}'{}", prefix, model,
                       c.empty() ? " --set data.split=6,2,0" : "");
  }

  // `tripod ARGS` (under `mpirun -np ranks` when ranks > 1), output and status.
  test::CmdResult tripod(const std::string& args, int ranks = 1) {
    std::string cmd = ranks > 1 ? test::mpirun(ranks) : std::string();
    cmd += "'";
    cmd += test::tripod_bin();
    cmd += "' ";
    return test::run_cmd(cmd + args);
  }

  // The quick-start config on `device`, one rank unless `grid`, with run directory `run`.
  std::string train_args(const std::string& device, bool grid, const fs::path& run, int steps) {
    std::string a = fmt::format(
        "train --config '{}/configs/quickstart.toml' {} --set train.device={} --set train.steps={} "
        "--set train.log_interval=1 --set train.eval_interval=0 --set train.output_dir='{}' --set checkpoint.interval=0 "
        "--set checkpoint.dir=''",
        test::source_dir(), corpus_args_, device, steps, run.string());
    if (!grid)
      a += " --set parallel.tp=1 --set parallel.pp=1 --set parallel.dp=1 --set parallel.vp=1 --set parallel.schedule=1f1b"
           " --set parallel.sequence_parallel=false --set parallel.distributed_optimizer=false";
    return a;
  }

  std::vector<double> losses(const fs::path& run) {
    std::vector<double> out;
    for (const auto& r : read_metrics((run / "metrics.jsonl").string()).train) out.push_back(r.loss);
    return out;
  }

  // Trains and returns the loss per step (empty, with a failure, when the run fails).
  std::vector<double> train(const std::string& device, bool grid, const std::string& name, int steps) {
    const fs::path run = dir_ / name;
    auto r = tripod(train_args(device, grid, run, steps), grid ? 8 : 1);
    test::write_file(dir_ / (name + ".log"), r.out + r.err);
    EXPECT_EQ(r.status, 0) << name << ":\n" << r.err.substr(r.err.size() > 4000 ? r.err.size() - 4000 : 0);
    if (r.status != 0) return {};
    auto l = losses(run);
    EXPECT_EQ(l.size(), static_cast<size_t>(steps)) << name;
    return l;
  }

  // Writes curve.txt (step, both losses, relative difference) and checks every step against tol.
  void compare_curves(const std::vector<double>& want, const std::vector<double>& got, const std::string& want_name,
                      const std::string& got_name, double tol) {
    ASSERT_EQ(got.size(), want.size());
    std::ofstream curve(dir_ / "curve.txt");
    curve << fmt::format("{}: {} vs {} (tolerance {:g} relative per step)\n{:>5} {:>10} {:>10} {:>9}\n",
                         ::testing::UnitTest::GetInstance()->current_test_info()->name(), got_name, want_name, tol,
                         "step", want_name, got_name, "rel diff");
    double worst = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      const double rel = std::abs(got[i] - want[i]) / std::abs(want[i]);
      worst = std::max(worst, std::isfinite(rel) ? rel : INFINITY);
      curve << fmt::format("{:>5} {:>10.5f} {:>10.5f} {:>9.2e}\n", i + 1, want[i], got[i], rel);
      EXPECT_LE(rel, tol) << "step " << i + 1 << ": " << got_name << " " << got[i] << ", " << want_name << " "
                          << want[i];
    }
    curve << fmt::format("worst {:.2e}; first loss {:.4f}, last {:.4f}\n", worst, want.front(), want.back());
    EXPECT_LT(want.back(), want.front() - 0.5) << "the loss comes down";
  }

  // Mean validation loss of a checkpoint, evaluated on `device` (one rank).
  double eval(const std::string& device, const fs::path& ckpt) {
    auto r = tripod(fmt::format("eval --config '{}/configs/quickstart.toml' {} --load '{}' --samples 16 --json "
                                "--set train.device={} --set parallel.tp=1 --set parallel.pp=1 --set parallel.dp=1 "
                                "--set parallel.vp=1 --set parallel.schedule=1f1b --set parallel.sequence_parallel=false "
                                "--set parallel.distributed_optimizer=false",
                                test::source_dir(), corpus_args_, ckpt.string(), device));
    EXPECT_EQ(r.status, 0) << r.err;
    if (r.status != 0) return NAN;
    return nlohmann::json::parse(r.out)["loss"].get<double>();
  }

  // The tolerance of a comparison that involves the device: bf16 on a GPU, the parallel
  // reduction order (f32) on the CPU.
  double tol(double bf16) const { return device_ == "cuda" ? bf16 : 1e-4; }

  std::string device_, corpus_args_;
  fs::path dir_;
  bool keep_ = false;
  int steps_ = 50;
};

// Every tensor of one state kind in a checkpoint, whole (name -> f32 values).
std::map<std::string, std::vector<float>> read_state(CheckpointReader& r, StateKind kind) {
  std::map<std::string, std::vector<float>> out;
  for (const auto& [name, shape] : r.tensors()) {
    std::vector<float>& v = out[name];
    v.resize(static_cast<size_t>(shape_numel(shape)));
    PieceGeom g{.global_shape = shape, .shard_dim = -1, .box_offset = 0, .box_size = shape.empty() ? 1 : shape[0],
                .flat_begin = 0, .flat_end = shape_numel(shape)};
    r.assemble(name, kind, {{.geom = g, .out = v.data()}});
  }
  return out;
}

double rel_diff(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    num += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
    den += static_cast<double>(want[i]) * want[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// One step of the quick-start model on the device and on the CPU, from the same initial weights
// and tokens: the loss, the gradient norm, each parameter's first moment m = (1 - beta1) * its
// clipped gradient, and each updated master weight. The update's check is exact up to rounding:
// with identical initial weights, AdamW's first step gives
//   p_dev - p_cpu = -lr * (u_dev - u_cpu),  u = m_hat / (sqrt(v_hat) + eps)
// whatever the gradients (each side's u comes from its own saved m and v), so a wrong learning
// rate, bias correction, weight decay or a parameter left out of the update shows up.
TEST_F(CudaTrain, OneStepMatchesCpu) {
  // (`name` keeps the runs apart when the device is the CPU too.)
  auto one_step = [&](const std::string& device, const std::string& name) -> std::pair<StepRecord, fs::path> {
    const fs::path run = dir_ / name, ckpt = dir_ / (name + "_ckpt");
    auto r = tripod(train_args(device, false, run, 1) +
                    fmt::format(" --set checkpoint.dir='{}' --set checkpoint.interval=1", ckpt.string()));
    test::write_file(dir_ / (name + ".log"), r.out + r.err);
    EXPECT_EQ(r.status, 0) << device << ":\n" << r.err.substr(r.err.size() > 4000 ? r.err.size() - 4000 : 0);
    if (r.status != 0) return {};
    auto m = read_metrics((run / "metrics.jsonl").string()).train;
    EXPECT_EQ(m.size(), 1u);
    if (m.size() != 1) return {};
    return {m[0], resolve_checkpoint(ckpt.string(), "")};
  };
  const auto [cpu, cpu_ckpt] = one_step("cpu", "onestep_reference_cpu");
  const auto [dev, dev_ckpt] = one_step(device_, "onestep_" + device_);
  if (HasFailure()) return;

  std::ofstream table(dir_ / "onestep.txt");
  const double loss_rel = std::abs(dev.loss - cpu.loss) / cpu.loss;
  const double gn_rel = std::abs(dev.grad_norm - cpu.grad_norm) / cpu.grad_norm;
  table << fmt::format("OneStepMatchesCpu: {} vs cpu, quick-start model, step 1 (lr {:.3e})\n"
                       "loss      cpu {:.6f}  {} {:.6f}  rel diff {:.2e} (tolerance {:g})\n"
                       "grad norm cpu {:.6f}  {} {:.6f}  rel diff {:.2e} (tolerance {:g})\n",
                       device_, cpu.lr, cpu.loss, device_, dev.loss, loss_rel, tol(1e-2), cpu.grad_norm, device_,
                       dev.grad_norm, gn_rel, tol(3e-2));
  EXPECT_LE(loss_rel, tol(1e-2)) << "loss: cpu " << cpu.loss << ", " << device_ << " " << dev.loss;
  EXPECT_LE(gn_rel, tol(3e-2)) << "grad norm: cpu " << cpu.grad_norm << ", " << device_ << " " << dev.grad_norm;
  ASSERT_EQ(dev.lr, cpu.lr);

  CheckpointReader rc(cpu_ckpt), rd(dev_ckpt);
  ASSERT_EQ(rc.tensors(), rd.tensors()) << "the same parameters, the same shapes";
  // The master weights: the values themselves where the backend computes in f32 (no master saved).
  const auto pc = read_state(rc, rc.has_kind(StateKind::Master) ? StateKind::Master : StateKind::Value);
  const auto pd = read_state(rd, rd.has_kind(StateKind::Master) ? StateKind::Master : StateKind::Value);
  const auto mc = read_state(rc, StateKind::M), md = read_state(rd, StateKind::M);
  const auto vc = read_state(rc, StateKind::V), vd = read_state(rd, StateKind::V);
  const TrainConfig adam;  // the quick-start config keeps the default betas and eps
  const double bc1 = 1 - adam.beta1, bc2 = 1 - adam.beta2, lr = static_cast<float>(cpu.lr);
  auto u = [&](float m, float v) { return (m / bc1) / (std::sqrt(v / bc2) + adam.eps); };
  table << fmt::format("{:<28} {:>9} {:>12} {:>16}\n", "parameter", "numel", "grad rel diff", "update resid/lr");
  std::vector<float> all_mc, all_md;
  for (const auto& [name, shape] : rc.tensors()) {
    const auto &a = pc.at(name), &b = pd.at(name);
    double worst = 0;  // |p_dev - p_cpu + lr (u_dev - u_cpu)| beyond rounding, in units of lr
    bool finite = true;
    for (size_t k = 0; k < a.size(); ++k) {
      const double resid = (static_cast<double>(b[k]) - a[k]) +
                           lr * (u(md.at(name)[k], vd.at(name)[k]) - u(mc.at(name)[k], vc.at(name)[k]));
      finite = finite && std::isfinite(resid);
      worst = std::max(worst, (std::abs(resid) - 1e-6 * std::abs(a[k])) / lr);
    }
    const double grad_rel = rel_diff(md.at(name), mc.at(name));
    all_mc.insert(all_mc.end(), mc.at(name).begin(), mc.at(name).end());
    all_md.insert(all_md.end(), md.at(name).begin(), md.at(name).end());
    table << fmt::format("{:<28} {:>9} {:>12.2e} {:>16.2e}\n", name, a.size(), grad_rel, std::max(worst, 0.0));
    EXPECT_TRUE(finite) << name << ": a non-finite master weight or moment";
    EXPECT_LE(worst, 1e-4) << name << ": the update is not AdamW's first step from the same weights (residual "
                           << worst << " lr)";
    EXPECT_LE(grad_rel, tol(1e-1)) << name << ": first moment (gradient)";
  }
  const double all_rel = rel_diff(all_md, all_mc);
  table << fmt::format("all gradients (first moments): rel diff {:.2e} (tolerance {:g})\n", all_rel, tol(3e-2));
  EXPECT_LE(all_rel, tol(3e-2)) << "the whole gradient";
}

TEST_F(CudaTrain, FiftyStepsFollowTheCpuCurve) {
  const auto cpu = train("cpu", false, "cpu", steps_);
  const auto dev = train(device_, false, device_, steps_);
  if (HasFailure()) return;
  // bf16 activations drift from the f32 curve as training goes; 3% covers it, a bug does not.
  compare_curves(cpu, dev, "cpu", device_, tol(3e-2));
}

TEST_F(CudaTrain, GridOnOneGpuMatchesSingleRank) {
  const int steps = std::min(steps_, 10);
  const auto one = train(device_, false, "one_rank", steps);
  const auto grid = train(device_, true, "grid_2x2x2", steps);
  if (HasFailure()) return;
  compare_curves(one, grid, "1 rank", "(2,2,2)", tol(2e-2));
}

TEST_F(CudaTrain, CheckpointsMoveBetweenDevices) {
  // 4 steps on the device with a checkpoint at step 4.
  const fs::path a = dir_ / "ckpt_device";
  auto r = tripod(train_args(device_, false, dir_ / "run_device", 4) +
                  fmt::format(" --set checkpoint.dir='{}' --set checkpoint.interval=4", a.string()));
  ASSERT_EQ(r.status, 0) << r.err;
  // Evaluated on the CPU, it gives the device's loss.
  const double on_device = eval(device_, a), on_cpu = eval("cpu", a);
  EXPECT_NEAR(on_cpu, on_device, tol(1e-2) * on_cpu) << "the device's checkpoint on the CPU";
  // The CPU resumes from it for 2 steps and saves; the device evaluates that as the CPU does.
  const fs::path b = dir_ / "ckpt_cpu";
  r = tripod(train_args("cpu", false, dir_ / "run_cpu", 6) +
             fmt::format(" --set checkpoint.load='{}' --set checkpoint.dir='{}' --set checkpoint.interval=6", a.string(),
                         b.string()));
  ASSERT_EQ(r.status, 0) << r.err;
  const auto resumed = losses(dir_ / "run_cpu");
  ASSERT_EQ(resumed.size(), 2u) << "steps 5 and 6 only";
  const double back_cpu = eval("cpu", b), back_device = eval(device_, b);
  EXPECT_NEAR(back_device, back_cpu, tol(1e-2) * back_cpu) << "the CPU's checkpoint on the device";
  EXPECT_LT(back_cpu, on_cpu) << "the resumed steps trained on";
  test::write_file(dir_ / "evals.txt", fmt::format("step 4 checkpoint ({}): {} {:.5f}, cpu {:.5f}\n"
                                                   "step 6 checkpoint (cpu): cpu {:.5f}, {} {:.5f}\n",
                                                   device_, device_, on_device, on_cpu, back_cpu, device_, back_device));
}

}  // namespace
}  // namespace tripod
