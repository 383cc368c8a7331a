// Checkpoints through the executable: a run stopped and resumed in a fresh process continues
// bit-exactly (1 rank and 8 ranks, synchronous and asynchronous saves); a save killed with
// SIGKILL leaves the previous checkpoint intact; damaged, truncated and missing files are found
// by `ckpt verify` and refused by loads; safetensors export/import round-trips; SIGTERM under
// mpirun saves a checkpoint from which the run continues exactly.
#include <gtest/gtest.h>
#include <signal.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "checkpoint/reader.h"
#include "checkpoint/safetensors.h"
#include "cli_util.h"

namespace tripod {
namespace {

using test::slurp;

namespace fs = std::filesystem;
using test::run_cmd;

const char* kTiny = R"([model]
n_layers = 4
n_heads = 4
d_model = 32
seq_len = 16
vocab_size = 100
[train]
micro_batch_size = 1
global_batch_size = 8
steps = 6
lr = 3e-3
warmup_steps = 2
log_interval = 1
trace = false
[data]
synthetic = true
)";

const char* kGrid8 = " --set parallel.tp=2 --set parallel.pp=2 --set parallel.vp=2 --set parallel.schedule=interleaved"
                     " --set parallel.distributed_optimizer=true --set parallel.bucket_mb=0.01";

std::string train(int np, const fs::path& cfg, const std::string& extra) {
  return (np > 1 ? test::mpirun(np) : std::string("env OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 ")) +
         test::tripod_bin() + " train --config " + cfg.string() + " " + extra;
}

std::map<int64_t, double> losses(const fs::path& run_dir) {
  std::map<int64_t, double> out;
  std::ifstream in(run_dir / "metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    out[j["step"].get<int64_t>()] = j["loss"].get<double>();
  }
  return out;
}

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

// Starts `cmd` (through sh, which execs it) and returns its pid.
pid_t spawn(const std::string& cmd, const fs::path& log) {
  pid_t pid = fork();
  if (pid == 0) {
    std::string c = "exec " + cmd + " >" + log.string() + " 2>&1";
    execl("/bin/sh", "sh", "-c", c.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

int wait_exit(pid_t pid) {
  int raw = 0;
  waitpid(pid, &raw, 0);
  return WIFEXITED(raw) ? WEXITSTATUS(raw) : -WTERMSIG(raw);
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

void expect_resume_exact(int np, const std::string& grid, bool async, const fs::path& dir, const fs::path& full) {
  SCOPED_TRACE(fmt::format("np {} async {}", np, async));
  const fs::path ck = dir / "ckpt", run = dir / "run";
  const std::string common = grid + " --set checkpoint.dir=" + ck.string() + " --set train.output_dir=" + run.string() +
                             (async ? " --set checkpoint.async=true" : "");
  auto r = run_cmd(train(np, dir.parent_path() / "c.toml", common + " --set train.exit_interval=3"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(slurp(ck / "latest"), "iter_0000003\n");
  r = run_cmd(train(np, dir.parent_path() / "c.toml", common + " --set checkpoint.load=latest"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("continuing at step 4"), std::string::npos) << r.err;
  EXPECT_EQ(losses(run), losses(full / "run"));  // steps 1-3 before the stop, 4-6 after
  EXPECT_TRUE(state((ck / "iter_0000006").string()) == state((full / "ckpt" / "iter_0000006").string()))
      << "weights or Adam moments differ after the resume";
}

TEST(CheckpointCli, ResumeInAFreshProcessIsBitExact) {
  auto dir = test::scratch_dir("ckpt_resume");
  test::write_file(dir / "c.toml", kTiny);
  for (int np : {1, 8}) {
    const std::string grid = np == 8 ? kGrid8 : "";
    const fs::path full = dir / fmt::format("full{}", np);
    auto r = run_cmd(train(np, dir / "c.toml", grid + " --set checkpoint.dir=" + (full / "ckpt").string() +
                                               " --set train.output_dir=" + (full / "run").string()));
    ASSERT_EQ(r.status, 0) << r.err;
    ASSERT_EQ(losses(full / "run").size(), 6u);
    for (bool async : {false, true}) expect_resume_exact(np, grid, async, dir / fmt::format("r{}{}", np, async), full);
    auto v = run_cmd(test::tripod_bin() + " ckpt verify " + (full / "ckpt").string());
    EXPECT_EQ(v.status, 0) << v.err;
  }
  fs::remove_all(dir);
}

TEST(CheckpointCli, SigkillDuringASaveLeavesThePreviousCheckpointIntact) {
  auto dir = test::scratch_dir("ckpt_kill");
  test::write_file(dir / "c.toml", kTiny);
  const fs::path ck = dir / "ckpt";
  const std::string common = " --set checkpoint.dir=" + ck.string() + " --set train.output_dir=" + (dir / "run").string();
  auto r = run_cmd(train(1, dir / "c.toml", common + " --set train.exit_interval=2"));
  ASSERT_EQ(r.status, 0) << r.err;
  // The next save sleeps after its first dataset (a test hook); kill it there.
  pid_t pid = spawn("env TRIPOD_TEST_CKPT_SLEEP_MS=60000 " + train(1, dir / "c.toml", common +
                    " --set checkpoint.load=latest --set train.exit_interval=4"), dir / "log");
  const fs::path tmp = ck / "iter_0000004.tmp";
  ASSERT_TRUE(wait_for([&] { return fs::exists(tmp / "pp00_tp00_dp00.h5"); }, 60)) << slurp(dir / "log");
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  kill(pid, SIGKILL);
  EXPECT_EQ(wait_exit(pid), -SIGKILL);
  EXPECT_EQ(slurp(ck / "latest"), "iter_0000002\n");
  EXPECT_FALSE(fs::exists(ck / "iter_0000004"));
  EXPECT_FALSE(fs::exists(tmp / "metadata.json"));
  EXPECT_EQ(run_cmd(test::tripod_bin() + " ckpt verify " + ck.string()).status, 0);
  // The unfinished directory is never taken for a checkpoint.
  r = run_cmd(test::tripod_bin() + " ckpt verify " + tmp.string());
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("no metadata.json"), std::string::npos) << r.err;
  r = run_cmd(train(1, dir / "c.toml", common + " --set checkpoint.load=" + tmp.string()));
  EXPECT_EQ(r.status, 2) << r.err;
  // Resuming from latest works; the next save clears the leftover and, with keep = 1, removes
  // the older checkpoint only once the new one is complete.
  r = run_cmd(train(1, dir / "c.toml", common + " --set checkpoint.load=latest --set train.exit_interval=4"
                                                " --set checkpoint.keep=1"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("continuing at step 3"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(tmp));
  EXPECT_EQ(slurp(ck / "latest"), "iter_0000004\n");
  EXPECT_FALSE(fs::exists(ck / "iter_0000002"));
  EXPECT_TRUE(fs::exists(ck / "iter_0000004" / "metadata.json"));
  fs::remove_all(dir);
}

// Runs `verify` and a load of `ckpt`: both must fail naming `culprit`.
void expect_refused(const fs::path& cfg, const fs::path& ckpt, const std::string& culprit, const std::string& what,
                    int np = 1, const std::string& grid = "") {
  SCOPED_TRACE(what);
  auto v = run_cmd(test::tripod_bin() + " ckpt verify " + ckpt.string());
  EXPECT_NE(v.status, 0) << v.out;
  EXPECT_NE(v.err.find(culprit), std::string::npos) << v.err;
  const fs::path out = cfg.parent_path() / "refused_run";
  auto r = run_cmd(train(np, cfg, grid + " --set checkpoint.load=" + ckpt.string() + " --set train.output_dir=" +
                                      out.string()));
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_EQ(test::count_lines_starting(r.err, "error: "), 1) << r.err;
  EXPECT_NE(r.err.find(culprit), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out / "metrics.jsonl"));  // no step ran
}

TEST(CheckpointCli, DamagedTruncatedAndMissingFilesAreRefused) {
  auto dir = test::scratch_dir("ckpt_damage");
  test::write_file(dir / "c.toml", kTiny);
  const std::string dp2 = " --set parallel.dp=2 --set parallel.distributed_optimizer=true";
  auto r = run_cmd(train(2, dir / "c.toml", dp2 + " --set checkpoint.dir=" + (dir / "ck").string() +
                                            " --set train.output_dir=" + (dir / "run").string() +
                                            " --set train.exit_interval=2"));
  ASSERT_EQ(r.status, 0) << r.err;
  const fs::path good = dir / "ck" / "iter_0000002";
  auto copy = [&](const std::string& name) {
    fs::path d = dir / name;
    fs::copy(good, d);
    return d;
  };
  {  // bytes changed inside the values of the first file
    fs::path d = copy("corrupt");
    fs::path f = d / "pp00_tp00_dp00.h5";
    auto size = fs::file_size(f);
    std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(static_cast<std::streamoff>(size / 2));
    io.write("\x13\x37\x13\x37\x13\x37\x13\x37", 8);
    io.close();
    expect_refused(dir / "c.toml", d, f.string(), "corrupted bytes", 2, dp2);
  }
  {
    fs::path d = copy("truncated");
    fs::path f = d / "pp00_tp00_dp01.h5";
    fs::resize_file(f, fs::file_size(f) / 2);
    expect_refused(dir / "c.toml", d, f.string(), "truncated file", 2, dp2);
  }
  {
    fs::path d = copy("missing");
    fs::remove(d / "pp00_tp00_dp01.h5");
    expect_refused(dir / "c.toml", d, (d / "pp00_tp00_dp01.h5").string(), "missing shard", 2, dp2);
  }
  {  // a format from the future
    fs::path d = copy("future");
    auto meta = nlohmann::json::parse(slurp(d / "metadata.json"));
    meta["format_version"] = 99;
    test::write_file(d / "metadata.json", meta.dump());
    expect_refused(dir / "c.toml", d, "format version 99", "future format");
  }
  {  // another model shape: the tensor at fault is named
    r = run_cmd(train(1, dir / "c.toml", "--set model.d_model=64 --set checkpoint.load=" + good.string()));
    EXPECT_EQ(r.status, 2);
    EXPECT_EQ(test::count_lines_starting(r.err, "error: "), 1) << r.err;
    EXPECT_NE(r.err.find("tensor wte is (100, 32) there but (100, 64)"), std::string::npos) << r.err;
  }
  EXPECT_EQ(run_cmd(test::tripod_bin() + " ckpt verify " + good.string()).status, 0);  // the original is untouched
  fs::remove_all(dir);
}

TEST(CheckpointCli, SafetensorsExportImportRoundTrips) {
  auto dir = test::scratch_dir("ckpt_st");
  test::write_file(dir / "c.toml", kTiny);
  auto r = run_cmd(train(1, dir / "c.toml", "--set checkpoint.dir=" + (dir / "ck").string() +
                                            " --set train.output_dir=" + (dir / "run").string() +
                                            " --set train.exit_interval=3"));
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string bin = test::tripod_bin();
  r = run_cmd(bin + " ckpt convert " + (dir / "ck").string() + " --to safetensors " + (dir / "a.safetensors").string());
  ASSERT_EQ(r.status, 0) << r.err;
  SafetensorsFile a = read_safetensors((dir / "a.safetensors").string());
  std::map<std::string, Shape> shapes;
  for (const auto& t : a.tensors) shapes[t.name] = t.shape;
  EXPECT_EQ(shapes["transformer.wte.weight"], Shape({100, 32}));  // unpadded vocabulary
  EXPECT_EQ(shapes["transformer.h.0.attn.c_attn.weight"], Shape({32, 96}));  // Conv1D (in, out)
  EXPECT_EQ(shapes["transformer.h.3.mlp.c_fc.weight"], Shape({32, 128}));
  EXPECT_EQ(shapes["transformer.h.3.attn.c_attn.bias"], Shape({96}));
  // HF's c_attn.weight[i][w*C + o] is tripod's qkv.weight[w][o][i].
  auto st = state((dir / "ck" / "iter_0000003").string());
  const auto& qkv = st["h.1.attn.qkv.weight/value"];
  for (const auto& t : a.tensors)
    if (t.name == "transformer.h.1.attn.c_attn.weight")
      for (int w : {0, 2}) {
        EXPECT_EQ(t.data[5 * 96 + w * 32 + 7], qkv[(w * 32 + 7) * 32 + 5]);
      }
  // Import, export again: the same tensors, bit for bit.
  r = run_cmd(bin + " ckpt convert " + (dir / "a.safetensors").string() + " --from safetensors " +
              (dir / "imported").string() + " --n-heads 4");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(run_cmd(bin + " ckpt verify " + (dir / "imported").string()).status, 0);
  r = run_cmd(bin + " ckpt convert " + (dir / "imported").string() + " --to safetensors " + (dir / "b.safetensors").string());
  ASSERT_EQ(r.status, 0) << r.err;
  SafetensorsFile b = read_safetensors((dir / "b.safetensors").string());
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    EXPECT_EQ(a.tensors[i].name, b.tensors[i].name);
    EXPECT_TRUE(a.tensors[i].data == b.tensors[i].data) << a.tensors[i].name;
  }
  // Training starts from the imported weights on a grid with another vocabulary padding.
  r = run_cmd(train(2, dir / "c.toml", "--set parallel.tp=2 --set checkpoint.load=" + (dir / "imported").string() +
                                       " --set train.output_dir=" + (dir / "run2").string()));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("parameters only"), std::string::npos) << r.err;
  // Refusals: an existing output, a file that is not safetensors.
  r = run_cmd(bin + " ckpt convert " + (dir / "ck").string() + " --to safetensors " + (dir / "a.safetensors").string());
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("refusing to overwrite"), std::string::npos) << r.err;
  test::write_file(dir / "bad.safetensors", "not a safetensors file at all");
  r = run_cmd(bin + " ckpt convert " + (dir / "bad.safetensors").string() + " --from safetensors " +
              (dir / "x").string());
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("bad.safetensors"), std::string::npos) << r.err;
  fs::remove_all(dir);
}

// A Llama-family model: the checkpoint becomes a Hugging Face LlamaForCausalLM folder
// (config.json, model.safetensors with HF names and shapes) and comes back bit-identical; with
// as many key/value heads as query heads the fused QKV is split into q_proj, k_proj, v_proj and
// joined again.
TEST(CheckpointCli, LlamaSafetensorsFolderRoundTripsBitIdentically) {
  auto dir = test::scratch_dir("ckpt_llama_st");
  test::write_file(dir / "c.toml", std::string(kTiny) + "");
  const std::string bin = test::tripod_bin();
  for (int kv : {2, 4}) {
    SCOPED_TRACE(kv);
    const fs::path d = dir / std::to_string(kv);
    auto r = run_cmd(train(2, dir / "c.toml", "--set model.arch=llama --set model.n_kv_heads=" + std::to_string(kv) +
                                                  " --set model.rope_theta=500000.0 --set parallel.tp=2"
                                                  " --set checkpoint.dir=" + (d / "ck").string() +
                                                  " --set train.output_dir=" + (d / "run").string() +
                                                  " --set train.exit_interval=2"));
    ASSERT_EQ(r.status, 0) << r.err;
    r = run_cmd(bin + " ckpt convert " + (d / "ck").string() + " --to safetensors " + (d / "hf").string());
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
    r = run_cmd(bin + " ckpt convert " + (d / "hf").string() + " --from safetensors " + (d / "imported").string());
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(run_cmd(bin + " ckpt verify " + (d / "imported").string()).status, 0);
    r = run_cmd(bin + " ckpt convert " + (d / "imported").string() + " --to safetensors " + (d / "hf2").string());
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
  fs::remove_all(dir);
}

TEST(CheckpointCli, SigtermUnderMpirunSavesAndTheResumedRunContinuesExactly) {
  auto dir = test::scratch_dir("ckpt_sigterm");
  test::write_file(dir / "c.toml", kTiny);
  const std::string grid = " --set parallel.tp=2 --set train.steps=300 --set train.log_interval=1";
  auto r = run_cmd(train(4, dir / "c.toml", grid + " --set train.output_dir=" + (dir / "full").string()));
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string common = grid + " --set checkpoint.dir=" + (dir / "ck").string() + " --set train.output_dir=" +
                             (dir / "run").string();
  pid_t pid = spawn(train(4, dir / "c.toml", common), dir / "log");
  ASSERT_TRUE(wait_for([&] { return losses(dir / "run").size() >= 5; }, 60)) << slurp(dir / "log");
  for (pid_t rank : children(pid)) kill(rank, SIGTERM);  // as a scheduler signals every task
  EXPECT_EQ(wait_exit(pid), 0) << slurp(dir / "log");
  const std::string log = slurp(dir / "log");
  EXPECT_NE(log.find("stop signal received: checkpoint saved after step"), std::string::npos) << log;
  const auto stopped = losses(dir / "run").size();
  ASSERT_LT(stopped, 300u) << "the run ended before the signal";
  EXPECT_EQ(slurp(dir / "ck" / "latest"), fmt::format("iter_{:07d}\n", stopped));
  r = run_cmd(train(4, dir / "c.toml", common + " --set checkpoint.load=latest"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(losses(dir / "run"), losses(dir / "full"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tripod
