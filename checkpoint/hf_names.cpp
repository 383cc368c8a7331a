// Hugging Face GPT-2 and Llama names and layouts of tripod's tensors; checkpoint <-> HF tensors.
#include "checkpoint/hf_names.h"

#include <fmt/format.h>

#include <charconv>
#include <map>
#include <regex>
#include <set>

#include "checkpoint/reshard.h"
#include "core/error.h"

namespace tripod {

namespace {

// (rows, cols) -> (cols, rows), row-major.
std::vector<float> transpose(const std::vector<float>& a, int64_t rows, int64_t cols) {
  std::vector<float> out(a.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[c * rows + r] = a[r * cols + c];
  return out;
}

bool is_fused_qkv(const std::string& name) { return name.find("attn.qkv.") != std::string::npos; }

// Whole tensor `name` of the checkpoint (values, or master weights when saved).
std::vector<float> whole_tensor(CheckpointReader& r, const std::string& name, const Shape& shape) {
  const StateKind src = r.has_kind(StateKind::Master) ? StateKind::Master : StateKind::Value;
  std::vector<float> data(shape_numel(shape));
  r.assemble(name, src, {{PieceGeom::whole(shape), data.data()}});
  return data;
}

std::string export_source(CheckpointReader& r) {
  return fmt::format("tripod {} checkpoint {} (iteration {})", r.metadata().value("tripod_version", "?"), r.dir(),
                     r.iteration());
}

// Calls t(name, shape as saved) for each tensor of `params` that a checkpoint stores (vocabulary
// tables without padding rows; tied copies are their owner's).
template <class Fn> void for_each_saved(const std::vector<ParamSpec>& params, Fn&& t) {
  for (const ParamSpec& p : params)
    if (!p.tied_copy) t(p.name, saved_geometry(p).global_shape);
}

// A whole tensor as the one piece of a params-only snapshot.
void add_whole(Snapshot& snap, const std::string& name, const Shape& shape, const std::vector<float>& data) {
  snap.specs.push_back({.name = name, .kind = StateKind::Value, .geom = PieceGeom::whole(shape)});
  snap.data.emplace_back(data.begin(), data.end());
}

}  // namespace

HfName gpt2_hf_name(const std::string& name) {
  static const std::vector<std::pair<std::regex, HfName>> rules = {
      {std::regex(R"(wte)"), {"transformer.wte.weight", HfLayout::Same}},
      {std::regex(R"(wpe)"), {"transformer.wpe.weight", HfLayout::Same}},
      {std::regex(R"(ln_f\.(weight|bias))"), {"transformer.ln_f.$1", HfLayout::Same}},
      {std::regex(R"(h\.(\d+)\.(ln_1|ln_2)\.(weight|bias))"), {"transformer.h.$1.$2.$3", HfLayout::Same}},
      {std::regex(R"(h\.(\d+)\.attn\.qkv\.weight)"), {"transformer.h.$1.attn.c_attn.weight", HfLayout::Transpose}},
      {std::regex(R"(h\.(\d+)\.attn\.qkv\.bias)"), {"transformer.h.$1.attn.c_attn.bias", HfLayout::Flatten}},
      {std::regex(R"(h\.(\d+)\.attn\.proj\.weight)"), {"transformer.h.$1.attn.c_proj.weight", HfLayout::Transpose}},
      {std::regex(R"(h\.(\d+)\.attn\.proj\.bias)"), {"transformer.h.$1.attn.c_proj.bias", HfLayout::Same}},
      {std::regex(R"(h\.(\d+)\.mlp\.fc\.weight)"), {"transformer.h.$1.mlp.c_fc.weight", HfLayout::Transpose}},
      {std::regex(R"(h\.(\d+)\.mlp\.fc\.bias)"), {"transformer.h.$1.mlp.c_fc.bias", HfLayout::Same}},
      {std::regex(R"(h\.(\d+)\.mlp\.proj\.weight)"), {"transformer.h.$1.mlp.c_proj.weight", HfLayout::Transpose}},
      {std::regex(R"(h\.(\d+)\.mlp\.proj\.bias)"), {"transformer.h.$1.mlp.c_proj.bias", HfLayout::Same}},
  };
  for (const auto& [re, target] : rules)
    if (std::regex_match(name, re)) return {std::regex_replace(name, re, target.name), target.layout};
  throw InputError(fmt::format("tensor {} has no Hugging Face GPT-2 name", name));
}

std::string llama_hf_name(const std::string& name, HfArch arch) {
  using Rules = std::vector<std::pair<std::regex, std::string>>;
  static const Rules common = {
      {std::regex(R"(wte)"), "model.embed_tokens.weight"},
      {std::regex(R"(lm_head\.weight)"), "lm_head.weight"},
      {std::regex(R"(ln_f\.weight)"), "model.norm.weight"},
      {std::regex(R"(h\.(\d+)\.ln_1\.weight)"), "model.layers.$1.input_layernorm.weight"},
      {std::regex(R"(h\.(\d+)\.ln_2\.weight)"), "model.layers.$1.post_attention_layernorm.weight"},
      {std::regex(R"(h\.(\d+)\.attn\.(q|k|v)\.(weight|bias))"), "model.layers.$1.self_attn.$2_proj.$3"},
      {std::regex(R"(h\.(\d+)\.attn\.proj\.(weight|bias))"), "model.layers.$1.self_attn.o_proj.$2"},
  };
  static const Rules dense_mlp = {
      {std::regex(R"(h\.(\d+)\.mlp\.(gate|up)\.(weight|bias))"), "model.layers.$1.mlp.$2_proj.$3"},
      {std::regex(R"(h\.(\d+)\.mlp\.proj\.(weight|bias))"), "model.layers.$1.mlp.down_proj.$2"},
  };
  static const Rules mixtral = {
      {std::regex(R"(h\.(\d+)\.mlp\.router\.weight)"), "model.layers.$1.block_sparse_moe.gate.weight"},
      {std::regex(R"(h\.(\d+)\.mlp\.experts\.(\d+)\.gate\.weight)"), "model.layers.$1.block_sparse_moe.experts.$2.w1.weight"},
      {std::regex(R"(h\.(\d+)\.mlp\.experts\.(\d+)\.proj\.weight)"), "model.layers.$1.block_sparse_moe.experts.$2.w2.weight"},
      {std::regex(R"(h\.(\d+)\.mlp\.experts\.(\d+)\.up\.weight)"), "model.layers.$1.block_sparse_moe.experts.$2.w3.weight"},
  };
  static const Rules qwen3_moe = {
      {std::regex(R"(h\.(\d+)\.attn\.(q|k)_norm\.weight)"), "model.layers.$1.self_attn.$2_norm.weight"},
      {std::regex(R"(h\.(\d+)\.mlp\.router\.weight)"), "model.layers.$1.mlp.gate.weight"},
      {std::regex(R"(h\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up)\.weight)"), "model.layers.$1.mlp.experts.$2.$3_proj.weight"},
      {std::regex(R"(h\.(\d+)\.mlp\.experts\.(\d+)\.proj\.weight)"), "model.layers.$1.mlp.experts.$2.down_proj.weight"},
  };
  const Rules* own = arch == HfArch::Mixtral ? &mixtral : arch == HfArch::Qwen3Moe ? &qwen3_moe : nullptr;
  for (const Rules* rules : {&common, own, arch == HfArch::Mixtral ? nullptr : &dense_mlp}) {
    if (!rules) continue;
    for (const auto& [re, target] : *rules)
      if (std::regex_match(name, re)) return std::regex_replace(name, re, target);
  }
  throw InputError(fmt::format("tensor {} has no Hugging Face {} name", name, hf_architecture_name(arch)));
}

std::string qkv_part_name(std::string name, int w) {
  const auto at = name.find("attn.qkv.");
  return name.replace(at, 9, std::string("attn.") + "qkv"[w] + ".");
}

// ---- export ----------------------------------------------------------------------------------

SafetensorsFile gpt2_hf_tensors(CheckpointReader& r) {
  SafetensorsFile f;
  const nlohmann::json& m = r.metadata();
  if (m.contains("model"))
    for (auto& [k, v] : m["model"].items()) f.metadata[k] = v.dump();
  f.metadata["format"] = "pt";
  f.metadata["source"] = export_source(r);
  for (const auto& [name, shape] : r.tensors()) {
    const HfName hf = gpt2_hf_name(name);
    NamedTensor t{.name = hf.name, .shape = shape, .data = whole_tensor(r, name, shape)};
    if (hf.layout == HfLayout::Transpose) {  // (out, in) or (3, C, C) -> (in, out)
      const int64_t in = shape.back(), out = shape_numel(shape) / in;
      t.data = transpose(t.data, out, in);
      t.shape = {in, out};
    } else if (hf.layout == HfLayout::Flatten) {
      t.shape = {shape_numel(shape)};  // (3, C) -> (3C)
    }
    f.tensors.push_back(std::move(t));
  }
  return f;
}

SafetensorsFile llama_hf_tensors(CheckpointReader& r, HfArch arch) {
  SafetensorsFile f;
  f.metadata["format"] = "pt";
  f.metadata["source"] = export_source(r);
  for (const auto& [name, shape] : r.tensors()) {
    std::vector<float> data = whole_tensor(r, name, shape);
    if (!is_fused_qkv(name)) {
      f.tensors.push_back({.name = llama_hf_name(name, arch), .shape = shape, .data = std::move(data)});
      continue;
    }
    // (3, C, C) or (3, C): q, k and v, each its own tensor.
    const int64_t part = shape_numel(shape) / 3;
    const Shape one(shape.begin() + 1, shape.end());
    for (int w = 0; w < 3; ++w)
      f.tensors.push_back({.name = llama_hf_name(qkv_part_name(name, w), arch), .shape = one,
                           .data = std::vector<float>(data.begin() + w * part, data.begin() + (w + 1) * part)});
  }
  return f;
}

// ---- import: GPT-2 ---------------------------------------------------------------------------

namespace {

// The tensors of an HF GPT-2 file by their "transformer."-prefixed names (lm_head.weight as is).
std::map<std::string, const NamedTensor*> gpt2_by_name(const SafetensorsFile& f) {
  std::map<std::string, const NamedTensor*> by_name;
  for (const NamedTensor& t : f.tensors) {
    std::string n = t.name.rfind("transformer.", 0) == 0 ? t.name : "transformer." + t.name;
    if (t.name == "lm_head.weight") n = t.name;
    by_name[n] = &t;
  }
  return by_name;
}

const NamedTensor& need_gpt2(const std::map<std::string, const NamedTensor*>& by_name, const std::string& hf,
                             const std::string& where) {
  auto it = by_name.find(hf);
  TRIPOD_INPUT_CHECK(it != by_name.end(), "{} has no tensor {} (a GPT-2 checkpoint in Hugging Face names?)", where, hf);
  return *it->second;
}

}  // namespace

ModelConfig gpt2_model_from_hf(const SafetensorsFile& f, int n_heads, const std::string& where) {
  const auto by_name = gpt2_by_name(f);
  const NamedTensor& wte = need_gpt2(by_name, "transformer.wte.weight", where);
  const NamedTensor& wpe = need_gpt2(by_name, "transformer.wpe.weight", where);
  TRIPOD_INPUT_CHECK(wte.shape.size() == 2 && wpe.shape.size() == 2 && wpe.shape[1] == wte.shape[1],
                     "{}: transformer.wte.weight {} and transformer.wpe.weight {} are not (vocab, C) and (positions, C)",
                     where, shape_str(wte.shape), shape_str(wpe.shape));
  ModelConfig mc;
  mc.vocab_size = static_cast<int>(wte.shape[0]);
  mc.d_model = static_cast<int>(wte.shape[1]);
  mc.max_positions = mc.seq_len = static_cast<int>(wpe.shape[0]);
  while (by_name.count(fmt::format("transformer.h.{}.ln_1.weight", mc.n_layers))) ++mc.n_layers;
  TRIPOD_INPUT_CHECK(mc.n_layers > 0, "{} has no transformer.h.0.* tensors", where);
  mc.ffn_hidden = static_cast<int>(need_gpt2(by_name, "transformer.h.0.mlp.c_fc.bias", where).shape.at(0));
  mc.n_heads = n_heads;
  for (const char* key : {"n_heads", "n_head"}) {
    auto it = f.metadata.find(key);
    if (mc.n_heads != 0 || it == f.metadata.end()) continue;
    const std::string& v = it->second;
    auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), mc.n_heads);
    TRIPOD_INPUT_CHECK(ec == std::errc() && end == v.data() + v.size() && mc.n_heads > 0,
                       "{}: __metadata__ {} = \"{}\" is not a positive integer (or give --n-heads)", where, key, v);
  }
  TRIPOD_INPUT_CHECK(mc.n_heads > 0 && mc.d_model % mc.n_heads == 0,
                     "--n-heads must be given (the file does not record it) and divide d_model = {}", mc.d_model);
  if (by_name.count("lm_head.weight")) {
    const NamedTensor& lm = *by_name.at("lm_head.weight");
    TRIPOD_INPUT_CHECK(lm.shape == wte.shape && lm.data == wte.data,
                       "{}: lm_head.weight differs from transformer.wte.weight; tripod ties them", where);
  }
  return mc;
}

Snapshot gpt2_from_hf(const SafetensorsFile& f, const std::vector<ParamSpec>& params, const std::string& where) {
  const auto by_name = gpt2_by_name(f);
  std::set<std::string> used = {"lm_head.weight"};  // checked against wte by gpt2_model_from_hf
  Snapshot snap;
  snap.file = shard_file_name(Coords{});
  for_each_saved(params, [&](const std::string& name, const Shape& shape) {
    const HfName hf = gpt2_hf_name(name);
    const NamedTensor& t = need_gpt2(by_name, hf.name, where);
    used.insert(hf.name);
    const int64_t n = shape_numel(shape);
    TRIPOD_INPUT_CHECK(shape_numel(t.shape) == n, "{}: {} has shape {}, expected {} elements for tripod's {} {}",
                       where, hf.name, shape_str(t.shape), n, name, shape_str(shape));
    if (hf.layout != HfLayout::Transpose) return add_whole(snap, name, shape, t.data);
    const int64_t in = shape.back(), out = n / in;
    TRIPOD_INPUT_CHECK(t.shape == Shape({in, out}), "{}: {} has shape {}, expected ({}, {})", where, hf.name,
                       shape_str(t.shape), in, out);
    add_whole(snap, name, shape, transpose(t.data, in, out));
  });
  for (const auto& [hf, t] : by_name) {
    static const std::regex buffers(R"(transformer\.h\.\d+\.attn\.(bias|masked_bias))");  // causal masks
    TRIPOD_INPUT_CHECK(used.count(hf) || std::regex_match(hf, buffers),
                       "{}: tensor {} has no place in a tripod GPT-2 (an untied head or another architecture?)", where,
                       t->name);
  }
  return snap;
}

// ---- import: Llama ---------------------------------------------------------------------------

void check_llama_layers(const SafetensorsFile& weights, const ModelConfig& m, const std::string& where) {
  std::set<std::string> names;
  for (const NamedTensor& t : weights.tensors) names.insert(t.name);
  // Each layer found is a distinct tensor of the folder, so this stops within its tensor count.
  for (int l = 0; l < m.n_layers; ++l) {
    const std::string norm = fmt::format("h.{}.ln_1.weight", l), hf = llama_hf_name(norm);
    TRIPOD_INPUT_CHECK(names.count(hf), "{} has no tensor {} (for tripod's {})", where, hf, norm);
  }
}

Snapshot llama_from_hf(const SafetensorsFile& weights, const ModelConfig& m, const std::vector<ParamSpec>& params,
                       const std::string& where) {
  const HfArch arch = hf_arch_of(m);
  std::map<std::string, const NamedTensor*> by_name;
  for (const NamedTensor& t : weights.tensors) by_name[t.name] = &t;
  std::set<std::string> used;
  auto take = [&](const std::string& tripod_name, const Shape& shape) -> const std::vector<float>& {
    const std::string hf = llama_hf_name(tripod_name, arch);
    auto it = by_name.find(hf);
    TRIPOD_INPUT_CHECK(it != by_name.end(), "{} has no tensor {} (for tripod's {})", where, hf, tripod_name);
    TRIPOD_INPUT_CHECK(it->second->shape == shape, "{}: {} has shape {}, expected {} from config.json", where, hf,
                       shape_str(it->second->shape), shape_str(shape));
    used.insert(hf);
    return it->second->data;
  };
  Snapshot snap;
  snap.file = shard_file_name(Coords{});
  for (const ParamSpec& p : params)  // a buffer (a selection bias) starts at its initial zeros
    if (p.buffer) add_whole(snap, p.name, p.global_shape, std::vector<float>(shape_numel(p.global_shape), 0.f));
  std::vector<ParamSpec> trained;
  for (const ParamSpec& p : params)
    if (!p.buffer) trained.push_back(p);
  for_each_saved(trained, [&](const std::string& name, const Shape& shape) {
    if (!is_fused_qkv(name)) return add_whole(snap, name, shape, take(name, shape));
    std::vector<float> data;  // q, k and v joined into GPT-2's fused layout
    const Shape one(shape.begin() + 1, shape.end());
    for (int w = 0; w < 3; ++w) {
      const std::vector<float>& part = take(qkv_part_name(name, w), one);
      data.insert(data.end(), part.begin(), part.end());
    }
    add_whole(snap, name, shape, data);
  });
  if (m.tie_embeddings && by_name.count("lm_head.weight")) {
    TRIPOD_INPUT_CHECK(by_name.count("model.embed_tokens.weight") &&
                           by_name["lm_head.weight"]->data == by_name["model.embed_tokens.weight"]->data,
                       "{}: lm_head.weight differs from model.embed_tokens.weight but config.json ties them", where);
    used.insert("lm_head.weight");
  }
  for (const auto& [hf, t] : by_name) {
    static const std::regex buffers(R"(model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq)");  // recomputed
    TRIPOD_INPUT_CHECK(used.count(hf) || std::regex_match(hf, buffers),
                       "{}: tensor {} has no place in the model config.json describes", where, t->name);
  }
  return snap;
}

}  // namespace tripod
