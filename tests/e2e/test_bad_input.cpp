// The bad-input battery: over a hundred careless commands and damaged files (configs, data,
// checkpoints, safetensors, schedules, faults, the CLI; alone and under mpirun). Each must end
// with exit status 2, exactly one line on stderr starting "error:" that names the key or file,
// no crash and no hang, and leave every file that existed before it byte-for-byte unchanged.
// One process runs every case over fixtures built once (a dataset, a tokenizer, a checkpoint).
#include <functional>
#include <map>
#include <tuple>

#include "checkpoint/metadata.h"
#include "data/hash.h"
#include "e2e_test.h"

namespace tripod {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::run_tripod;
using test::slurp;
using test::write_file;

std::string q(const fs::path& p) { return test::shell_quote(p.string()); }

// Every file under `root` and a hash of its bytes.
std::map<std::string, uint64_t> snapshot(const fs::path& root) {
  std::map<std::string, uint64_t> out;
  for (const auto& e : fs::recursive_directory_iterator(root))
    if (e.is_regular_file()) out[e.path().string()] = hash_string(slurp(e.path()));
  return out;
}

class BadInput : public ::testing::Test {
 protected:
  static inline fs::path dir, fx;  // scratch; fx: the fixtures whose bytes every case must leave alone
  static inline int cases = 0;
  static inline std::string base;  // the tiny config (synthetic data)

  static void SetUpTestSuite() {
    dir = test::scratch_dir("bad_input");
    fx = dir / "fx";
    fs::create_directories(fx);
    // Smaller still than the other end-to-end tests' model: a hundred runs of it.
    const test::ConfigOverrides small = {
        {"model.n_heads", "2"},      {"model.d_model", "16"},         {"model.seq_len", "8"},
        {"model.vocab_size", "512"}, {"train.micro_batch_size", "1"}, {"train.global_batch_size", "2"},
        {"train.steps", "2"},        {"train.trace", "false"}};
    base = test::tiny_config(small);
    write_file(fx / "base.toml", base);
    const std::string src = std::string(TRIPOD_SOURCE_PATH) + "/tests/fixtures/data/genesis_1_8.jsonl";
    must("data train-tokenizer --input " + q(src) + " --vocab-size 400 --model-prefix " + q(fx / "tok"));
    must("data preprocess --input " + q(src) + " --tokenizer-model " + q(fx / "tok.model") + " --output-prefix " +
         q(fx / "gen") + " --workers 1");
    must("data preprocess --input " + q(src) + " --tokenizer-model " + q(fx / "tok.model") + " --output-prefix " +
         q(fx / "gen_noeod") + " --workers 1 --no-eod");
    test::ConfigOverrides data = small;
    data.insert(data.end(), {{"data.synthetic", ""},
                             {"data.prefixes", "[" + json((fx / "gen").string()).dump() + "]"},
                             {"data.tokenizer", json((fx / "tok.model").string()).dump()}});
    write_file(fx / "data.toml", test::tiny_config(data));
    must("train --config " + q(fx / "base.toml") + " --set train.output_dir=" + q(dir / "runs/fixture") +
         " --set checkpoint.dir=" + q(fx / "ck") + " --set checkpoint.interval=1");
    must("train --config " + q(fx / "data.toml") + " --set train.output_dir=" + q(dir / "runs/fixture_data"));
    must("train --config " + q(fx / "base.toml") + " --set train.output_dir=" + q(dir / "runs/profiled") +
         " --profile-steps 1");
    must("ckpt convert " + q(fx / "ck") + " --to safetensors " + q(fx / "model.safetensors"));
    // A Llama-family checkpoint and its Hugging Face folder (config.json + model.safetensors).
    test::ConfigOverrides llama = small;
    llama.emplace_back("model.arch", "\"llama\"");
    write_file(fx / "llama.toml", test::tiny_config(llama));
    must("train --config " + q(fx / "llama.toml") + " --set train.output_dir=" + q(dir / "runs/fixture_llama") +
         " --set checkpoint.dir=" + q(fx / "ckl"));
    must("ckpt convert " + q(fx / "ckl") + " --to safetensors " + q(fx / "llama_hf"));
  }
  static void TearDownTestSuite() {
    std::printf("bad-input battery: %d cases\n", cases);
    fs::remove_all(dir);
  }

  static void must(const std::string& args) {
    auto r = run_tripod(args);
    ASSERT_EQ(r.status, 0) << args << "\n" << r.err;
  }
  static fs::path ck_iter() { return fx / "ck" / "iter_0000002"; }

  // A copy of the checkpoint root under fx/cases/NAME, with `edit` applied to its newest
  // checkpoint; returns the copy's root.
  static fs::path damaged_checkpoint(const std::string& name, const std::function<void(const fs::path&)>& edit) {
    fs::path root = fx / "cases" / name;
    fs::create_directories(root);
    fs::copy(fx / "ck", root, fs::copy_options::recursive);
    edit(root / "iter_0000002");
    return root;
  }
  // A checkpoint whose metadata.json is changed by `edit`, its checksum recomputed (so the field
  // checks themselves are reached) unless `keep_checksum`.
  static fs::path edited_metadata(const std::string& name, const std::function<void(json&)>& edit,
                                  bool keep_checksum = false) {
    return damaged_checkpoint(name, [&](const fs::path& it) {
      json m = json::parse(slurp(it / "metadata.json"));
      edit(m);
      if (!keep_checksum) m["metadata_crc32c"] = metadata_checksum(m);
      write_file(it / "metadata.json", m.dump(2));
    });
  }
  // A copy of the dataset as fx/cases/NAME.{bin,idx}, with `edit` applied to (idx, bin) bytes.
  static fs::path damaged_dataset(const std::string& name,
                                  const std::function<void(std::string&, std::string&)>& edit) {
    std::string idx = slurp(fx / "gen.idx"), bin = slurp(fx / "gen.bin");
    edit(idx, bin);
    fs::create_directories(fx / "cases");
    fs::path prefix = fx / "cases" / name;
    std::ofstream(prefix.string() + ".idx", std::ios::binary) << idx;
    std::ofstream(prefix.string() + ".bin", std::ios::binary) << bin;
    return prefix;
  }
  // A safetensors file (fx/cases/NAME.safetensors) with its JSON header changed by `edit`.
  static fs::path edited_safetensors(const std::string& name, const std::function<void(json&)>& edit) {
    std::string all = slurp(fx / "model.safetensors");
    uint64_t len = 0;
    std::memcpy(&len, all.data(), 8);
    json h = json::parse(all.substr(8, len));
    edit(h);
    std::string hs = h.dump();
    uint64_t n = hs.size();
    std::string out(reinterpret_cast<const char*>(&n), 8);
    out += hs + all.substr(8 + len);
    fs::create_directories(fx / "cases");
    fs::path p = fx / "cases" / (name + ".safetensors");
    std::ofstream(p, std::ios::binary) << out;
    return p;
  }
  // A copy of the Llama folder as fx/cases/NAME with its config.json changed by `edit`.
  static fs::path edited_hf_config(const std::string& name, const std::function<void(json&)>& edit) {
    const fs::path d = fx / "cases" / name;
    fs::create_directories(d);
    fs::copy(fx / "llama_hf", d, fs::copy_options::recursive);
    json c = json::parse(slurp(d / "config.json"));
    edit(c);
    write_file(d / "config.json", c.dump(2));
    return d;
  }
  static fs::path file(const std::string& name, const std::string& text) {
    fs::create_directories(fx / "cases");
    write_file(fx / "cases" / name, text);
    return fx / "cases" / name;
  }

  // Runs `tripod ARGS` (under mpirun with np > 1; with `env` in front) and checks the refusal.
  void refused(const std::string& args, const std::string& needle, int np = 1, const std::string& env = "") {
    ++cases;
    const auto before = snapshot(fx);
    const auto r = run_tripod(args, {.np = np, .env = env, .timeout_s = 60});
    SCOPED_TRACE("tripod " + args + (np > 1 ? " (" + std::to_string(np) + " ranks)" : ""));
    EXPECT_EQ(r.status, 2) << r.err;
    EXPECT_EQ(test::count_lines_starting(r.err, "error:"), 1) << r.err;
    const size_t at = r.err.find("error:");
    const std::string line = at == std::string::npos ? "" : r.err.substr(at, r.err.find('\n', at) - at);
    EXPECT_NE(line.find(needle), std::string::npos) << "the error line does not name '" << needle << "': " << line;
    for (const char* crash : {"Sanitizer", "terminate called", "Segmentation", "Aborted", "core dumped",
                              "json.exception", "stoi", "check failed"})
      EXPECT_EQ(r.err.find(crash), std::string::npos) << r.err;
    const auto after = snapshot(fx);
    for (const auto& [path, h] : before) {
      auto it = after.find(path);
      EXPECT_TRUE(it != after.end() && it->second == h) << path << " was changed or removed";
    }
  }
  std::string cfg(const std::string& sets = "", const std::string& config = "base.toml") {
    return "--config " + q(fx / config) + " --set train.output_dir=" + q(dir / "runs" / std::to_string(cases)) +
           " " + sets;
  }
  std::string train(const std::string& sets, const std::string& config = "base.toml") {
    return "train " + cfg(sets, config);
  }
};

TEST_F(BadInput, Battery) {
  // ---- the command line --------------------------------------------------------------------
  refused("frobnicate", "frobnicate");
  refused("ckpt frobnicate", "frobnicate");
  refused("data frobnicate", "frobnicate");
  refused("train", "--config");
  refused("train --config " + q(fx), "is a directory");
  refused("train --config " + q(dir / "missing.toml"), "missing.toml");
  refused("eval " + cfg("--init-seed 1 --samples 0"), "--samples");
  refused("eval " + cfg("--init-seed 1 --samples -5"), "--samples");
  refused("eval " + cfg("--init-seed 1 --samples lots"), "--samples");
  refused("eval " + cfg("--init-seed 1 --load " + q(fx / "ck")), "--load");
  refused("eval " + cfg("--init-seed 1 --split train"), "--split");
  refused("generate " + cfg("--init-seed 1 --prompt hi --max-tokens 0", "data.toml"), "--max-tokens 0");
  refused("generate " + cfg("--init-seed 1 --prompt hi --temperature nan", "data.toml"), "--temperature");
  refused("generate " + cfg("--init-seed 1 --prompt hi --temperature -1", "data.toml"), "--temperature");
  refused("generate " + cfg("--init-seed 1 --prompt hi --top-p 0", "data.toml"), "--top-p");
  refused("generate " + cfg("--init-seed 1 --prompt hi --top-p 1.5", "data.toml"), "--top-p");
  refused("generate " + cfg("--init-seed 1 --prompt hi --top-k -1", "data.toml"), "--top-k");
  refused("generate " + cfg("--init-seed 1 --prompt ''", "data.toml"), "--prompt");
  refused("schedule --kind 1f1b --pp 0 --microbatches 4", "pp = 0");
  refused("schedule --kind 1f1b --pp 2 --microbatches 0", "microbatches = 0");
  refused("schedule --kind zigzag --pp 2 --microbatches 4", "zigzag");
  refused("schedule --kind 1f1b --pp 2 --microbatches 4 --forward-cost inf", "forward inf");
  refused("data train-tokenizer --input " + q(fx / "base.toml") + " --vocab-size 1 --model-prefix " +
              q(dir / "t2"), "--vocab-size 1");
  refused("data train-tokenizer --input " + q(fx / "base.toml") + " --vocab-size 100 --threads -4 --model-prefix " +
              q(dir / "t2"), "--threads -4");
  refused("data inspect " + q(fx / "nothing"), "nothing");
  refused("data inspect " + q(fx / "gen") + " --show-document -2", "--show-document");
  refused("data inspect " + q(fx / "gen") + " --show-document 100000", "--show-document");
  refused("ckpt inspect " + q(dir / "no_such_ckpt"), "no_such_ckpt");
  refused("ckpt verify " + q(fx / "cases"), "cases");
  refused("ckpt convert " + q(fx / "ck") + " --to onnx " + q(dir / "out.onnx"), "--to");
  refused("ckpt convert " + q(fx / "model.safetensors") + " --from safetensors " + q(fx / "ck"), "ck");
  refused("ckpt convert " + q(fx / "ck") + " --to safetensors " + q(fx / "model.safetensors"), "model.safetensors");
  // Output paths that cannot be written: named before anything is read or written.
  refused("ckpt convert " + q(fx / "ck") + " --to safetensors " + q(dir / "no_folder" / "m.safetensors"),
          "no_folder does not exist");
  refused("ckpt convert " + q(fx / "ckl") + " --to safetensors " + q(fx / "base.toml" / "hf"), "base.toml is a file");
  refused("ckpt convert " + q(fx / "model.safetensors") + " --from safetensors " + q(file("out_file", "")),
          "out_file: is a file");
  refused("ckpt convert " + q(fx / "llama_hf") + " --from safetensors " + q(fx / "base.toml"), "base.toml: is a file");
  refused("data train-tokenizer --input " + q(fx / "base.toml") + " --vocab-size 100 --model-prefix " +
              q(dir / "no_folder" / "t"), "--model-prefix " + (dir / "no_folder" / "t.model").string());
  refused("data preprocess --input " + q(fx / "base.toml") + " --tokenizer-model " + q(fx / "tok.model") +
              " --output-prefix " + q(fx / "base.toml" / "gen"), "base.toml is a file");
  refused(train("--profile-steps -2"), "train.profile_steps");
  refused(train("--profile-steps many"), "--profile-steps");
  // tripod plan --check: a run not profiled, a damaged record, flags of the layout search with it.
  refused("plan --check " + q(dir / "runs" / "fixture"), "plan_check.json does not exist");
  refused("plan --check " + q(dir / "runs" / "profiled") + " --gpus 8", "--check");
  refused("plan --check " + q(dir / "runs" / "profiled") + " --hardware " + q(fx / "cases" / "none.toml"), "none.toml");
  refused("plan --config " + q(fx / "base.toml") + " --gpus 1", "--hardware");
  for (auto [name, edit, needle] : std::vector<std::tuple<std::string, std::function<void(json&)>, std::string>>{
           {"no_gemm", [](json& j) { j.erase("gemm"); }, "gemm must be an object"},
           {"neg_step", [](json& j) { j["step"]["measured"] = -1; }, "step: measured = -1"},
           {"version", [](json& j) { j["version"] = 7; }, "version must be 1"},
           {"ranks", [](json& j) { j["ranks"] = json::array(); }, "ranks must list the 1 ranks"},
           {"layout", [](json& j) { j["layout"]["tp"] = 0; }, "layout.tp"}}) {
    const fs::path run = fx / "cases" / ("check_" + name);
    fs::create_directories(run);
    json j = json::parse(slurp(dir / "runs" / "profiled" / "plan_check.json"));
    edit(j);
    write_file(run / "plan_check.json", j.dump());
    refused("plan --check " + q(run), needle);
  }
  fs::create_directories(fx / "cases" / "check_text");
  refused("plan --check " + q(file("check_text/plan_check.json", "{\"version\": 1,").parent_path()), "not JSON");
  refused("calibrate --out " + q(dir / "no_folder" / "hw.toml"), "--out " + (dir / "no_folder" / "hw.toml").string());
  refused("calibrate --force --out " + q(fx), "is a folder");
  refused("report " + q(dir / "runs" / "fixture") + " --out " + q(dir / "no_folder" / "r.html"), "no_folder");
  EXPECT_FALSE(fs::exists(dir / "no_folder"));
  refused(train("--set nonsense"), "--set");
  refused(train("--set nosuch.key=1"), "nosuch");

  // ---- config keys ---------------------------------------------------------------------------
  for (auto [set, key] : std::vector<std::pair<std::string, std::string>>{
           {"model.n_layers=0", "model.n_layers"}, {"model.n_heads=0", "model.n_heads"},
           {"model.d_model=0", "model.d_model"}, {"model.n_heads=3", "model.n_heads"},
           {"model.ffn_hidden=-1", "model.ffn_hidden"}, {"model.seq_len=0", "model.seq_len"},
           {"model.max_positions=4", "model.seq_len"}, {"model.vocab_size=1", "model.vocab_size"},
           {"model.bogus=1", "model.bogus"}, {"model.n_layers=1.5", "model.n_layers"},
           {"train.lr=inf", "train.lr"}, {"train.lr=nan", "train.lr"}, {"train.lr=-1", "train.lr"},
           {"train.lr=0", "train.lr"}, {"train.lr='fast'", "train.lr"}, {"train.min_lr=1", "train.min_lr"},
           {"train.min_lr=-inf", "train.min_lr"}, {"train.eps=inf", "train.eps"}, {"train.eps=0", "train.eps"},
           {"train.beta1=1", "train.beta1"}, {"train.beta2=-0.1", "train.beta2"}, {"train.beta1=nan", "train.beta1"},
           {"train.weight_decay=-1", "train.weight_decay"}, {"train.weight_decay=inf", "train.weight_decay"},
           {"train.grad_clip=-1", "train.grad_clip"}, {"train.grad_clip=nan", "train.grad_clip"},
           {"train.steps=0", "train.steps"}, {"train.steps='ten'", "train.steps"},
           {"train.micro_batch_size=0", "train.micro_batch_size"},
           {"train.micro_batch_size=2 --set train.global_batch_size=3", "train.global_batch_size"},
           {"train.warmup_steps=-1", "train.warmup_steps"}, {"train.decay='exp'", "train.decay"},
           {"train.device='tpu'", "train.device"}, {"train.log_interval=0", "train.log_interval"},
           {"train.eval_steps=0", "train.eval_steps"}, {"train.max_bad_steps=0", "train.max_bad_steps"},
           {"train.seed=-1", "train.seed"}, {"train.trace=3", "train.trace"},
           {"parallel.tp=0", "parallel.tp"}, {"parallel.pp=0", "parallel.pp"}, {"parallel.tp=2", "parallel.tp"},
           {"parallel.vp=2", "parallel.vp"}, {"parallel.schedule='zigzag'", "parallel.schedule"},
           {"parallel.bucket_mb=0", "parallel.bucket_mb"}, {"parallel.bucket_mb=inf", "parallel.bucket_mb"},
           {"parallel.timeout_s=-1", "parallel.timeout_s"}, {"parallel.timeout_s=nan", "parallel.timeout_s"},
           {"parallel.flight_recorder_size=-1", "parallel.flight_recorder_size"},
           {"parallel.cp=0", "parallel.cp"}, {"parallel.cp=2", "parallel.cp"},
           {"parallel.cp_comm='tree'", "parallel.cp_comm"},
           {"parallel.layers_per_stage=[1,5]", "layers_per_stage"},
           {"parallel.layers_per_stage='autp'", "layers_per_stage = \"autp\" is not valid: give \"auto\""},
           {"recompute.mode='some'", "recompute.mode"},
           {"recompute.num_layers=-2", "recompute.num_layers"}, {"data.weights=[nan]", "data.weights"},
           {"data.synthetic=false", "data.prefixes"}, {"checkpoint.interval=-1", "checkpoint.interval"},
           {"checkpoint.keep=-1", "checkpoint.keep"}, {"checkpoint.interval=1", "checkpoint.dir"},
           {"checkpoint.overwrite=2", "checkpoint.overwrite"}, {"train.profile_steps=-1", "train.profile_steps"},
           {"train.profile_steps=5000", "train.profile_steps"}})
    refused(train("--set " + set), key);
  // FP8 (train.precision = "fp8"): cuBLASLt's FP8 GEMMs take dimensions that are multiples of 16.
  const std::string fp8 = "--set train.precision=fp8 --set train.micro_batch_size=2 --set train.global_batch_size=2 "
                          "--set model.seq_len=8 ";
  for (auto [set, key] : std::vector<std::pair<std::string, std::string>>{
           {fp8 + "--set model.d_model=24", "model.d_model = 24 must be a multiple of 16"},
           {fp8 + "--set model.ffn_hidden=40", "model.ffn_hidden = 40 must be a multiple of 16"},
           {"--set train.fp8_recipe='hybrid'", "train.fp8_recipe = \"hybrid\" is not one of \"tensorwise\", \"delayed\""},
           {"--set train.fp8_amax_history=0", "train.fp8_amax_history"},
           {"--set train.precision='fp16'", "train.precision = \"fp16\" is not one of \"bf16\", \"fp8\""},
           {"--set train.fp8_margin=-1", "train.fp8_margin"},
           {fp8 + "--set train.fp8_bf16_layers=1", "train.fp8_bf16_layers = 1"},
           {"--set train.precision=fp8", "tokens must be a multiple of 16"}})
    refused(train(set), key);
  refused(train(fp8 + "--set parallel.tp=2"), "parallel.tp = 2 splits", 2);
  refused("train --config " + q(file("syntax.toml", "[model\nn_layers = 2\n")), "syntax.toml");
  refused("train --config " + q(file("section.toml", base + "[optimizer]\nlr = 1\n")), "[optimizer]");
  refused("train --config " + q(file("table.toml", "model = 3\n")), "model");

  // ---- data files ----------------------------------------------------------------------------
  auto with_data = [&](const fs::path& prefix) {
    return train("--set data.synthetic=false --set data.prefixes=" + q(prefix.string()));
  };
  refused(with_data(fx / "cases" / "absent"), "absent");
  refused(with_data(damaged_dataset("short_bin", [](std::string&, std::string& bin) { bin.resize(bin.size() / 2); })),
          "short_bin");
  refused(with_data(damaged_dataset("magic", [](std::string& idx, std::string&) { idx[0] = 'X'; })), "magic");
  refused(with_data(damaged_dataset("short_idx", [](std::string& idx, std::string&) { idx.resize(20); })), "short_idx");
  refused(with_data(damaged_dataset("version", [](std::string& idx, std::string&) { idx[9] = 99; })), "version");
  refused(with_data(damaged_dataset("dtype", [](std::string& idx, std::string&) { idx[17] = 7; })), "dtype");
  refused(with_data(damaged_dataset("seqcount", [](std::string& idx, std::string&) { idx[18] = 0x7f; })), "seqcount");
  refused(with_data(damaged_dataset("length", [](std::string& idx, std::string&) { idx[34 + 3] = 0x7f; })), "length");
  refused(with_data(damaged_dataset("pointer", [](std::string& idx, std::string&) {
            uint64_t n = 0;
            std::memcpy(&n, idx.data() + 18, 8);
            idx[34 + 4 * n + 8 * (n - 1) + 6] = 0x7f;  // the last sequence's byte offset
          })), "pointer");
  refused(with_data(damaged_dataset("docindex", [](std::string& idx, std::string&) { idx[idx.size() - 2] = 0x40; })),
          "docindex");
  refused(with_data(damaged_dataset("empty", [](std::string& idx, std::string& bin) { idx.clear(), bin.clear(); })),
          "empty");
  refused(train("--set model.vocab_size=64", "data.toml"), "vocab_size");
  refused(train("--set data.split='1,0,0' --set train.eval_interval=1", "data.toml"), "split");
  refused(train("--set data.split='a,b'", "data.toml"), "data.split");
  refused(train("--set data.weights=[1.0,2.0]", "data.toml"), "data.weights");
  // Packed documents: flags on synthetic data (no documents), an end-of-document token outside the
  // vocabulary or of the wrong kind, a dataset that does not hold it, no tokenizer to find it in.
  refused(train("--set data.reset_attention_mask=true"), "data.reset_attention_mask");
  refused(train("--set data.eod_mask_loss=true"), "data.eod_mask_loss");
  refused(train("--set data.eod_token=600"), "data.eod_token");
  refused(train("--set data.eod_token=-3"), "data.eod_token");
  refused(train("--set data.eod_token=1.5"), "data.eod_token");
  refused(train("--set data.reset_attention_mask=true --set data.prefixes=[" + q(json((fx / "gen_noeod").string()).dump()) +
                "]", "data.toml"), "data.eod_token");
  refused(train("--set data.reset_position_ids=true --set data.eod_token=\"<nope>\"", "data.toml"), "data.eod_token");
  refused(train("--set data.eod_mask_loss=true --set data.tokenizer=''", "data.toml"), "data.eod_token");
  refused(train("--set data.reset_position_ids=true --set data.prefixes=[" +
                q(json((fx / "gen_noeod").string()).dump()) + "]", "data.toml"), "data.eod_token", 2);
  refused("generate " + cfg("--init-seed 1 --prompt hi --set data.tokenizer=" + q(fx / "cases/no.model"), "data.toml"),
          "no.model");
  const fs::path csv2 = file("two.csv", "F0, B0\nF0, B0\n");
  refused(train("--set parallel.schedule_file=" + q(fx / "cases/none.csv")), "none.csv");
  refused(train("--set parallel.schedule_file=" + q(file("cells.csv", "F0, X9\n"))), "cells.csv");
  refused(train("--set parallel.schedule_file=" + q(csv2)), "parallel.schedule_file");
  refused(train("--set parallel.schedule_file=" + q(file("deadlock.csv", "B0, F0, F1, B1\n"))), "deadlock.csv");
  // Split backwards (I, W) and the V placement: one line naming the file, the rank and the action.
  refused("schedule --csv " + q(file("w_before_i.csv", "F0, W0, I0\n")), "w_before_i.csv:1): W0.0 before I0.0");
  refused("schedule --csv " + q(file("i_without_f.csv", "F0, I0, W0\nI0, W0\n")),
          "i_without_f.csv:2): I0.0 without F0.0");
  refused("schedule --csv " + q(file("v_vp3.csv", "placement = v\nF0.0, F0.2, B0.2, B0.0\n")),
          "v_vp3.csv:2 (rank 0): F0.2: chunk 2");
  refused("schedule --csv " + q(file("letter.csv", "F0, B0\nF0, Q0, B0\n")), "letter.csv:2 (rank 1): 'Q0'");
  // The V placement in the config: the schedule and the placement must agree.
  refused(train("--set parallel.placement='w'"), "parallel.placement");
  refused(train("--set parallel.schedule='zbv'"), "parallel.placement");
  refused(train("--set parallel.placement='v'"), "parallel.placement");

  // ---- checkpoints -----------------------------------------------------------------------------
  auto load = [&](const fs::path& p, const std::string& more = "") {
    return train("--set checkpoint.load=" + q(p) + " " + more);
  };
  refused(load(dir / "nowhere"), "nowhere");
  refused(load(fx / "cases"), "cases");
  refused(train("--set checkpoint.load=latest"), "checkpoint.dir");
  refused(load(damaged_checkpoint("no_meta", [](const fs::path& it) { fs::remove(it / "metadata.json"); })), "no_meta");
  refused(load(damaged_checkpoint("latest_junk", [](const fs::path& it) {
            write_file(it.parent_path() / "latest", "../../etc\n");
          })), "latest");
  refused(load(damaged_checkpoint("latest_gone", [](const fs::path& it) { fs::remove_all(it); })), "latest_gone");
  refused(load(damaged_checkpoint("not_json", [](const fs::path& it) { write_file(it / "metadata.json", "{ nope"); })),
          "not_json");
  refused(load(edited_metadata("edited", [](json& m) { m["iteration"] = 5; }, /*keep_checksum=*/true)), "checksum");
  for (auto [name, field, edit] : std::vector<std::tuple<std::string, std::string, std::function<void(json&)>>>{
           {"neg_iteration", "iteration", [](json& m) { m["iteration"] = -2; }},
           {"str_iteration", "iteration", [](json& m) { m["iteration"] = "3"; }},
           {"no_files", "files", [](json& m) { m.erase("files"); }},
           {"bytes_type", "files[0].bytes", [](json& m) { m["files"][0]["bytes"] = "x"; }},
           {"escape", "files[0].name", [](json& m) { m["files"][0]["name"] = "../../x.h5"; }},
           {"no_grid", "grid", [](json& m) { m.erase("grid"); }},
           {"grid_tp", "grid.tp", [](json& m) { m["grid"]["tp"] = 0; }},
           {"heads_type", "model.n_heads", [](json& m) { m["model"]["n_heads"] = json::array(); }},
           {"adam_steps", "trainer.adam_steps", [](json& m) { m["trainer"]["adam_steps"] = -1; }},
           {"lr_type", "lr_schedule.lr", [](json& m) { m["lr_schedule"]["lr"] = "NaN"; }},
           {"has_opt", "has_optimizer", [](json& m) { m["has_optimizer"] = "yes"; }},
           {"batch", "global_batch_size", [](json& m) { m["global_batch_size"] = 0; }},
           {"samples", "consumed_samples", [](json& m) { m["consumed_samples"] = -8; }},
           {"future", "format version 99", [](json& m) { m["format_version"] = 99; }},
           {"format", "not a tripod checkpoint", [](json& m) { m["format"] = "other"; }}}) {
    const fs::path root = edited_metadata(name, edit);
    refused(load(root), field);
    refused("ckpt verify " + q(root), field);
  }
  refused(load(damaged_checkpoint("h5_gone", [](const fs::path& it) { fs::remove(it / "pp00_tp00_dp00.h5"); })),
          "pp00_tp00_dp00.h5");
  refused(load(damaged_checkpoint("h5_short", [](const fs::path& it) {
            fs::resize_file(it / "pp00_tp00_dp00.h5", fs::file_size(it / "pp00_tp00_dp00.h5") - 100);
          })), "pp00_tp00_dp00.h5");
  refused(load(damaged_checkpoint("h5_flip", [](const fs::path& it) {
            std::string b = slurp(it / "pp00_tp00_dp00.h5");
            b[b.size() / 2] ^= 0x10;
            std::ofstream(it / "pp00_tp00_dp00.h5", std::ios::binary) << b;
          })), "pp00_tp00_dp00.h5");
  refused(load(ck_iter(), "--set model.n_heads=4"), "model.n_heads");
  refused(load(ck_iter(), "--set model.vocab_size=500"), "vocab_size");
  refused(load(ck_iter(), "--set model.ffn_hidden=32"), "model.ffn_hidden");
  refused(load(ck_iter(), "--set model.max_positions=16"), "max_positions");
  refused(load(ck_iter(), "--set train.global_batch_size=4"), "global_batch_size");
  refused("eval " + cfg("--load " + q(ck_iter()) + " --set model.n_heads=4 --set data.split=50,50,0", "data.toml"),
          "model.n_heads");
  refused(train("--set checkpoint.dir=" + q(fx / "ck")), "checkpoint.dir");
  refused(train("--set checkpoint.dir=" + q(fx / "ck") + " --set checkpoint.keep=1"), "checkpoint.overwrite");
  refused(load(fx / "ck" / "iter_0000001", "--set checkpoint.dir=" + q(fx / "cases" / "edited")), "checkpoint.dir");

  // ---- safetensors -----------------------------------------------------------------------------
  static constexpr const char* kWte = "transformer.wte.weight";
  auto import = [&](const fs::path& p) {
    return "ckpt convert " + q(p) + " --from safetensors " + q(dir / "imp" / std::to_string(cases));
  };
  refused(import(file("junk.safetensors", "not a safetensors file")), "junk.safetensors");
  refused(import(edited_safetensors("dtype", [](json& h) { h[kWte]["dtype"] = 5; })), "dtype");
  refused(import(edited_safetensors("dtype_name", [](json& h) { h[kWte]["dtype"] = "F64"; })), "F64");
  refused(import(edited_safetensors("shape_type", [](json& h) { h[kWte]["shape"] = "x"; })), "shape");
  refused(import(edited_safetensors("shape_neg", [](json& h) { h[kWte]["shape"] = {-1, 16}; })), "shape");
  refused(import(edited_safetensors("huge", [](json& h) { h[kWte]["shape"] = {1ull << 40, 1ull << 40}; })), "shape");
  refused(import(edited_safetensors("offsets", [](json& h) { h[kWte]["data_offsets"] = {0, 1u << 30}; })),
          "data_offsets");
  refused(import(edited_safetensors("offsets_type", [](json& h) { h[kWte]["data_offsets"] = "0-4"; })),
          "data_offsets");
  refused(import(edited_safetensors("heads", [](json& h) { h["__metadata__"]["n_heads"] = "two"; })), "n_heads");
  refused(import(edited_safetensors("missing", [](json& h) { h.erase(kWte); })), "wte");
  refused(import(dir / "absent.safetensors"), "absent.safetensors");
  // Hugging Face Llama folders: config.json's fields by type and range.
  for (auto [name, key, edit] : std::vector<std::tuple<std::string, std::string, std::function<void(json&)>>>{
           {"hf_type", "model_type", [](json& c) { c["model_type"] = 3; }},
           {"hf_arch", "model_type", [](json& c) { c["model_type"] = "mamba"; }},
           {"hf_hidden", "hidden_size", [](json& c) { c["hidden_size"] = "16"; }},
           {"hf_hidden_real", "hidden_size", [](json& c) { c["hidden_size"] = 16.5; }},
           {"hf_heads", "num_attention_heads", [](json& c) { c["num_attention_heads"] = 0; }},
           {"hf_kv", "num_key_value_heads", [](json& c) { c["num_key_value_heads"] = 3; }},
           {"hf_layers", "num_hidden_layers", [](json& c) { c["num_hidden_layers"] = 1e12; }},
           {"hf_layers_more", "model.layers.2", [](json& c) { c["num_hidden_layers"] = 1 << 30; }},
           {"hf_tie", "tie_word_embeddings", [](json& c) { c["tie_word_embeddings"] = "yes"; }},
           {"hf_bias", "attention_bias", [](json& c) { c["attention_bias"] = 1; }},
           {"hf_act", "hidden_act", [](json& c) { c["hidden_act"] = json::array(); }},
           {"hf_eps", "rms_norm_eps", [](json& c) { c["rms_norm_eps"] = -1; }}})
    refused(import(edited_hf_config(name, edit)), key);
  {
    const fs::path d = edited_hf_config("hf_json", [](json&) {});
    write_file(d / "config.json", "{\"model_type\": ");
    refused(import(d), "config.json");
  }
  // A Llama checkpoint loaded with another model: every recorded key is compared.
  refused(train("--set checkpoint.load=" + q(fx / "ckl") + " --set model.n_kv_heads=1", "llama.toml"),
          "model.n_kv_heads");
  refused(train("--set checkpoint.load=" + q(fx / "ckl") + " --set model.rope_theta=500000.0", "llama.toml"),
          "model.rope_theta");
  refused(train("--set checkpoint.load=" + q(fx / "ckl") + " --set model.norm_eps=1e-3", "llama.toml"),
          "model.norm_eps");

  // ---- faults ------------------------------------------------------------------------------------
  refused(train(""), "TRIPOD_INJECT_NAN", 1, "TRIPOD_INJECT_NAN=loss@zero");
  refused(train(""), "TRIPOD_INJECT_NAN", 1, "TRIPOD_INJECT_NAN=grad@-1");
  refused(train(""), "TRIPOD_PEAK_TFLOPS", 1, "TRIPOD_PEAK_TFLOPS=fast");
  refused(train(""), "TRIPOD_TEST_COMM_FAULT", 1, "TRIPOD_TEST_COMM_FAULT=stop-send:x@2");
  refused(train(""), "TRIPOD_TEST_COMM_FAULT", 1, "TRIPOD_TEST_COMM_FAULT=skip-allreduce:1@2:30");

  // ---- under mpirun: one error line for the whole job ------------------------------------------
  refused(train("--set train.lr=inf"), "train.lr", 2);
  refused(train("--set parallel.cp=2 --set model.seq_len=6"), "model.seq_len", 2);
  refused(train("--set parallel.cp=2 --set parallel.tp=2"), "parallel.cp", 2);
  refused(train("--set parallel.pp=2 --set parallel.schedule_file=" + q(file("cells2.csv", "F0, X9\nF0\n"))),
          "cells2.csv", 2);
  refused(train("--set model.n_layers=4 --set parallel.pp=2 --set parallel.vp=2 --set parallel.schedule_file=" +
                q(file("v.csv", "placement = v\nF0.0, F1.1\nF1.0, F0.1\n"))),
          "parallel.placement", 2);
  refused(with_data(fx / "cases" / "absent"), "absent", 2);
  refused(load(ck_iter(), "--set model.n_heads=4"), "model.n_heads", 2);
  refused(load(edited_metadata("neg_iteration2", [](json& m) { m["iteration"] = -2; })), "iteration", 2);

  EXPECT_GE(cases, 100);
}

// Downstream task files people bring, damaged, and task options: one error naming the file, the
// line and the field; a training run with a bad task refuses at start-up, before its first step.
TEST_F(BadInput, TaskFiles) {
  const std::string good = R"({"context": "In the beginning", "choices": ["God", "light"], "label": 0})";
  const std::string hs = R"({"activity_label": "Reading", "ctx_a": "A man opens a book.", "ctx_b": "he",)"
                         R"( "endings": ["reads it.", "eats it."], "label": 0})";
  const auto eval = [&](const std::string& task, const fs::path& f, const std::string& more = "") {
    return "eval " + cfg("--init-seed 1 --task " + task + " --task-file " + q(f) + " " + more, "data.toml");
  };
  refused(eval("multiple_choice", file("notjsonl.jsonl", good + "\nIn the beginning God created\n")),
          "notjsonl.jsonl:2: not a JSON line");
  refused(eval("multiple_choice", file("array.jsonl", "[\"God\", \"light\"]\n")), "array.jsonl:1");
  refused(eval("multiple_choice",
               file("label.jsonl", good + "\n" + R"({"context": "a", "choices": ["b", "c"], "label": 2})")),
          "label.jsonl:2: field 'label' = 2 is out of range");
  refused(eval("multiple_choice", file("strlabel.jsonl", R"({"context": "a", "choices": ["b", "c"], "label": "one"})")),
          "strlabel.jsonl:1: field 'label' must be an integer");
  refused(eval("multiple_choice", file("nochoices.jsonl", R"({"context": "a", "label": 0})")),
          "nochoices.jsonl:1: field 'choices' is missing");
  refused(eval("multiple_choice", file("emptychoice.jsonl", R"({"context": "a", "choices": ["b", ""], "label": 0})")),
          "emptychoice.jsonl:1: field 'choices[1]' is empty");
  refused(eval("hellaswag", file("generic_as_hs.jsonl", good)),
          "generic_as_hs.jsonl:1: field 'activity_label' is missing");
  refused(eval("hellaswag", file("hs_endings.jsonl", hs + "\n" + R"({"activity_label": "a", "ctx_a": "b", "ctx_b": "c",)"
                                                          R"( "endings": "d", "label": 0})")),
          "hs_endings.jsonl:2: field 'endings' must be a list");
  refused(eval("hellaswag", file("empty_task.jsonl", "\n")), "empty_task.jsonl holds no example");
  refused(eval("bits_per_byte", file("text_bad.jsonl", R"({"body": "x"})")), "text_bad.jsonl:1: field 'text' is missing");
  refused(eval("bits_per_byte", file("latin1.txt", "caf\xe9\n")), "latin1.txt:1: invalid UTF-8");
  refused(eval("hellaswag", fx / "cases" / "no_such_task.jsonl"), "no_such_task.jsonl cannot be read");
  refused(eval("hellaswg", file("good.jsonl", good)), "--task 'hellaswg' is not a task");
  refused(eval("multiple_choice", fx / "cases" / "good.jsonl", "--limit -1"), "--limit -1");
  refused(eval("multiple_choice", fx / "cases" / "good.jsonl", "--samples-out " + q(dir / "no_folder" / "s.jsonl")),
          "--samples-out");
  refused("eval " + cfg("--init-seed 1 --task multiple_choice --task-file " + q(fx / "cases" / "good.jsonl")),
          "data.tokenizer");
  refused(eval("multiple_choice", fx / "cases" / "good.jsonl", "--set 'eval.tasks=[{name=\"x\", path=\"y\"}]'"),
          "eval.tasks[0].name");
  // Under mpirun: one line for the job.
  refused(eval("multiple_choice", fx / "cases" / "label.jsonl"), "label.jsonl:2", 2);
  // A training run with a bad task refuses at start-up: nothing of a run is written, no step runs.
  for (const std::string bad : {"label.jsonl", "notjsonl.jsonl"}) {
    const fs::path run = dir / "runs" / ("bad_task_" + bad);
    refused("train --config " + q(fx / "data.toml") + " --set train.output_dir=" + q(run) +
                " --set train.eval_interval=1 --set 'eval.tasks=[{name=\"multiple_choice\", path=\"" +
                (fx / "cases" / bad).string() + "\"}]'",
            bad + ":2");
    EXPECT_FALSE(fs::exists(run / "metrics.jsonl")) << "no step ran";
  }
  refused("train --config " + q(fx / "base.toml") + " --set 'eval.tasks=[{name=\"hellaswag\", path=\"" +
              (fx / "cases" / "good.jsonl").string() + "\"}]'",
          "data.tokenizer");
  refused("train --config " + q(fx / "data.toml") + " --set 'eval.tasks=[{name=\"multiple_choice\", path=\"" +
              (fx / "cases" / "label.jsonl").string() + "\"}]'",
          "label.jsonl:2", 2);
}

// Mixtures of experts: [moe] keys, a layout that cannot split the experts, a checkpoint loaded
// with another expert count, Hugging Face folders that disagree with the config or hold what tripod
// cannot express, and a model no Hugging Face type can express.
TEST_F(BadInput, MixtureOfExperts) {
  const std::string moe = "--set moe.experts=4 --set moe.ffn_hidden=24 ";
  refused(train(moe + "--set moe.top_k=5"), "moe.top_k = 5 must be in [1, moe.experts = 4]");
  refused(train(moe + "--set moe.router='topk'"), "moe.router = \"topk\" is not one of \"softmax\", \"sigmoid\"");
  refused(train(moe + "--set moe.layers='some'"), "moe.layers");
  refused(train(moe + "--set moe.layers={first_dense=2}"), "moe.layers = {first_dense = 2}");
  refused(train(moe + "--set moe.capacity_factor=-1"), "moe.capacity_factor");
  refused(train(moe + "--set moe.bias_update_rate=-0.1"), "moe.bias_update_rate");
  refused(train(moe + "--set moe.expert=4"), "moe.expert");
  refused(train(moe + "--set parallel.tp=2 --set moe.ffn_hidden=25"), "moe.ffn_hidden", 2);
  // Expert parallelism: ep must divide the experts and dp x cp, and needs experts at all.
  refused(train(moe + "--set parallel.ep=3"), "parallel.ep = 3 must divide moe.experts = 4");
  refused(train(moe + "--set parallel.ep=2"), "parallel.ep = 2 must divide parallel.dp * parallel.cp = 1 * 1");
  refused(train(moe + "--set parallel.ep=4"), "parallel.ep = 4 must divide parallel.dp * parallel.cp = 2 * 1", 2);
  refused(train("--set parallel.ep=2"), "parallel.ep = 2 splits the routed experts", 2);
  refused(train(moe + "--set parallel.ep=0"), "parallel.ep");
  refused(train(moe + "--set parallel.moe_dispatcher='alltoallv'"), "parallel.moe_dispatcher");
  // A dense checkpoint loaded as a mixture of experts, and one with another expert count.
  refused(train(moe + "--set checkpoint.load=" + q(ck_iter())), "moe.experts = 0 (a dense model)");
  const std::string llama = "--set model.arch='llama' --set moe.router='sigmoid' ";
  must("train " + cfg(moe + llama + "--set train.steps=1 --set checkpoint.dir=" + q(dir / "ckm")));
  refused(train("--set moe.experts=8 --set moe.ffn_hidden=24 " + llama + "--set checkpoint.load=" + q(dir / "ckm")),
          "moe.experts = 4");
  // GPT2LMHeadModel has no experts at all.
  must("train " + cfg(moe + "--set train.steps=1 --set checkpoint.dir=" + q(dir / "ckg")));
  refused("ckpt convert " + q(dir / "ckg") + " --to safetensors " + q(dir / "moe.safetensors"), "moe.experts = 4");
  // No Hugging Face type routes by sigmoid: the export names the key; nothing is written.
  refused("ckpt convert " + q(dir / "ckm") + " --to safetensors " + q(dir / "moe_hf"), "moe.router = \"sigmoid\"");
  EXPECT_FALSE(fs::exists(dir / "moe_hf"));
  // The Mixtral folder of the PyTorch reference (4 experts) with a config of 8; and edited.
  const fs::path mixtral = fs::path(TRIPOD_SOURCE_PATH) / "tests/fixtures/mixtral_hf";
  const std::string mixtral_toml =
      "[model]\narch = \"llama\"\nn_layers = 2\nn_heads = 4\nn_kv_heads = 2\nd_model = 32\nseq_len = 8\n"
      "vocab_size = 40\nrope_theta = 500000.0\nnorm_eps = 1e-6\n[moe]\nexperts = 8\ntop_k = 2\nffn_hidden = 24\n"
      "[train]\nsteps = 1\n[data]\nsynthetic = true\n";
  refused("ckpt convert " + q(mixtral) + " --from safetensors " + q(dir / "imp_moe") + " --config " +
              q(file("mixtral8.toml", mixtral_toml)),
          "num_local_experts = 4 but moe.experts = 8");
  auto mixtral_edited = [&](const std::string& name, const std::function<void(json&)>& edit) {
    const fs::path d = fx / "cases" / name;
    fs::create_directories(d);
    fs::copy(mixtral, d, fs::copy_options::recursive);
    json c = json::parse(slurp(d / "config.json"));
    edit(c);
    write_file(d / "config.json", c.dump(2));
    return "ckpt convert " + q(d) + " --from safetensors " + q(dir / "imp" / name);
  };
  refused(mixtral_edited("mx_window", [](json& c) { c["sliding_window"] = 4096; }), "sliding_window = 4096");
  refused(mixtral_edited("mx_jitter", [](json& c) { c["router_jitter_noise"] = 0.1; }), "router_jitter_noise");
  refused(mixtral_edited("mx_topk", [](json& c) { c["num_experts_per_tok"] = 6; }), "num_experts_per_tok = 6");
  refused(mixtral_edited("mx_experts", [](json& c) { c["num_local_experts"] = "four"; }), "num_local_experts");
  refused(mixtral_edited("mx_more", [](json& c) { c["num_local_experts"] = 5; }),
          "block_sparse_moe.gate.weight has shape (4, 32), expected (5, 32)");
  refused(mixtral_edited("mx_type", [](json& c) { c["model_type"] = "deepseek_v3"; }), "model_type = \"deepseek_v3\"");
}

// Tokenizer files people bring, damaged: the reader names the file and line or field.
TEST_F(BadInput, TokenizerFiles) {
  // A GPT-2 vocabulary of the 256 byte tokens (written in GPT-2's byte table) and one merge.
  auto byte_char = [](int b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    int cp = b;
    if (!printable) {
      cp = 256;
      for (int k = 0; k < b; ++k)
        if (!((k >= '!' && k <= '~') || (k >= 0xA1 && k <= 0xAC) || (k >= 0xAE && k <= 0xFF))) ++cp;
    }
    std::string s;
    if (cp < 0x80) s.push_back(static_cast<char>(cp));
    else {
      s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
    return s;
  };
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  vocab["th"] = 256;
  vocab["<|endoftext|>"] = 257;
  const std::string merges = "#version: 0.2\nt h\n";
  const fs::path text = fx / "base.toml";
  auto put = [](const std::string& name, const std::string& bytes) {  // file(), with folders
    fs::create_directories((fx / "cases" / name).parent_path());
    write_file(fx / "cases" / name, bytes);
    return fx / "cases" / name;
  };
  auto gpt2 = [&](const std::string& name, const std::string& v, const std::string& m) {
    put(name + "/vocab.json", v);
    put(name + "/merges.txt", m);
    return fx / "cases" / name;
  };
  auto encode = [&](const fs::path& tok) {
    return "data encode --tokenizer-model " + q(tok) + " --input " + q(text) + " --output " + q(dir / "ids.json");
  };
  const fs::path good = gpt2("gpt2_good", vocab.dump(), merges);

  refused(encode(gpt2("vocab_array", "[1, 2, 3]", merges)), "vocab_array/vocab.json");
  refused(encode(gpt2("vocab_string_id", R"({"a": "one"})", merges)), "vocab_string_id/vocab.json: token 'a'");
  refused(encode(gpt2("vocab_float_id", R"({"a": 1.5})", merges)), "vocab_float_id/vocab.json: token 'a'");
  refused(encode(gpt2("vocab_not_json", "{\"a\": ", merges)), "vocab_not_json/vocab.json: not JSON");
  refused(encode(gpt2("merges_unknown", vocab.dump(), merges + "t zz\n")), "merges_unknown/merges.txt:3: token 'zz'");
  refused(encode(gpt2("merges_three", vocab.dump(), merges + "t h e\n")), "merges_three/merges.txt:3");
  refused("data preprocess --input " + q(text) + " --input-format text --tokenizer-model " +
              q(gpt2("merges_pre", vocab.dump(), merges + "q zz\n")) + " --output-prefix " + q(dir / "pre_bad"),
          "merges_pre/merges.txt:3");
  put("merges_missing/vocab.json", vocab.dump());
  refused(encode(fx / "cases" / "merges_missing"), "merges_missing/merges.txt: no such file");

  std::string ranks;
  for (int b = 0; b < 256; ++b) {
    static const char* t = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    ranks += std::string{t[b >> 2], t[(b & 3) << 4], '=', '='} + " " + std::to_string(b) + "\n";
  }
  refused(encode(put("bad_base64_cl100k.tiktoken", "Q!== 300\n" + ranks)), "bad_base64_cl100k.tiktoken:1: bad base64");
  refused(encode(put("bad_rank_cl100k.tiktoken", ranks + "dGg= x\n")), "bad_rank_cl100k.tiktoken:257");
  refused(encode(put("unnamed.tiktoken", ranks)), "unnamed.tiktoken");
  refused(encode(put("p.tiktoken", ranks)) + " --tokenizer-pattern '(unclosed'", "p.tiktoken");
  refused(encode(good) + " --tokenizer-pattern cl100k", "is for tiktoken rank files");

  json hf = {{"model", {{"type", "WordPiece"}, {"vocab", {{"a", 0}}}}}, {"pre_tokenizer", {{"type", "ByteLevel"}}}};
  refused(encode(put("wordpiece/tokenizer.json", hf.dump())), "model.type 'WordPiece'");
  hf["model"] = {{"type", "Unigram"}, {"vocab", json::array()}};
  refused(encode(put("unigram.json", hf.dump())), "unigram.json: model.type 'Unigram'");
  hf["model"] = {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"t h"}}};
  hf["normalizer"] = {{"type", "NFKC"}};  // (NFC, Qwen 2's, is read)
  refused(encode(put("nfkc/tokenizer.json", hf.dump())), "normalizer.type 'NFKC'");
  hf["normalizer"] = nullptr;
  hf["pre_tokenizer"] = {{"type", "Metaspace"}};
  refused(encode(put("metaspace/tokenizer.json", hf.dump())), "pre_tokenizer.type 'Metaspace'");
  hf["pre_tokenizer"] = {{"type", "ByteLevel"}};
  hf["model"]["merges"] = {"t zz"};
  refused(encode(put("hf_merge/tokenizer.json", hf.dump())), "model.merges[0]: token 'zz'");
  refused(encode(put("tokenizer_json_garbage/tokenizer.json", "{\"model\": ")), "not JSON");

  // The checkpoint records its tokenizer; generate and eval refuse another one, naming both.
  must(train("--set checkpoint.dir=" + q(dir / "tok_ck") + " --set checkpoint.interval=1 --set train.steps=1",
             "data.toml"));
  const std::string other = " --set data.tokenizer=" + q(good);
  refused("generate " + cfg("--load " + q(dir / "tok_ck") + " --prompt hi" + other, "data.toml"), "gpt2-bpe");
  refused("generate " + cfg("--load " + q(dir / "tok_ck") + " --prompt hi" + other, "data.toml"), "sentencepiece");
  refused("eval " + cfg("--load " + q(dir / "tok_ck") + " --set data.split=4,4,0" + other, "data.toml"),
          "was trained with sentencepiece");
}

}  // namespace
}  // namespace tripod
