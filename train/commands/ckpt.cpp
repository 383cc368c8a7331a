// `tripod ckpt inspect|verify|convert`: looking into, checking and converting checkpoints.
//   inspect DIR [--json]       iteration, grid, files, tensors with shapes and sizes
//   verify DIR                 every checksum; every global tensor's values (and optimizer state)
//                              stored exactly once
//   convert DIR --to safetensors OUT          one safetensors file, Hugging Face GPT-2 names; for a
//                              Llama-family model a folder: config.json + model.safetensors
//   convert IN --from safetensors OUT_DIR [--n-heads N | --config F.toml]
//                              a params-only tripod checkpoint (iteration 0) from GPT-2 weights (a
//                              file) or a Hugging Face Llama folder (one file or index-sharded)
// DIR is a checkpoint (iter_NNNNNNN) or a checkpoint root (its `latest` is followed).
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <charconv>
#include <filesystem>
#include <functional>
#include <map>
#include <regex>
#include <set>

#include "checkpoint/hdf5_file.h"
#include "checkpoint/llama_hf.h"
#include "checkpoint/load.h"
#include "checkpoint/reader.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/writer.h"
#include "core/error.h"
#include "core/log.h"
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
  fmt::print("  saved on grid dp={} pp={} tp={} vp={}{}; optimizer state {}\n", g.value("dp", 0), g.value("pp", 0),
             g.value("tp", 0), g.value("vp", 0), g.value("distributed_optimizer", false) ? ", distributed optimizer" : "",
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
  return 0;
}

int run_verify(const CkptOptions& o) {
  const std::string dir = resolve_checkpoint(o.dir, "");
  CheckpointReader r(dir);  // metadata, files present with their recorded sizes
  std::vector<std::string> problems;
  // Index each file separately, so one damaged file does not hide the others.
  std::vector<StoredPiece> pieces;
  for (const auto& f : r.metadata()["files"]) {
    const std::string path = (fs::path(dir) / f["name"].get<std::string>()).string();
    try {
      H5Reader h(path);
      for (auto& p : h.index()) pieces.push_back(std::move(p));
    } catch (const InputError& e) {
      problems.push_back(e.what());
    }
  }
  int64_t bytes = 0;
  for (const StoredPiece& p : pieces) {
    try {
      r.read_piece(p);
      bytes += p.spec.geom.numel() * 4;
    } catch (const InputError& e) {
      problems.push_back(e.what());
    }
  }
  // Coverage: every element of every tensor exactly once per state; value always, m and v with
  // the optimizer, master when any was saved.
  std::map<std::string, Shape> shapes;
  std::set<StateKind> kinds;
  for (const StoredPiece& p : pieces) {
    shapes.emplace(p.spec.name, p.spec.geom.global_shape);
    kinds.insert(p.spec.kind);
  }
  std::vector<StateKind> required = {StateKind::Value};
  if (r.metadata().value("has_optimizer", false)) required.insert(required.end(), {StateKind::M, StateKind::V});
  if (kinds.count(StateKind::Master)) required.push_back(StateKind::Master);
  for (const auto& [name, shape] : shapes)
    for (StateKind kind : required) {
      PieceGeom whole{.global_shape = shape, .shard_dim = -1, .box_offset = 0, .box_size = shape[0],
                      .flat_begin = 0, .flat_end = shape_numel(shape)};
      std::vector<uint8_t> count(shape_numel(shape), 0);
      std::string where;
      for (const StoredPiece& p : pieces) {
        if (p.spec.name != name || p.spec.kind != kind) continue;
        if (p.spec.geom.global_shape != shape) {
          problems.push_back(fmt::format("{}: dataset {} gives tensor {} the shape {}, others {}", p.file, p.dataset,
                                         name, shape_str(p.spec.geom.global_shape), shape_str(shape)));
          continue;
        }
        for_each_overlap(p.spec.geom, whole, [&](int64_t, int64_t wi, int64_t n) {
          for (int64_t i = 0; i < n; ++i) count[wi + i] = static_cast<uint8_t>(std::min(count[wi + i] + 1, 2));
        });
        where += (where.empty() ? "" : ", ") + fs::path(p.file).filename().string();
      }
      int64_t missing = std::count(count.begin(), count.end(), 0), twice = std::count(count.begin(), count.end(), 2);
      if (missing || twice)
        problems.push_back(fmt::format("tensor {} ({}): {} of {} elements missing, {} stored more than once (pieces "
                                       "in: {}; a shard file missing or damaged?)",
                                       name, state_kind_name(kind), missing, count.size(), twice,
                                       where.empty() ? "none" : where));
    }
  if (!problems.empty()) {
    for (size_t i = 1; i < problems.size(); ++i) fmt::print(stderr, "  also: {}\n", problems[i]);
    throw InputError(fmt::format("checkpoint {} failed verification ({} problem{}): {}", dir, problems.size(),
                                 problems.size() == 1 ? "" : "s", problems[0]));
  }
  fmt::print("ok: {} ({} files, {} datasets, {} tensors, {:.1f} MB checked: every checksum, every element of "
             "{} stored exactly once)\n",
             dir, r.metadata()["files"].size(), pieces.size(), shapes.size(), bytes / 1e6,
             required.size() == 1 ? "the values" : "values and optimizer state");
  return 0;
}

// ---- Hugging Face GPT-2 names -----------------------------------------------------------
// tripod stores linear weights as (out, in) and QKV as (3, C_out, C_in), heads contiguous in
// C_out (head h = rows h*D..h*D+D-1 of each of q, k, v). HF's Conv1D stores (in, out) and c_attn
// concatenates [q; k; v] along out with the same head order, so c_attn.weight[i][w*C + o] =
// qkv.weight[w][o][i]: a transpose of the (3C, C) view.
enum class Layout { Same, Transpose };
struct HfName {
  std::string hf;
  Layout layout;
};

HfName hf_name(const std::string& name) {
  static const std::vector<std::pair<std::regex, std::pair<std::string, Layout>>> rules = {
      {std::regex(R"(wte)"), {"transformer.wte.weight", Layout::Same}},
      {std::regex(R"(wpe)"), {"transformer.wpe.weight", Layout::Same}},
      {std::regex(R"(ln_f\.(weight|bias))"), {"transformer.ln_f.$1", Layout::Same}},
      {std::regex(R"(h\.(\d+)\.(ln_1|ln_2)\.(weight|bias))"), {"transformer.h.$1.$2.$3", Layout::Same}},
      {std::regex(R"(h\.(\d+)\.attn\.qkv\.weight)"), {"transformer.h.$1.attn.c_attn.weight", Layout::Transpose}},
      {std::regex(R"(h\.(\d+)\.attn\.qkv\.bias)"), {"transformer.h.$1.attn.c_attn.bias", Layout::Same}},
      {std::regex(R"(h\.(\d+)\.attn\.proj\.weight)"), {"transformer.h.$1.attn.c_proj.weight", Layout::Transpose}},
      {std::regex(R"(h\.(\d+)\.attn\.proj\.bias)"), {"transformer.h.$1.attn.c_proj.bias", Layout::Same}},
      {std::regex(R"(h\.(\d+)\.mlp\.fc\.weight)"), {"transformer.h.$1.mlp.c_fc.weight", Layout::Transpose}},
      {std::regex(R"(h\.(\d+)\.mlp\.fc\.bias)"), {"transformer.h.$1.mlp.c_fc.bias", Layout::Same}},
      {std::regex(R"(h\.(\d+)\.mlp\.proj\.weight)"), {"transformer.h.$1.mlp.c_proj.weight", Layout::Transpose}},
      {std::regex(R"(h\.(\d+)\.mlp\.proj\.bias)"), {"transformer.h.$1.mlp.c_proj.bias", Layout::Same}},
  };
  for (const auto& [re, target] : rules)
    if (std::regex_match(name, re)) return {std::regex_replace(name, re, target.first), target.second};
  throw InputError(fmt::format("tensor {} has no Hugging Face GPT-2 name", name));
}

// (rows, cols) -> (cols, rows), row-major.
std::vector<float> transpose(const std::vector<float>& a, int64_t rows, int64_t cols) {
  std::vector<float> out(a.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[c * rows + r] = a[r * cols + c];
  return out;
}

// ---- Hugging Face Llama names ------------------------------------------------------------
// Linear weights are (out, in) in both; q, k, v keep their heads in order. With as many
// key/value heads as query heads tripod holds GPT-2's fused (3, C, C) QKV, split into
// q_proj, k_proj and v_proj (and joined again on import).
std::string llama_hf_name(const std::string& name) {
  static const std::vector<std::pair<std::regex, std::string>> rules = {
      {std::regex(R"(wte)"), "model.embed_tokens.weight"},
      {std::regex(R"(lm_head\.weight)"), "lm_head.weight"},
      {std::regex(R"(ln_f\.weight)"), "model.norm.weight"},
      {std::regex(R"(h\.(\d+)\.ln_1\.weight)"), "model.layers.$1.input_layernorm.weight"},
      {std::regex(R"(h\.(\d+)\.ln_2\.weight)"), "model.layers.$1.post_attention_layernorm.weight"},
      {std::regex(R"(h\.(\d+)\.attn\.(q|k|v)\.(weight|bias))"), "model.layers.$1.self_attn.$2_proj.$3"},
      {std::regex(R"(h\.(\d+)\.attn\.proj\.(weight|bias))"), "model.layers.$1.self_attn.o_proj.$2"},
      {std::regex(R"(h\.(\d+)\.mlp\.(gate|up)\.(weight|bias))"), "model.layers.$1.mlp.$2_proj.$3"},
      {std::regex(R"(h\.(\d+)\.mlp\.proj\.(weight|bias))"), "model.layers.$1.mlp.down_proj.$2"},
  };
  for (const auto& [re, target] : rules)
    if (std::regex_match(name, re)) return std::regex_replace(name, re, target);
  throw InputError(fmt::format("tensor {} has no Hugging Face Llama name", name));
}

// tripod's tensors of a Llama-family model, each name and global shape (vocabulary tables unpadded)
// passed to `t` in turn: an import stops at the first tensor its folder lacks, never listing the
// layers of a config.json that claims more than the folder holds.
void for_each_llama_tensor(const ModelConfig& m, const std::function<void(const std::string&, const Shape&)>& t) {
  const int64_t C = m.d_model, F = m.ffn(), Q = int64_t{m.n_heads} * m.head_dim(), KV = int64_t{m.kv_heads()} * m.head_dim();
  t("wte", {m.vocab_size, C});
  for (int l = 0; l < m.n_layers; ++l) {
    auto h = [&](const char* s) { return fmt::format("h.{}.{}", l, s); };
    t(h("ln_1.weight"), {C});
    if (m.kv_heads() == m.n_heads) {
      t(h("attn.qkv.weight"), {3, C, C});
      if (m.bias) t(h("attn.qkv.bias"), {3, C});
    } else {
      for (auto [part, rows] : {std::pair{"q", Q}, {"k", KV}, {"v", KV}}) {
        t(h(fmt::format("attn.{}.weight", part).c_str()), {rows, C});
        if (m.bias) t(h(fmt::format("attn.{}.bias", part).c_str()), {rows});
      }
    }
    t(h("attn.proj.weight"), {C, Q});
    if (m.bias) t(h("attn.proj.bias"), {C});
    t(h("ln_2.weight"), {C});
    for (const char* part : {"gate", "up"}) {
      t(h(fmt::format("mlp.{}.weight", part).c_str()), {F, C});
      if (m.bias) t(h(fmt::format("mlp.{}.bias", part).c_str()), {F});
    }
    t(h("mlp.proj.weight"), {C, F});
    if (m.bias) t(h("mlp.proj.bias"), {C});
  }
  t("ln_f.weight", {C});
  if (!m.tie_embeddings) t("lm_head.weight", {m.vocab_size, C});
}

// "h.N.attn.qkv.X" -> "h.N.attn.q.X", ".k.X" or ".v.X" (w = 0, 1, 2).
std::string qkv_part_name(std::string name, int w) {
  const auto at = name.find("attn.qkv.");
  return name.replace(at, 9, std::string("attn.") + "qkv"[w] + ".");
}

// The model a checkpoint was trained with (metadata.json's "model"; checkpoints of versions
// before the architecture keys are GPT-2's).
ModelConfig checkpoint_model(const CheckpointReader& r) {
  const nlohmann::json& m = r.metadata();
  TRIPOD_INPUT_CHECK(m.contains("model") && m["model"].is_object(),
                     "checkpoint {}: metadata.json has no \"model\" object", r.dir());
  return model_from_json(m["model"], r.dir() + "/metadata.json");
}

// Whole tensor `name` of the checkpoint (values, or master weights when saved).
std::vector<float> whole_tensor(CheckpointReader& r, const std::string& name, const Shape& shape, StateKind src) {
  std::vector<float> data(shape_numel(shape));
  PieceGeom whole{.global_shape = shape, .shard_dim = -1, .box_offset = 0, .box_size = shape[0], .flat_begin = 0,
                  .flat_end = shape_numel(shape)};
  r.assemble(name, src, {{whole, data.data()}});
  return data;
}

int run_export_llama(const CkptOptions& o, CheckpointReader& r, const ModelConfig& mc) {
  const StateKind src = r.has_kind(StateKind::Master) ? StateKind::Master : StateKind::Value;
  SafetensorsFile f;
  f.metadata["format"] = "pt";
  f.metadata["source"] = fmt::format("tripod {} checkpoint {} (iteration {})",
                                     r.metadata().value("tripod_version", "?"), r.dir(), r.iteration());
  for (const auto& [name, shape] : r.tensors()) {
    std::vector<float> data = whole_tensor(r, name, shape, src);
    if (name.find("attn.qkv.") == std::string::npos) {
      f.tensors.push_back({.name = llama_hf_name(name), .shape = shape, .data = std::move(data)});
      continue;
    }
    // (3, C, C) or (3, C): q, k and v, each its own tensor.
    const int64_t part = shape_numel(shape) / 3;
    const Shape one(shape.begin() + 1, shape.end());
    for (int w = 0; w < 3; ++w)
      f.tensors.push_back({.name = llama_hf_name(qkv_part_name(name, w)), .shape = one,
                           .data = std::vector<float>(data.begin() + w * part, data.begin() + (w + 1) * part)});
  }
  write_safetensors_folder(o.out, f, llama_hf_config(mc));
  fmt::print("wrote {}/config.json and {}/model.safetensors ({} tensors, Hugging Face LlamaForCausalLM names{})\n",
             o.out, o.out, f.tensors.size(), mc.tie_embeddings ? "; lm_head.weight is tied to model.embed_tokens.weight" : "");
  return 0;
}

int run_export(const CkptOptions& o) {
  TRIPOD_INPUT_CHECK(o.to == "safetensors", "--to {} is not supported (valid: safetensors)", o.to);
  TRIPOD_INPUT_CHECK(!fs::exists(o.out), "output {} exists; refusing to overwrite it (remove it or pick another name)",
                     o.out);
  CheckpointReader r(resolve_checkpoint(o.dir, ""));
  const ModelConfig mc = checkpoint_model(r);
  if (llama_shaped(mc)) return run_export_llama(o, r, mc);
  TRIPOD_INPUT_CHECK(!mc.rms() && !mc.rope() && !mc.swiglu() && mc.bias && mc.tie_embeddings,
                     "checkpoint {}: a model with model.norm = \"{}\", position = \"{}\", mlp = \"{}\", bias = {}, "
                     "tie_embeddings = {} is neither GPT-2 nor Llama-shaped and has no Hugging Face equivalent",
                     r.dir(), enum_name(mc.norm), enum_name(mc.position), enum_name(mc.mlp), mc.bias, mc.tie_embeddings);
  const StateKind src = r.has_kind(StateKind::Master) ? StateKind::Master : StateKind::Value;
  SafetensorsFile f;
  const nlohmann::json& m = r.metadata();
  if (m.contains("model"))
    for (auto& [k, v] : m["model"].items()) f.metadata[k] = v.dump();
  f.metadata["format"] = "pt";
  f.metadata["source"] = fmt::format("tripod {} checkpoint {} (iteration {})", m.value("tripod_version", "?"),
                                     r.dir(), r.iteration());
  for (const auto& [name, shape] : r.tensors()) {
    HfName hf = hf_name(name);
    NamedTensor t{.name = hf.hf, .shape = shape, .data = std::vector<float>(shape_numel(shape))};
    PieceGeom whole{.global_shape = shape, .shard_dim = -1, .box_offset = 0, .box_size = shape[0], .flat_begin = 0,
                    .flat_end = shape_numel(shape)};
    r.assemble(name, src, {{whole, t.data.data()}});
    if (hf.layout == Layout::Transpose) {  // (out, in) or (3, C, C) -> (in, out)
      const int64_t in = shape.back(), out = shape_numel(shape) / in;
      t.data = transpose(t.data, out, in);
      t.shape = {in, out};
    } else if (shape.size() == 2 && name.find("qkv.bias") != std::string::npos) {
      t.shape = {shape_numel(shape)};  // (3, C) -> (3C)
    }
    f.tensors.push_back(std::move(t));
  }
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

int run_import_llama(const CkptOptions& o) {
  SafetensorsFolder folder = read_safetensors_folder(o.dir);
  const ModelConfig mc = llama_model_of(folder.config, o.dir, o.config);
  std::map<std::string, const NamedTensor*> by_name;
  for (const NamedTensor& t : folder.weights.tensors) by_name[t.name] = &t;
  std::set<std::string> used;
  auto take = [&](const std::string& tripod_name, const Shape& shape) -> const std::vector<float>& {
    const std::string hf = llama_hf_name(tripod_name);
    auto it = by_name.find(hf);
    TRIPOD_INPUT_CHECK(it != by_name.end(), "{} has no tensor {} (for tripod's {})", o.dir, hf, tripod_name);
    TRIPOD_INPUT_CHECK(it->second->shape == shape, "{}: {} has shape {}, expected {} from config.json", o.dir, hf,
                       shape_str(it->second->shape), shape_str(shape));
    used.insert(hf);
    return it->second->data;
  };
  Snapshot snap;
  snap.file = shard_file_name(Coords{});
  for_each_llama_tensor(mc, [&](const std::string& name, const Shape& shape) {
    std::vector<float> data;
    if (name.find("attn.qkv.") == std::string::npos) {
      data = take(name, shape);
    } else {  // q, k and v joined into GPT-2's fused layout
      const Shape one(shape.begin() + 1, shape.end());
      for (int w = 0; w < 3; ++w) {
        const std::vector<float>& part = take(qkv_part_name(name, w), one);
        data.insert(data.end(), part.begin(), part.end());
      }
    }
    const int64_t n = shape_numel(shape);
    snap.specs.push_back({.name = name, .kind = StateKind::Value,
                          .geom = {.global_shape = shape, .shard_dim = -1, .box_offset = 0, .box_size = shape[0],
                                   .flat_begin = 0, .flat_end = n}});
    snap.data.emplace_back(data.begin(), data.end());
  });
  if (mc.tie_embeddings && by_name.count("lm_head.weight")) {
    TRIPOD_INPUT_CHECK(by_name["lm_head.weight"]->data == by_name["model.embed_tokens.weight"]->data,
                       "{}: lm_head.weight differs from model.embed_tokens.weight but config.json ties them", o.dir);
    used.insert("lm_head.weight");
  }
  for (const auto& [hf, t] : by_name) {
    static const std::regex buffers(R"(model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq)");  // recomputed
    TRIPOD_INPUT_CHECK(used.count(hf) || std::regex_match(hf, buffers),
                       "{}: tensor {} has no place in the model config.json describes", o.dir, t->name);
  }
  write_imported(o, snap, mc);
  return 0;
}

int run_import(const CkptOptions& o) {
  TRIPOD_INPUT_CHECK(o.from == "safetensors", "--from {} is not supported (valid: safetensors)", o.from);
  TRIPOD_INPUT_CHECK(!fs::exists(o.out) || fs::is_empty(o.out),
                     "output directory {} exists and is not empty; refusing to overwrite it", o.out);
  if (fs::is_directory(o.dir)) return run_import_llama(o);
  SafetensorsFile f = read_safetensors(o.dir);
  std::map<std::string, const NamedTensor*> by_name;
  for (const NamedTensor& t : f.tensors) {
    std::string n = t.name.rfind("transformer.", 0) == 0 ? t.name : "transformer." + t.name;
    if (t.name == "lm_head.weight") n = t.name;
    by_name[n] = &t;
  }
  auto need = [&](const std::string& hf) -> const NamedTensor& {
    auto it = by_name.find(hf);
    TRIPOD_INPUT_CHECK(it != by_name.end(), "{} has no tensor {} (a GPT-2 checkpoint in Hugging Face names?)", o.dir, hf);
    return *it->second;
  };
  const NamedTensor& wte = need("transformer.wte.weight");
  const NamedTensor& wpe = need("transformer.wpe.weight");
  TRIPOD_INPUT_CHECK(wte.shape.size() == 2 && wpe.shape.size() == 2 && wpe.shape[1] == wte.shape[1],
                     "{}: transformer.wte.weight {} and transformer.wpe.weight {} are not (vocab, C) and (positions, C)",
                     o.dir, shape_str(wte.shape), shape_str(wpe.shape));
  ModelConfig mc;
  mc.vocab_size = static_cast<int>(wte.shape[0]);
  mc.d_model = static_cast<int>(wte.shape[1]);
  mc.max_positions = mc.seq_len = static_cast<int>(wpe.shape[0]);
  while (by_name.count(fmt::format("transformer.h.{}.ln_1.weight", mc.n_layers))) ++mc.n_layers;
  TRIPOD_INPUT_CHECK(mc.n_layers > 0, "{} has no transformer.h.0.* tensors", o.dir);
  mc.ffn_hidden = static_cast<int>(need("transformer.h.0.mlp.c_fc.bias").shape.at(0));
  mc.n_heads = o.n_heads;
  for (const char* key : {"n_heads", "n_head"}) {
    auto it = f.metadata.find(key);
    if (mc.n_heads != 0 || it == f.metadata.end()) continue;
    const std::string& v = it->second;
    auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), mc.n_heads);
    TRIPOD_INPUT_CHECK(ec == std::errc() && end == v.data() + v.size() && mc.n_heads > 0,
                       "{}: __metadata__ {} = \"{}\" is not a positive integer (or give --n-heads)", o.dir, key, v);
  }
  TRIPOD_INPUT_CHECK(mc.n_heads > 0 && mc.d_model % mc.n_heads == 0,
                     "--n-heads must be given (the file does not record it) and divide d_model = {}", mc.d_model);
  if (by_name.count("lm_head.weight")) {
    const NamedTensor& lm = *by_name["lm_head.weight"];
    TRIPOD_INPUT_CHECK(lm.shape == wte.shape && lm.data == wte.data,
                       "{}: lm_head.weight differs from transformer.wte.weight; tripod ties them", o.dir);
  }
  // Every tripod tensor from its HF counterpart; every HF tensor must be used (masks excepted).
  const int64_t C = mc.d_model, F = mc.ffn();
  std::vector<std::pair<std::string, Shape>> tensors = {{"wte", {mc.vocab_size, C}}, {"wpe", {mc.positions(), C}},
                                                        {"ln_f.weight", {C}}, {"ln_f.bias", {C}}};
  for (int l = 0; l < mc.n_layers; ++l) {
    auto h = [&](const char* s) { return fmt::format("h.{}.{}", l, s); };
    for (auto [n, s] : std::vector<std::pair<std::string, Shape>>{
             {h("ln_1.weight"), {C}}, {h("ln_1.bias"), {C}}, {h("attn.qkv.weight"), {3, C, C}},
             {h("attn.qkv.bias"), {3, C}}, {h("attn.proj.weight"), {C, C}}, {h("attn.proj.bias"), {C}},
             {h("ln_2.weight"), {C}}, {h("ln_2.bias"), {C}}, {h("mlp.fc.weight"), {F, C}}, {h("mlp.fc.bias"), {F}},
             {h("mlp.proj.weight"), {C, F}}, {h("mlp.proj.bias"), {C}}})
      tensors.emplace_back(n, s);
  }
  std::set<std::string> used = {"lm_head.weight"};
  Snapshot snap;
  snap.file = shard_file_name(Coords{});
  for (const auto& [name, shape] : tensors) {
    HfName hf = hf_name(name);
    const NamedTensor& t = need(hf.hf);
    used.insert(hf.hf);
    const int64_t n = shape_numel(shape);
    TRIPOD_INPUT_CHECK(shape_numel(t.shape) == n,
                       "{}: {} has shape {}, expected {} elements for tripod's {} {}", o.dir, hf.hf,
                       shape_str(t.shape), n, name, shape_str(shape));
    std::vector<float> data = t.data;
    if (hf.layout == Layout::Transpose) {
      const int64_t in = shape.back(), out = n / in;
      TRIPOD_INPUT_CHECK(t.shape == Shape({in, out}), "{}: {} has shape {}, expected ({}, {})", o.dir, hf.hf,
                         shape_str(t.shape), in, out);
      data = transpose(data, in, out);
    }
    snap.specs.push_back({.name = name, .kind = StateKind::Value,
                          .geom = {.global_shape = shape, .shard_dim = -1, .box_offset = 0, .box_size = shape[0],
                                   .flat_begin = 0, .flat_end = n}});
    snap.data.emplace_back(data.begin(), data.end());
  }
  for (const auto& [hf, t] : by_name) {
    static const std::regex buffers(R"(transformer\.h\.\d+\.attn\.(bias|masked_bias))");  // causal masks
    TRIPOD_INPUT_CHECK(used.count(hf) || std::regex_match(hf, buffers),
                       "{}: tensor {} has no place in a tripod GPT-2 (an untied head or another architecture?)",
                       o.dir, t->name);
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
