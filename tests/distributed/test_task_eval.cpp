// Downstream tasks scored on the pipeline (train/task_evaluator.h), 4 ranks under mpirun: the
// fixtures' GPT-2 and Llama (Hugging Face weights, tests/fixtures/eval) give every request the
// log-likelihood of the independent PyTorch implementation (make_eval_golden.py) to f32 noise and
// the same accuracies, serially and one choice at a time; and the same figures on every grid:
// bit for bit where only the examples' DP rank or the layers' pipeline rank differ (dp = 2,
// pp = 2), within f32 noise where TP or CP split the sums.
#include <fmt/format.h>

#include <cmath>
#include <map>

#include "checkpoint/hf_names.h"
#include "checkpoint/llama_hf.h"
#include "checkpoint/safetensors.h"
#include "cli_util.h"
#include "harness.h"
#include "test_util.h"
#include "train/task_evaluator.h"

namespace tripod {
namespace {

using nlohmann::json;

const std::string kFixtures = std::string(TRIPOD_SOURCE_PATH) + "/tests/fixtures/eval";
const std::vector<std::string> kTasks = {"hellaswag", "multiple_choice", "bits_per_byte"};

struct Model {
  ModelConfig mc;
  std::map<std::string, std::vector<float>> params;  // tripod's names, whole tensors
};

// The fixture's Hugging Face weights as tripod's tensors (what `tripod ckpt convert --from` reads).
Model hf_model(const std::string& name) {
  Model m;
  Snapshot snap;
  if (name == "gpt2") {
    const std::string path = kFixtures + "/gpt2.safetensors";
    const SafetensorsFile f = read_safetensors(path);
    m.mc = gpt2_model_from_hf(f, 0, path);
    snap = gpt2_from_hf(f, model_param_specs(m.mc), path);
  } else {
    const std::string dir = kFixtures + "/llama_hf";
    const SafetensorsFolder folder = read_safetensors_folder(dir);
    m.mc = llama_model_from_hf(folder.config, dir);
    snap = llama_from_hf(folder.weights, m.mc, model_param_specs(m.mc), dir);
  }
  for (size_t i = 0; i < snap.specs.size(); ++i)
    m.params[snap.specs[i].name] = std::vector<float>(snap.data[i].begin(), snap.data[i].end());
  return m;
}

struct Layout {
  int tp = 1, dp = 1, pp = 1, cp = 1;
  bool sp = false;
  std::string str() const { return fmt::format("tp={} dp={} pp={} cp={}{}", tp, dp, pp, cp, sp ? " +sp" : ""); }
};

Config task_config(const ModelConfig& mc, const Layout& l) {
  Config c;
  c.model = mc;
  c.data.tokenizer = kFixtures + "/gpt2_bpe";
  c.parallel.tp = l.tp;
  c.parallel.dp = l.dp;
  c.parallel.pp = l.pp;
  c.parallel.cp = l.cp;
  c.parallel.sequence_parallel = l.sp;
  // Micro-batches of 2 x 48 tokens (1 to 12 rows each), 2 per rank and step: rounds of 2.
  c.train.micro_batch_size = 2;
  c.train.global_batch_size = 4 * l.dp;
  for (const std::string& t : kTasks) {
    EvalTaskConfig e;
    e.name = *parse_enum<TaskKind>(t);
    e.path = kFixtures + (t == "hellaswag" ? "/hellaswag.jsonl" : t == "multiple_choice" ? "/choices.jsonl" : "/text.jsonl");
    c.eval.tasks.push_back(e);
  }
  return c;
}

struct Scores {
  std::vector<std::vector<double>> lls;  // per task, per request
  std::vector<TaskResult> results;
};

Scores score(const Model& m, const Layout& l, ParallelContext& par, Ops& ops, bool batch = true) {
  Config c = task_config(m.mc, l);
  validate_layout(c, par.grid.world_size());
  const std::vector<Task> tasks = load_tasks(c, c.eval.tasks, [](size_t i) { return fmt::format("task {}", i); });
  const RankLayout layout = make_eval_layout(c, par.rank);
  ParamRegistry reg;
  GptModel model(ops, par, c.model, layout.chunks, RecomputeConfig{}, reg);
  reg.allocate(ops);
  test::set_global_params(m.params, reg, ops);
  TaskEvaluator scorer(c, layout, ops, par, model, reg);
  Scores s;
  for (const Task& t : tasks) {
    s.lls.push_back(scorer.loglikelihoods(t.requests, "", t.size(), batch));
    s.results.push_back(task_result(t, s.lls.back()));
  }
  return s;
}

// The reference's log-likelihood of every request (bits per byte: each document's, at its first window).
std::vector<double> reference(const json& model, const std::string& task, const Scores& s, size_t t,
                              const std::vector<Task>& tasks) {
  std::vector<double> out;
  if (task == "bits_per_byte") {
    // Compare documents: the sums of their windows.
    std::vector<double> docs(tasks[t].size(), 0.0);
    for (size_t i = 0; i < tasks[t].requests.size(); ++i) docs[tasks[t].requests[i].example] += s.lls[t][i];
    return docs;
  }
  for (const json& ex : model[task]["loglikelihoods"])
    for (const json& ll : ex) out.push_back(ll.get<double>());
  return out;
}

TEST(TaskEvaluator, MatchesTheReferenceAndAgreesAcrossGrids) {
  auto ops = make_ops(Device::CPU);
  const json golden = json::parse(test::slurp(kFixtures + "/golden.json"));
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  for (const std::string name : {"gpt2", "llama"}) {
    SCOPED_TRACE(name);
    const Model m = hf_model(name);
    const json& want = golden["models"][name];
    Scores serial, one_at_a_time;
    {
      auto self = test::make_selfworld(*ops);
      serial = score(m, Layout{}, *self.par, *ops);
      one_at_a_time = score(m, Layout{}, *self.par, *ops, /*batch=*/false);
    }
    Config c = task_config(m.mc, Layout{});
    const std::vector<Task> tasks = load_tasks(c, c.eval.tasks, [](size_t i) { return fmt::format("task {}", i); });
    double worst = 0;
    for (size_t t = 0; t < kTasks.size(); ++t) {
      SCOPED_TRACE(kTasks[t]);
      std::vector<double> ours = serial.lls[t];
      std::vector<double> ref;
      if (kTasks[t] == "bits_per_byte") {
        ours = reference(want, kTasks[t], serial, t, tasks);
        for (const json& d : want["bits_per_byte"]["loglikelihoods"]) ref.push_back(d.get<double>());
      } else {
        ref = reference(want, kTasks[t], serial, t, tasks);
      }
      ASSERT_EQ(ours.size(), ref.size());
      for (size_t i = 0; i < ref.size(); ++i) {
        const double rel = std::abs(ours[i] - ref[i]) / std::max(1.0, std::abs(ref[i]));
        worst = std::max(worst, rel);
        EXPECT_LT(rel, 2e-6) << "request " << i << ": tripod " << ours[i] << ", PyTorch " << ref[i];
      }
      // The same winners, hence the same accuracies and bits per byte.
      for (const TaskMetric& mt : serial.results[t].metrics)
        EXPECT_NEAR(mt.value, want[kTasks[t]][mt.name].get<double>(), 2e-6 * std::abs(mt.value)) << mt.name;
      // One choice per micro-batch: the same rows, other shapes.
      for (size_t i = 0; i < serial.lls[t].size(); ++i)
        EXPECT_NEAR(one_at_a_time.lls[t][i], serial.lls[t][i], 1e-6 * std::max(1.0, std::abs(serial.lls[t][i])));
    }
    if (rank == 0) fmt::print("{}: serial vs PyTorch (float64): worst relative difference {:.1e}\n", name, worst);

    const std::vector<Layout> layouts = {{.tp = 2},         {.dp = 2},         {.pp = 2},         {.cp = 2},
                                         {.tp = 2, .sp = true}, {.tp = 2, .dp = 2}, {.dp = 2, .pp = 2},
                                         {.tp = 2, .pp = 2}, {.pp = 2, .cp = 2}, {.tp = 2, .cp = 2, .sp = true}};
    for (const Layout& l : layouts) {
      SCOPED_TRACE(l.str());
      auto w = test::make_subworld(*ops, RankGrid(l.tp, l.dp, l.pp, l.cp), l.sp);
      if (!w.par) continue;
      const Scores s = score(m, l, *w.par, *ops);
      // The same rows in the same order through the same kernels: every dp of the serial run's
      // shared-prefix path (pp = cp = 1 on the CPU), every dp x pp of the pipeline's.
      const bool exact = l.tp == 1 && l.cp == 1 && l.pp == 1;
      double diff = 0;
      for (size_t t = 0; t < kTasks.size(); ++t) {
        for (size_t i = 0; i < s.lls[t].size(); ++i) {
          if (exact) {
            EXPECT_EQ(s.lls[t][i], serial.lls[t][i]) << kTasks[t] << " request " << i;
          } else {
            EXPECT_NEAR(s.lls[t][i], serial.lls[t][i], 1e-6 * std::max(1.0, std::abs(serial.lls[t][i])))
                << kTasks[t] << " request " << i;
          }
          diff = std::max(diff, std::abs(s.lls[t][i] - serial.lls[t][i]) / std::max(1.0, std::abs(serial.lls[t][i])));
        }
        for (size_t k = 0; k < s.results[t].metrics.size(); ++k)
          EXPECT_NEAR(s.results[t].metrics[k].value, serial.results[t].metrics[k].value,
                      1e-6 * std::abs(serial.results[t].metrics[k].value));
      }
      if (w.par->rank == 0) fmt::print("  {:<22} worst relative difference to serial {:.1e}\n", l.str(), diff);
    }
  }
}

}  // namespace
}  // namespace tripod
