// `tripod ckpt inspect|verify|convert`: looking into, checking and converting checkpoints.
//   inspect DIR [--json]       iteration, grid, files, tensors with shapes and sizes
//   verify DIR                 every checksum; every global tensor's values (and optimizer state)
//                              stored exactly once
//   convert DIR --to safetensors OUT          one safetensors file, Hugging Face GPT-2 names; for a
//                              Llama-family model a folder: config.json + model.safetensors
//   convert IN --from safetensors OUT_DIR [--n-heads N | --config F.toml]
//                              a params-only tripod checkpoint (iteration 0) from GPT-2 weights (a
//                              file) or a Hugging Face Llama folder (one file or index-sharded)
// DIR is a checkpoint (iter_NNNNNNN) or a checkpoint root (its `latest` is followed). Options and
// printing live here; the work in checkpoint/ (verify.h, hf_names.h), and the tensors an import
// fills are the model's own (model_param_specs). Output paths are checked before any work.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <map>

#include "checkpoint/hf_names.h"
#include "checkpoint/llama_hf.h"
#include "checkpoint/load.h"
#include "checkpoint/reader.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/verify.h"
#include "checkpoint/writer.h"
#include "core/error.h"
#include "core/log.h"
#include "core/output_path.h"
#include "model/gpt.h"
#include "train/commands/commands.h"
#include "config/config.h"

namespace fs = std::filesystem;

namespace tripod {

namespace {

struct CkptOptions {
  std::string dir, to, from, out;
  bool json = false;
  int n_heads = 0;
  std::string config;  // --config: the model a Llama folder must match
};

int run_inspect(const CkptOptions& o) {
  CheckpointReader r(resolve_checkpoint(o.dir, ""));
  const nlohmann::json& m = r.metadata();
  // Per tensor: shape and the elements stored per state.
  std::map<std::string, std::map<std::string, int64_t>> stored;
  for (const StoredPiece& p : r.index()) stored[p.spec.name][state_kind_name(p.spec.kind)] += p.spec.geom.numel();
  if (o.json) {
    nlohmann::json out = {{"dir", r.dir()},
                          {"iteration", r.iteration()},
                          {"format_version", m["format_version"]},
                          {"tripod_version", m.value("tripod_version", "")},
                          {"grid", m.value("grid", nlohmann::json::object())},
                          {"consumed_samples", m.value("consumed_samples", 0)},
                          {"has_optimizer", m.value("has_optimizer", false)},
                          {"files", m["files"]}};
    nlohmann::json ts = nlohmann::json::array();
    for (const auto& [name, shape] : r.tensors())
      ts.push_back({{"name", name}, {"shape", shape}, {"numel", shape_numel(shape)}, {"stored", stored[name]}});
    out["tensors"] = ts;
    fmt::print("{}\n", out.dump());
    return 0;
  }
  const auto& g = m.value("grid", nlohmann::json::object());
  int64_t file_bytes = 0;
  for (const auto& f : m["files"]) file_bytes += f.value("bytes", int64_t{0});
  fmt::print("checkpoint {}\n  iteration {}, consumed samples {}, format {} (tripod {})\n", r.dir(), r.iteration(),
             m.value("consumed_samples", 0), m["format_version"].get<int>(), m.value("tripod_version", "?"));
  const int cp = g.value("cp", 1), ep = g.value("ep", 1);
  fmt::print("  saved on grid dp={} pp={} tp={} vp={}{}{}{}; optimizer state {}\n", g.value("dp", 0), g.value("pp", 0),
             g.value("tp", 0), g.value("vp", 0), cp > 1 ? fmt::format(" cp={}", cp) : std::string(),
             ep > 1 ? fmt::format(" ep={}", ep) : std::string(),
             g.value("distributed_optimizer", false) ? ", distributed optimizer" : "",
             m.value("has_optimizer", false) ? "included" : "absent (parameters only)");
  fmt::print("  {} files, {:.1f} MB:", m["files"].size(), file_bytes / 1e6);
  for (const auto& f : m["files"]) fmt::print(" {}", f["name"].get<std::string>());
  fmt::print("\n  {:<28} {:>16} {:>12} {:>10}  stored\n", "tensor", "shape", "elements", "MB (f32)");
  int64_t total = 0;
  for (const auto& [name, shape] : r.tensors()) {
    std::string kinds;
    for (const auto& [k, n] : stored[name]) kinds += (kinds.empty() ? "" : ", ") + k;
    fmt::print("  {:<28} {:>16} {:>12} {:>10.3f}  {}\n", name, shape_str(shape), shape_numel(shape),
               shape_numel(shape) * 4 / 1e6, kinds);
    total += shape_numel(shape);
  }
  fmt::print("  {} tensors, {} parameters\n", r.tensors().size(), total);
  int64_t fp8 = 0;
  for (const StoredPiece& p : r.index()) fp8 += p.spec.kind == StateKind::Fp8 ? 1 : 0;
  if (fp8 > 0) fmt::print("  FP8 delayed-scaling state (scales and amax histories) of {} linears\n", fp8);
  return 0;
}

int run_verify(const CkptOptions& o) {
  const VerifyResult v = verify_checkpoint(resolve_checkpoint(o.dir, ""));
  if (!v.ok()) {
    for (size_t i = 1; i < v.problems.size(); ++i) fmt::print(stderr, "  also: {}\n", v.problems[i]);
    throw InputError(fmt::format("checkpoint {} failed verification ({} problem{}): {}", v.dir, v.problems.size(),
                                 v.problems.size() == 1 ? "" : "s", v.problems[0]));
  }
  fmt::print("ok: {} ({} files, {} datasets, {} tensors, {:.1f} MB checked: every checksum, every element of "
             "{} stored exactly once)\n",
             v.dir, v.files, v.datasets, v.tensors, v.bytes / 1e6,
             v.optimizer_state ? "values and optimizer state" : "the values");
  return 0;
}

// The model a checkpoint was trained with (metadata.json's "model"; checkpoints of versions
// before the architecture keys are GPT-2's).
ModelConfig checkpoint_model(const CheckpointReader& r) {
  const nlohmann::json& m = r.metadata();
  TRIPOD_INPUT_CHECK(m.contains("model") && m["model"].is_object(),
                     "checkpoint {}: metadata.json has no \"model\" object", r.dir());
  return model_from_json(m["model"], r.dir() + "/metadata.json");
}

int run_export(const CkptOptions& o) {
  TRIPOD_INPUT_CHECK(o.to == "safetensors", "--to {} is not supported (valid: safetensors)", o.to);
  TRIPOD_INPUT_CHECK(!fs::exists(o.out), "output {} exists; refusing to overwrite it (remove it or pick another name)",
                     o.out);
  CheckpointReader r(resolve_checkpoint(o.dir, ""));
  const ModelConfig mc = checkpoint_model(r);
  if (llama_shaped(mc)) {  // a folder: config.json + model.safetensors
    const HfArch arch = hf_arch_of(mc);  // refuses, naming the key, what no Hugging Face type expresses
    check_output_dir(o.out, "");
    const SafetensorsFile f = llama_hf_tensors(r, arch);
    write_safetensors_folder(o.out, f, llama_hf_config(mc));
    fmt::print("wrote {}/config.json and {}/model.safetensors ({} tensors, Hugging Face {} names{})\n", o.out, o.out,
               f.tensors.size(), hf_architecture_name(arch),
               mc.tie_embeddings ? "; lm_head.weight is tied to model.embed_tokens.weight" : "");
    return 0;
  }
  TRIPOD_INPUT_CHECK(!mc.moe.enabled() && !mc.qk_norm,
                     "checkpoint {}: a GPT-2-shaped model with {} has no Hugging Face equivalent (GPT2LMHeadModel "
                     "has neither experts nor q/k norms; Mixtral and Qwen3-MoE are Llama-shaped)",
                     r.dir(), mc.moe.enabled() ? fmt::format("moe.experts = {}", mc.moe.experts) : "model.qk_norm = true");
  TRIPOD_INPUT_CHECK(!mc.rms() && !mc.rope() && !mc.swiglu() && mc.bias && mc.tie_embeddings,
                     "checkpoint {}: a model with model.norm = \"{}\", position = \"{}\", mlp = \"{}\", bias = {}, "
                     "tie_embeddings = {} is neither GPT-2 nor Llama-shaped and has no Hugging Face equivalent",
                     r.dir(), enum_name(mc.norm), enum_name(mc.position), enum_name(mc.mlp), mc.bias, mc.tie_embeddings);
  check_output_file(o.out, "");
  const SafetensorsFile f = gpt2_hf_tensors(r);
  write_safetensors(o.out, f);
  fmt::print("wrote {} ({} tensors, Hugging Face GPT2LMHeadModel names; lm_head.weight is tied to "
             "transformer.wte.weight)\n", o.out, f.tensors.size());
  return 0;
}

// Writes OUT_DIR/iter_0000000 (and `latest`): the whole tensors of `snap` as a parameters-only
// checkpoint of model `mc`.
void write_imported(const CkptOptions& o, Snapshot& snap, const ModelConfig& mc) {
  Config cfg;
  cfg.model = mc;
  cfg.data.synthetic = true;
  cfg.train.steps = 1;
  const fs::path root(o.out), tmp = root / (iter_dir_name(0) + ".tmp");
  fs::create_directories(tmp);
  write_snapshot(snap, tmp.string());
  nlohmann::json meta = {
      {"iteration", 0},
      {"consumed_samples", 0},
      {"has_optimizer", false},
      {"config_toml", config_to_toml(cfg)},
      {"model", model_to_json(mc)},
      {"grid", {{"dp", 1}, {"pp", 1}, {"tp", 1}, {"vp", 1}, {"world_size", 1}, {"distributed_optimizer", false}}},
      {"source", fmt::format("converted from {}", fs::absolute(o.dir).string())},
  };
  commit_checkpoint_dir(root.string(), tmp.string(), (root / iter_dir_name(0)).string(), meta, 0);
  fmt::print("wrote {} (iteration 0, parameters only: {} layers, d_model {}, {} heads ({} key/value), vocab {}, {} "
             "positions); train from it with --set checkpoint.load={}\n",
             (root / iter_dir_name(0)).string(), mc.n_layers, mc.d_model, mc.n_heads, mc.kv_heads(), mc.vocab_size,
             mc.positions(), o.out);
}

// The model of a Hugging Face Llama config.json; with --config, that config's model, which must
// describe the same function (its seq_len and max_positions, the positions it trains on, are the
// config's choice).
ModelConfig llama_model_of(const nlohmann::json& hf, const std::string& dir, const std::string& config_path) {
  const std::string where = dir + "/config.json";
  const ModelConfig m = llama_model_from_hf(hf, where);
  if (config_path.empty()) return m;
  const ModelConfig c = load_config(config_path, {}, ConfigUse{.training = false, .data = false}).model;
  check_llama_agrees(m, c, where, config_path);
  return c;
}

// The model's own tensors (as it registers them) filled from a Hugging Face Llama folder or GPT-2
// file.
int run_import(const CkptOptions& o) {
  TRIPOD_INPUT_CHECK(o.from == "safetensors", "--from {} is not supported (valid: safetensors)", o.from);
  check_output_dir(o.out, "");
  TRIPOD_INPUT_CHECK(!fs::exists(o.out) || fs::is_empty(o.out),
                     "output directory {} exists and is not empty; refusing to overwrite it", o.out);
  ModelConfig mc;
  Snapshot snap;
  if (fs::is_directory(o.dir)) {
    const SafetensorsFolder folder = read_safetensors_folder(o.dir);
    mc = llama_model_of(folder.config, o.dir, o.config);
    check_llama_layers(folder.weights, mc, o.dir);
    snap = llama_from_hf(folder.weights, mc, model_param_specs(mc), o.dir);
  } else {
    const SafetensorsFile f = read_safetensors(o.dir);
    mc = gpt2_model_from_hf(f, o.n_heads, o.dir);
    snap = gpt2_from_hf(f, model_param_specs(mc), o.dir);
  }
  write_imported(o, snap, mc);
  return 0;
}

}  // namespace

CommandFn add_ckpt_command(CLI::App& app) {
  auto o = std::make_shared<CkptOptions>();
  CLI::App* ck = app.add_subcommand("ckpt", "Inspect, verify and convert checkpoints");
  ck->require_subcommand(1);
  CLI::App* inspect = ck->add_subcommand("inspect", "Iteration, grid, files and tensors of a checkpoint");
  inspect->add_option("dir", o->dir, "checkpoint directory (iter_NNNNNNN, or the root holding `latest`)")->required();
  inspect->add_flag("--json", o->json, "One JSON object on stdout");
  CLI::App* verify = ck->add_subcommand("verify", "Check every checksum and that every tensor is stored exactly once");
  verify->add_option("dir", o->dir, "checkpoint directory")->required();
  CLI::App* convert = ck->add_subcommand(
      "convert", "DIR --to safetensors OUT (Hugging Face GPT-2 names; a LlamaForCausalLM folder for Llama-family "
                 "models), or IN --from safetensors OUT_DIR");
  convert->add_option("input", o->dir,
                      "checkpoint directory, or with --from a GPT-2 safetensors file or a Hugging Face Llama folder")
      ->required();
  auto* to = convert->add_option("--to", o->to, "output format: safetensors");
  auto* from = convert->add_option("--from", o->from, "input format: safetensors (writes a tripod checkpoint)");
  to->excludes(from);
  convert->add_option("output", o->out, "output file or Llama folder (--to), or checkpoint directory (--from)")
      ->required();
  convert->add_option("--n-heads", o->n_heads, "attention heads (--from, when the file does not record n_head)");
  convert->add_option("--config", o->config,
                      "a config whose [model] the Llama folder must match (--from; its seq_len is kept)");
  return [o, inspect, verify, convert] {
    init_logging(0, 1, false);
    if (inspect->parsed()) return run_inspect(*o);
    if (verify->parsed()) return run_verify(*o);
    if (convert->parsed()) {
      TRIPOD_INPUT_CHECK(!o->to.empty() || !o->from.empty(), "ckpt convert needs --to safetensors or --from safetensors");
      return o->to.empty() ? run_import(*o) : run_export(*o);
    }
    return 2;
  };
}

}  // namespace tripod
