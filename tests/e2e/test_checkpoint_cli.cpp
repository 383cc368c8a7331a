// Checkpoints through the executable: a run stopped and resumed in a fresh process continues
// bit-exactly (1 rank and 8 ranks, synchronous and asynchronous saves); a save killed with
// SIGKILL leaves the previous checkpoint intact; damaged, truncated and missing files are found
// by `ckpt verify` and refused by loads; safetensors export/import round-trips; SIGTERM under
// mpirun saves a checkpoint from which the run continues exactly.
#include <functional>

#include "checkpoint/reader.h"
#include "checkpoint/safetensors.h"
#include "e2e_test.h"

namespace tripod {
namespace {

using test::slurp;

namespace fs = std::filesystem;
using test::losses;
using test::run_cmd;
using test::run_tripod;

// The tiny model with 4 layers (one per model chunk at pp = 2, vp = 2) and a vocabulary of 100;
// 6 steps of micro-batches of 1, the first 2 warming up.
const test::ConfigOverrides kConfig = {
    {"model.n_layers", "4"}, {"model.vocab_size", "100"}, {"train.micro_batch_size", "1"}, {"train.steps", "6"},
    {"train.lr", "3e-3"},    {"train.warmup_steps", "2"}, {"train.trace", "false"}};

const char* kGrid8 = " --set parallel.tp=2 --set parallel.pp=2 --set parallel.vp=2 --set parallel.schedule=interleaved"
                     " --set parallel.distributed_optimizer=true --set parallel.bucket_mb=0.01";

std::string train_args(const fs::path& cfg, const std::string& extra) {
  return "train --config " + cfg.string() + " " + extra;
}

class CheckpointCli : public test::E2eTest {
 protected:
  void SetUp() override {
    E2eTest::SetUp();
    cfg_ = write_config(kConfig);
  }
  fs::path cfg_;
};

// Every stored state of every tensor, whole.
std::map<std::string, std::vector<float>> state(const std::string& dir) {
  CheckpointReader r(dir);
  std::map<std::string, std::vector<float>> out;
  for (const auto& [name, shape] : r.tensors())
    for (StateKind k : {StateKind::Value, StateKind::M, StateKind::V}) {
      if (!r.has_kind(k)) continue;
      auto& v = out[name + "/" + state_kind_name(k)];
      v.resize(shape_numel(shape));
      PieceGeom whole{.global_shape = shape, .shard_dim = -1, .box_offset = 0, .box_size = shape[0],
                      .flat_begin = 0, .flat_end = shape_numel(shape)};
      r.assemble(name, k, {{whole, v.data()}});
    }
  return out;
}

std::vector<pid_t> children(pid_t parent) {
  std::vector<pid_t> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    std::string n = e.path().filename().string();
    if (n.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream st(e.path() / "stat");
    std::string s((std::istreambuf_iterator<char>(st)), {});
    auto rp = s.rfind(')');
    if (rp == std::string::npos) continue;
    std::istringstream rest(s.substr(rp + 2));
    char state;
    pid_t ppid;
    rest >> state >> ppid;
    if (ppid == parent) out.push_back(std::stoi(n));
  }
  return out;
}

bool wait_for(const std::function<bool()>& cond, double seconds) {
  auto t0 = std::chrono::steady_clock::now();
  while (!cond()) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > seconds) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return true;
}

void expect_resume_exact(const fs::path& cfg, int np, const std::string& grid, bool async, const fs::path& dir,
                         const fs::path& full) {
  SCOPED_TRACE(fmt::format("np {} async {}", np, async));
  const fs::path ck = dir / "ckpt", run = dir / "run";
  const std::string common = grid + " --set checkpoint.dir=" + ck.string() + " --set train.output_dir=" + run.string() +
                             (async ? " --set checkpoint.async=true" : "");
  auto r = run_tripod(train_args(cfg, common + " --set train.exit_interval=3"), {.np = np});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(slurp(ck / "latest"), "iter_0000003\n");
  r = run_tripod(train_args(cfg, common + " --set checkpoint.load=latest"), {.np = np});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("continuing at step 4"), std::string::npos) << r.err;
  EXPECT_EQ(losses(run), losses(full / "run"));  // steps 1-3 before the stop, 4-6 after
  EXPECT_TRUE(state((ck / "iter_0000006").string()) == state((full / "ckpt" / "iter_0000006").string()))
      << "weights or Adam moments differ after the resume";
}

TEST_F(CheckpointCli, ResumeInAFreshProcessIsBitExact) {
  for (int np : {1, 8}) {
    const std::string grid = np == 8 ? kGrid8 : "";
    const fs::path full = dir_ / fmt::format("full{}", np);
    auto r = run_tripod(train_args(cfg_, grid + " --set checkpoint.dir=" + (full / "ckpt").string() +
                                             " --set train.output_dir=" + (full / "run").string()),
                        {.np = np});
    ASSERT_EQ(r.status, 0) << r.err;
    ASSERT_EQ(losses(full / "run").size(), 6u);
    for (bool async : {false, true})
      expect_resume_exact(cfg_, np, grid, async, dir_ / fmt::format("r{}{}", np, async), full);
    auto v = run_tripod("ckpt verify " + (full / "ckpt").string());
    EXPECT_EQ(v.status, 0) << v.err;
  }
}

TEST_F(CheckpointCli, SigkillDuringASaveLeavesThePreviousCheckpointIntact) {
  const fs::path ck = dir_ / "ckpt";
  const std::string common =
      " --set checkpoint.dir=" + ck.string() + " --set train.output_dir=" + (dir_ / "run").string();
  auto r = run_tripod(train_args(cfg_, common + " --set train.exit_interval=2"));
  ASSERT_EQ(r.status, 0) << r.err;
  // The next save sleeps after its first dataset (a test hook); kill it there.
  test::Background job(
      test::tripod_cmd(train_args(cfg_, common + " --set checkpoint.load=latest --set train.exit_interval=4"),
                       {.env = "TRIPOD_TEST_CKPT_SLEEP_MS=60000"}),
      dir_ / "log");
  const fs::path tmp = ck / "iter_0000004.tmp";
  ASSERT_TRUE(wait_for([&] { return fs::exists(tmp / "pp00_tp00_dp00.h5"); }, 60)) << slurp(dir_ / "log");
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  kill(job.pid(), SIGKILL);
  EXPECT_EQ(job.wait(60), -SIGKILL);
  EXPECT_EQ(slurp(ck / "latest"), "iter_0000002\n");
  EXPECT_FALSE(fs::exists(ck / "iter_0000004"));
  EXPECT_FALSE(fs::exists(tmp / "metadata.json"));
  EXPECT_EQ(run_tripod("ckpt verify " + ck.string()).status, 0);
  // The unfinished directory is never taken for a checkpoint.
  r = run_tripod("ckpt verify " + tmp.string());
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("no metadata.json"), std::string::npos) << r.err;
  r = run_tripod(train_args(cfg_, common + " --set checkpoint.load=" + tmp.string()));
  EXPECT_EQ(r.status, 2) << r.err;
  // Resuming from latest works; the next save clears the leftover and, with keep = 1, removes
  // the older checkpoint only once the new one is complete.
  r = run_tripod(train_args(cfg_, common + " --set checkpoint.load=latest --set train.exit_interval=4"
                                           " --set checkpoint.keep=1"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("continuing at step 3"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(tmp));
  EXPECT_EQ(slurp(ck / "latest"), "iter_0000004\n");
  EXPECT_FALSE(fs::exists(ck / "iter_0000002"));
  EXPECT_TRUE(fs::exists(ck / "iter_0000004" / "metadata.json"));
}

// Runs `verify` and a load of `ckpt`: both must fail naming `culprit`.
void expect_checkpoint_refused(const fs::path& cfg, const fs::path& ckpt, const std::string& culprit,
                               const std::string& what, int np = 1, const std::string& grid = "") {
  SCOPED_TRACE(what);
  auto v = run_tripod("ckpt verify " + ckpt.string());
  EXPECT_NE(v.status, 0) << v.out;
  EXPECT_NE(v.err.find(culprit), std::string::npos) << v.err;
  const fs::path out = cfg.parent_path() / "refused_run";
  auto r = run_tripod(
      train_args(cfg, grid + " --set checkpoint.load=" + ckpt.string() + " --set train.output_dir=" + out.string()),
      {.np = np});
  test::expect_refused(r, culprit);
  EXPECT_FALSE(fs::exists(out / "metrics.jsonl"));  // no step ran
}

TEST_F(CheckpointCli, DamagedTruncatedAndMissingFilesAreRefused) {
  const std::string dp2 = " --set parallel.dp=2 --set parallel.distributed_optimizer=true";
  auto r = run_tripod(
      train_args(cfg_, dp2 + " --set checkpoint.dir=" + (dir_ / "ck").string() +
                           " --set train.output_dir=" + (dir_ / "run").string() + " --set train.exit_interval=2"),
      {.np = 2});
  ASSERT_EQ(r.status, 0) << r.err;
  const fs::path good = dir_ / "ck" / "iter_0000002";
  auto copy = [&](const std::string& name) {
    fs::path d = dir_ / name;
    fs::copy(good, d);
    return d;
  };
  {  // bytes changed inside the values of the first file (in its middle dataset's data)
    fs::path d = copy("corrupt");
    fs::path f = d / "pp00_tp00_dp00.h5";
    int64_t at = -1;
    {
      auto pieces = H5Reader(f.string()).index();
      for (size_t i = pieces.size() / 2; i < pieces.size() && at < 0; ++i)
        if (pieces[i].offset >= 0 && pieces[i].spec.geom.numel() >= 2) at = pieces[i].offset;
    }
    ASSERT_GE(at, 0);
    std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(static_cast<std::streamoff>(at));
    io.write("\x13\x37\x13\x37\x13\x37\x13\x37", 8);
    io.close();
    expect_checkpoint_refused(cfg_, d, f.string(), "corrupted bytes", 2, dp2);
  }
  {
    fs::path d = copy("truncated");
    fs::path f = d / "pp00_tp00_dp01.h5";
    fs::resize_file(f, fs::file_size(f) / 2);
    expect_checkpoint_refused(cfg_, d, f.string(), "truncated file", 2, dp2);
  }
  {
    fs::path d = copy("missing");
    fs::remove(d / "pp00_tp00_dp01.h5");
    expect_checkpoint_refused(cfg_, d, (d / "pp00_tp00_dp01.h5").string(), "missing shard", 2, dp2);
  }
  {  // a format from the future
    fs::path d = copy("future");
    auto meta = nlohmann::json::parse(slurp(d / "metadata.json"));
    meta["format_version"] = 99;
    test::write_file(d / "metadata.json", meta.dump());
    expect_checkpoint_refused(cfg_, d, "format version 99", "future format");
  }
  {  // another model shape: the tensor at fault is named
    r = run_tripod(train_args(cfg_, "--set model.d_model=64 --set checkpoint.load=" + good.string()));
    EXPECT_EQ(r.status, 2);
    EXPECT_EQ(test::count_lines_starting(r.err, "error: "), 1) << r.err;
    EXPECT_NE(r.err.find("model.d_model = 32, this run's model has 64"), std::string::npos) << r.err;
  }
  EXPECT_EQ(run_tripod("ckpt verify " + good.string()).status, 0);  // the original is untouched
}

TEST_F(CheckpointCli, AFullDiskIsNamedAndThePreviousCheckpointStays) {
  // The size of one checkpoint, then a file system (a tmpfs in a mount namespace of our own) with
  // room for one and a half of them: the second save runs out of space.
  auto r = run_tripod(train_args(cfg_, " --set checkpoint.dir=" + (dir_ / "probe").string() +
                                           " --set train.output_dir=" + (dir_ / "run").string() +
                                           " --set train.exit_interval=2"));
  ASSERT_EQ(r.status, 0) << r.err;
  const auto one = fs::file_size(dir_ / "probe" / "iter_0000002" / "pp00_tp00_dp00.h5");
  const fs::path mnt = dir_ / "mnt", ck = mnt / "ckpt";
  fs::create_directories(mnt);
  const std::string common =
      " --set checkpoint.dir=" + ck.string() + " --set train.output_dir=" + (dir_ / "run").string();
  const std::string script =
      "mount -t tmpfs -o size=" + std::to_string(one * 3 / 2) + " tmpfs " + mnt.string() + " || exit 77; " +
      test::tripod_cmd(train_args(cfg_, common + " --set train.exit_interval=2")) + " 2>/dev/null || exit 78; " +
      test::tripod_cmd(train_args(cfg_, common + " --set checkpoint.load=latest --set train.exit_interval=4")) +
      "; echo status $? >&2; cat " + (ck / "latest").string() + " >&2; " +
      test::tripod_cmd("ckpt verify " + ck.string()) + " >/dev/null && echo verified >&2";
  test::write_file(dir_ / "full.sh", script);
  r = run_cmd("unshare -rm sh " + (dir_ / "full.sh").string());
  if (r.status == 77 || r.err.find("unshare") != std::string::npos) GTEST_SKIP() << "no tmpfs mount here: " << r.err;
  ASSERT_NE(r.status, 78) << r.err;
  EXPECT_NE(r.err.find("status 1"), std::string::npos) << r.err;
  EXPECT_EQ(test::count_lines_starting(r.err, "error: "), 1) << r.err;
  EXPECT_NE(r.err.find("No space left on device"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("iter_0000004.tmp/pp00_tp00_dp00.h5"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("check failed"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("iter_0000002\nverified"), std::string::npos) << "the previous checkpoint: " << r.err;
}

TEST_F(CheckpointCli, ADivergedRunCommitsItsAsyncSaveAndExits1) {
  const fs::path ck = dir_ / "ckpt";
  auto r = run_tripod(
      train_args(cfg_, " --set checkpoint.dir=" + ck.string() + " --set train.output_dir=" + (dir_ / "run").string() +
                           " --set checkpoint.interval=2 --set checkpoint.async=true"),
      {.env = "TRIPOD_INJECT_NAN=loss@3,loss@4,loss@5"});
  EXPECT_EQ(r.status, 1) << r.err;  // a failure, not bad input
  EXPECT_EQ(test::count_lines_starting(r.err, "error: "), 1) << r.err;
  // The save of step 4 was still in flight when step 5 stopped the run: it is committed, and it
  // is the checkpoint the error names.
  EXPECT_NE(r.err.find("the last good checkpoint is " + (ck / "iter_0000004").string()), std::string::npos) << r.err;
  EXPECT_TRUE(fs::exists(ck / "iter_0000004" / "metadata.json"));
  EXPECT_EQ(slurp(ck / "latest"), "iter_0000004\n");
}

TEST_F(CheckpointCli, SafetensorsExportImportRoundTrips) {
  auto r = run_tripod(train_args(cfg_, "--set checkpoint.dir=" + (dir_ / "ck").string() + " --set train.output_dir=" +
                                           (dir_ / "run").string() + " --set train.exit_interval=3"));
  ASSERT_EQ(r.status, 0) << r.err;
  r = run_tripod("ckpt convert " + (dir_ / "ck").string() + " --to safetensors " + (dir_ / "a.safetensors").string());
  ASSERT_EQ(r.status, 0) << r.err;
  SafetensorsFile a = read_safetensors((dir_ / "a.safetensors").string());
  std::map<std::string, Shape> shapes;
  for (const auto& t : a.tensors) shapes[t.name] = t.shape;
  EXPECT_EQ(shapes["transformer.wte.weight"], Shape({100, 32}));  // unpadded vocabulary
  EXPECT_EQ(shapes["transformer.h.0.attn.c_attn.weight"], Shape({32, 96}));  // Conv1D (in, out)
  EXPECT_EQ(shapes["transformer.h.3.mlp.c_fc.weight"], Shape({32, 128}));
  EXPECT_EQ(shapes["transformer.h.3.attn.c_attn.bias"], Shape({96}));
  // HF's c_attn.weight[i][w*C + o] is tripod's qkv.weight[w][o][i].
  auto st = state((dir_ / "ck" / "iter_0000003").string());
  const auto& qkv = st["h.1.attn.qkv.weight/value"];
  for (const auto& t : a.tensors)
    if (t.name == "transformer.h.1.attn.c_attn.weight")
      for (int w : {0, 2}) {
        EXPECT_EQ(t.data[5 * 96 + w * 32 + 7], qkv[(w * 32 + 7) * 32 + 5]);
      }
  // Import, export again: the same tensors, bit for bit.
  r = run_tripod("ckpt convert " + (dir_ / "a.safetensors").string() + " --from safetensors " +
                 (dir_ / "imported").string() + " --n-heads 4");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(run_tripod("ckpt verify " + (dir_ / "imported").string()).status, 0);
  r = run_tripod("ckpt convert " + (dir_ / "imported").string() + " --to safetensors " +
                 (dir_ / "b.safetensors").string());
  ASSERT_EQ(r.status, 0) << r.err;
  SafetensorsFile b = read_safetensors((dir_ / "b.safetensors").string());
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    EXPECT_EQ(a.tensors[i].name, b.tensors[i].name);
    EXPECT_TRUE(a.tensors[i].data == b.tensors[i].data) << a.tensors[i].name;
  }
  // Training starts from the imported weights on a grid with another vocabulary padding.
  r = run_tripod(train_args(cfg_, "--set parallel.tp=2 --set checkpoint.load=" + (dir_ / "imported").string() +
                                      " --set train.output_dir=" + (dir_ / "run2").string()),
                 {.np = 2});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("parameters only"), std::string::npos) << r.err;
  // Refusals: an existing output, a file that is not safetensors.
  r = run_tripod("ckpt convert " + (dir_ / "ck").string() + " --to safetensors " + (dir_ / "a.safetensors").string());
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("refusing to overwrite"), std::string::npos) << r.err;
  test::write_file(dir_ / "bad.safetensors", "not a safetensors file at all");
  r = run_tripod("ckpt convert " + (dir_ / "bad.safetensors").string() + " --from safetensors " +
                 (dir_ / "x").string());
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("bad.safetensors"), std::string::npos) << r.err;
}

// A Llama-family model: the checkpoint becomes a Hugging Face LlamaForCausalLM folder
// (config.json, model.safetensors with HF names and shapes) and comes back bit-identical; with
// as many key/value heads as query heads the fused QKV is split into q_proj, k_proj, v_proj and
// joined again.
TEST_F(CheckpointCli, LlamaSafetensorsFolderRoundTripsBitIdentically) {
  for (int kv : {2, 4}) {
    SCOPED_TRACE(kv);
    const fs::path d = dir_ / std::to_string(kv);
    const std::string llama = "--set model.arch=llama --set model.n_kv_heads=" + std::to_string(kv) +
                              " --set model.rope_theta=500000.0 --set parallel.tp=2";
    auto r = run_tripod(train_args(cfg_, llama + " --set checkpoint.dir=" + (d / "ck").string() +
                                             " --set train.output_dir=" + (d / "run").string() +
                                             " --set train.exit_interval=2"),
                        {.np = 2});
    ASSERT_EQ(r.status, 0) << r.err;
    r = run_tripod("ckpt convert " + (d / "ck").string() + " --to safetensors " + (d / "hf").string());
    ASSERT_EQ(r.status, 0) << r.err;
    const auto cfg = nlohmann::json::parse(slurp(d / "hf" / "config.json"));
    EXPECT_EQ(cfg["model_type"], "llama");
    EXPECT_EQ(cfg["num_key_value_heads"], kv);
    EXPECT_EQ(cfg["intermediate_size"], 256);
    EXPECT_EQ(cfg["rope_theta"], 500000.0);
    EXPECT_EQ(cfg["tie_word_embeddings"], false);
    SafetensorsFile a = read_safetensors((d / "hf" / "model.safetensors").string());
    std::map<std::string, Shape> shapes;
    for (const auto& t : a.tensors) shapes[t.name] = t.shape;
    EXPECT_EQ(shapes["model.embed_tokens.weight"], Shape({100, 32}));
    EXPECT_EQ(shapes["lm_head.weight"], Shape({100, 32}));
    EXPECT_EQ(shapes["model.layers.3.self_attn.q_proj.weight"], Shape({32, 32}));
    EXPECT_EQ(shapes["model.layers.3.self_attn.k_proj.weight"], Shape({kv * 8, 32}));
    EXPECT_EQ(shapes["model.layers.0.mlp.down_proj.weight"], Shape({32, 256}));
    EXPECT_EQ(shapes["model.norm.weight"], Shape({32}));
    EXPECT_EQ(a.tensors.size(), 2u + 1u + 4u * 9u);
    r = run_tripod("ckpt convert " + (d / "hf").string() + " --from safetensors " + (d / "imported").string());
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(run_tripod("ckpt verify " + (d / "imported").string()).status, 0);
    r = run_tripod("ckpt convert " + (d / "imported").string() + " --to safetensors " + (d / "hf2").string());
    ASSERT_EQ(r.status, 0) << r.err;
    SafetensorsFile b = read_safetensors((d / "hf2" / "model.safetensors").string());
    ASSERT_EQ(a.tensors.size(), b.tensors.size());
    for (size_t i = 0; i < a.tensors.size(); ++i) {
      EXPECT_EQ(a.tensors[i].name, b.tensors[i].name);
      EXPECT_TRUE(a.tensors[i].data == b.tensors[i].data) << a.tensors[i].name;
    }
    // And the checkpoint values themselves are the trained ones, bit for bit.
    auto trained = state((d / "ck" / "iter_0000002").string()), imported = state((d / "imported" / "iter_0000000").string());
    for (const auto& [key, v] : imported) EXPECT_TRUE(trained[key] == v) << key;
  }
}

TEST_F(CheckpointCli, SigtermUnderMpirunSavesAndTheResumedRunContinuesExactly) {
  const std::string grid = " --set parallel.tp=2 --set train.steps=300 --set train.log_interval=1";
  auto r = run_tripod(train_args(cfg_, grid + " --set train.output_dir=" + (dir_ / "full").string()), {.np = 4});
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string common =
      grid + " --set checkpoint.dir=" + (dir_ / "ck").string() + " --set train.output_dir=" + (dir_ / "run").string();
  test::Background job(test::tripod_cmd(train_args(cfg_, common), {.np = 4}), dir_ / "log");
  ASSERT_TRUE(wait_for([&] { return losses(dir_ / "run").size() >= 5; }, 60)) << slurp(dir_ / "log");
  for (pid_t rank : children(job.pid())) kill(rank, SIGTERM);  // as a scheduler signals every task
  EXPECT_EQ(job.wait(300), 0) << job.log();
  const std::string log = slurp(dir_ / "log");
  EXPECT_NE(log.find("stop signal received: checkpoint saved after step"), std::string::npos) << log;
  const auto stopped = losses(dir_ / "run").size();
  ASSERT_LT(stopped, 300u) << "the run ended before the signal";
  EXPECT_EQ(slurp(dir_ / "ck" / "latest"), fmt::format("iter_{:07d}\n", stopped));
  r = run_tripod(train_args(cfg_, common + " --set checkpoint.load=latest"), {.np = 4});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(losses(dir_ / "run"), losses(dir_ / "full"));
}

}  // namespace
}  // namespace tripod
