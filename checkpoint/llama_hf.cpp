// Hugging Face Llama, Mixtral and Qwen3-MoE config.json <-> ModelConfig, every field checked.
#include "checkpoint/llama_hf.h"

#include <fmt/format.h>

#include <cmath>

#include "core/error.h"

namespace tripod {

const char* hf_model_type(HfArch a) {
  switch (a) {
    case HfArch::Mixtral: return "mixtral";
    case HfArch::Qwen3Moe: return "qwen3_moe";
    default: return "llama";
  }
}

const char* hf_architecture_name(HfArch a) {
  switch (a) {
    case HfArch::Mixtral: return "MixtralForCausalLM";
    case HfArch::Qwen3Moe: return "Qwen3MoeForCausalLM";
    default: return "LlamaForCausalLM";
  }
}

bool llama_shaped(const ModelConfig& m) { return m.rms() && m.rope() && m.swiglu(); }

HfArch hf_arch_of(const ModelConfig& m) {
  auto refuse = [](bool bad, const std::string& what) {
    if (bad) throw InputError(what);
  };
  if (!m.moe.enabled()) {
    refuse(m.qk_norm, "model.qk_norm = true: LlamaForCausalLM has no q/k norms (tripod exports those as "
                      "Qwen3MoeForCausalLM, a mixture of experts)");
    return HfArch::Llama;
  }
  const MoeConfig& e = m.moe;
  const char* both = "neither MixtralForCausalLM nor Qwen3MoeForCausalLM";
  refuse(e.router != MoeRouter::Softmax,
         fmt::format("moe.router = \"{}\": {} routes by anything but a softmax", enum_name(e.router), both));
  refuse(e.shared_experts > 0, fmt::format("moe.shared_experts = {}: {} has shared experts", e.shared_experts, both));
  refuse(e.selection_bias(), fmt::format("moe.bias_update_rate = {}: {} has a selection bias (the expert bias of "
                                         "aux-loss-free balancing)", e.bias_update_rate, both));
  refuse(m.bias, fmt::format("model.bias = true: {} has biases in its MLPs", both));
  if (m.qk_norm) return HfArch::Qwen3Moe;
  refuse(e.first_dense > 0, fmt::format("moe.layers = {{first_dense = {}}}: MixtralForCausalLM has no dense layers "
                                        "(set model.qk_norm for Qwen3MoeForCausalLM, which has)", e.first_dense));
  refuse(!e.normalize_top_k, "moe.normalize_top_k = false: MixtralForCausalLM always renormalises the chosen "
                             "experts' weights (set model.qk_norm for Qwen3MoeForCausalLM, which may not)");
  return HfArch::Mixtral;
}

nlohmann::json llama_hf_config(const ModelConfig& m) {
  const HfArch arch = hf_arch_of(m);
  nlohmann::json j = {{"architectures", {hf_architecture_name(arch)}},
                      {"model_type", hf_model_type(arch)},
                      {"hidden_size", m.d_model},
                      {"intermediate_size", m.ffn()},
                      {"num_hidden_layers", m.n_layers},
                      {"num_attention_heads", m.n_heads},
                      {"num_key_value_heads", m.kv_heads()},
                      {"head_dim", m.head_dim()},
                      {"hidden_act", "silu"},
                      {"max_position_embeddings", m.positions()},
                      {"rms_norm_eps", m.norm_eps},
                      {"rope_theta", m.rope_theta},
                      {"rope_scaling", nullptr},
                      {"tie_word_embeddings", m.tie_embeddings},
                      {"vocab_size", m.vocab_size},
                      {"torch_dtype", "float32"}};
  const MoeConfig& e = m.moe;
  switch (arch) {
    case HfArch::Llama:
      j["attention_bias"] = m.bias;
      j["mlp_bias"] = m.bias;
      break;
    case HfArch::Mixtral:
      j.erase("rope_scaling");
      j["intermediate_size"] = m.expert_ffn();
      j["num_local_experts"] = e.experts;
      j["num_experts_per_tok"] = e.top_k;
      j["router_aux_loss_coef"] = e.aux_loss_coeff;
      j["router_jitter_noise"] = 0.0;
      j["output_router_logits"] = false;
      j["sliding_window"] = nullptr;
      break;
    case HfArch::Qwen3Moe: {
      nlohmann::json dense = nlohmann::json::array();
      for (int l = 0; l < e.first_dense; ++l) dense.push_back(l);
      j["moe_intermediate_size"] = m.expert_ffn();
      j["num_experts"] = e.experts;
      j["num_experts_per_tok"] = e.top_k;
      j["norm_topk_prob"] = e.normalize_top_k;
      j["decoder_sparse_step"] = 1;
      j["mlp_only_layers"] = dense;
      j["router_aux_loss_coef"] = e.aux_loss_coeff;
      j["output_router_logits"] = false;
      j["attention_bias"] = false;
      j["use_sliding_window"] = false;
      j["sliding_window"] = nullptr;
      break;
    }
  }
  return j;
}

ModelConfig llama_model_from_hf(const nlohmann::json& hf, const std::string& where) {
  TRIPOD_INPUT_CHECK(hf.is_object(), "{}: not a JSON object", where);
  // A field's value; nullptr when absent or null (Hugging Face's "the default").
  auto find = [&](const char* key) -> const nlohmann::json* {
    auto it = hf.find(key);
    return it == hf.end() || it->is_null() ? nullptr : &*it;
  };
  // A value of another type names the key, never a JSON library error.
  auto count = [&](const char* key, int fallback) {
    const nlohmann::json* v = find(key);
    TRIPOD_INPUT_CHECK(v || fallback > 0, "{}: {} is missing", where, key);
    if (!v) return fallback;
    TRIPOD_INPUT_CHECK(v->is_number_integer() && v->get<int64_t>() >= 1 && v->get<int64_t>() <= (1 << 30),
                       "{}: {} = {} is not a positive integer (at most 2^30)", where, key, v->dump());
    return v->get<int>();
  };
  auto positive = [&](const char* key, double fallback) {
    const nlohmann::json* v = find(key);
    if (!v) return fallback;
    TRIPOD_INPUT_CHECK(v->is_number() && v->get<double>() > 0 && std::isfinite(v->get<double>()),
                       "{}: {} = {} is not a finite number > 0", where, key, v->dump());
    return v->get<double>();
  };
  auto nonnegative = [&](const char* key, double fallback) {
    const nlohmann::json* v = find(key);
    if (!v) return fallback;
    TRIPOD_INPUT_CHECK(v->is_number() && v->get<double>() >= 0 && std::isfinite(v->get<double>()),
                       "{}: {} = {} is not a finite number >= 0", where, key, v->dump());
    return v->get<double>();
  };
  auto text = [&](const char* key, const char* fallback) {
    const nlohmann::json* v = find(key);
    if (!v) return std::string(fallback);
    TRIPOD_INPUT_CHECK(v->is_string(), "{}: {} = {} is not a string", where, key, v->dump());
    return v->get<std::string>();
  };
  auto flag = [&](const char* key, bool fallback) {
    const nlohmann::json* v = find(key);
    if (!v) return fallback;
    TRIPOD_INPUT_CHECK(v->is_boolean(), "{}: {} = {} is not true or false", where, key, v->dump());
    return v->get<bool>();
  };
  const std::string type = text("model_type", "");
  HfArch arch = HfArch::Llama;
  if (type == "mixtral")
    arch = HfArch::Mixtral;
  else if (type == "qwen3_moe")
    arch = HfArch::Qwen3Moe;
  else
    TRIPOD_INPUT_CHECK(type == "llama",
                       "{}: model_type = \"{}\"; tripod reads Llama, Mixtral and Qwen3-MoE folders (model_type "
                       "\"llama\", \"mixtral\" or \"qwen3_moe\")",
                       where, type);
  const std::string act = text("hidden_act", "silu");
  TRIPOD_INPUT_CHECK(act == "silu", "{}: hidden_act = \"{}\"; tripod's SwiGLU uses silu", where, act);
  TRIPOD_INPUT_CHECK(!find("rope_scaling"), "{}: rope_scaling = {}; tripod's rotary embeddings have no scaling", where,
                     hf["rope_scaling"].dump());
  ModelConfig m;
  m.arch = Arch::Llama;
  m.apply_arch_preset();
  if (arch == HfArch::Llama) {
    const bool attn_bias = flag("attention_bias", false), mlp_bias = flag("mlp_bias", false);
    TRIPOD_INPUT_CHECK(attn_bias == mlp_bias, "{}: attention_bias = {} but mlp_bias = {}; tripod has one model.bias",
                       where, attn_bias, mlp_bias);
    m.bias = attn_bias;
  }
  m.d_model = count("hidden_size", 0);
  m.ffn_hidden = count("intermediate_size", 0);
  m.n_layers = count("num_hidden_layers", 0);
  m.n_heads = count("num_attention_heads", 0);
  m.n_kv_heads = count("num_key_value_heads", m.n_heads);
  m.vocab_size = count("vocab_size", 0);
  m.seq_len = m.max_positions = count("max_position_embeddings", 0);
  m.norm_eps = positive("rms_norm_eps", 1e-6);
  m.rope_theta = positive("rope_theta", arch == HfArch::Mixtral ? 1e6 : 10000.0);
  m.tie_embeddings = flag("tie_word_embeddings", false);
  if (arch == HfArch::Mixtral) {
    const nlohmann::json* window = find("sliding_window");
    TRIPOD_INPUT_CHECK(!window, "{}: sliding_window = {}; tripod's attention has no sliding window (null: none)",
                       where, window ? window->dump() : "");
    TRIPOD_INPUT_CHECK(nonnegative("router_jitter_noise", 0.0) == 0.0,
                       "{}: router_jitter_noise = {}; tripod's router adds no noise (give 0)", where,
                       hf["router_jitter_noise"].dump());
    m.moe.experts = count("num_local_experts", 8);
    m.moe.top_k = count("num_experts_per_tok", 2);
    m.moe.ffn_hidden = m.ffn_hidden;  // Mixtral's intermediate_size is an expert's
    m.moe.normalize_top_k = true;
    m.moe.aux_loss_coeff = nonnegative("router_aux_loss_coef", 0.001);
  } else if (arch == HfArch::Qwen3Moe) {
    TRIPOD_INPUT_CHECK(!flag("use_sliding_window", false),
                       "{}: use_sliding_window = true; tripod's attention has no sliding window", where);
    TRIPOD_INPUT_CHECK(!flag("attention_bias", false),
                       "{}: attention_bias = true; tripod's model.bias would give the MLPs biases too, which "
                       "Qwen3-MoE has not", where);
    TRIPOD_INPUT_CHECK(count("decoder_sparse_step", 1) == 1,
                       "{}: decoder_sparse_step = {}; tripod's sparse layers are all those after the first dense ones "
                       "(decoder_sparse_step 1)", where, hf["decoder_sparse_step"].dump());
    m.qk_norm = true;
    m.moe.experts = count("num_experts", 128);
    m.moe.top_k = count("num_experts_per_tok", 8);
    m.moe.ffn_hidden = count("moe_intermediate_size", 768);
    m.moe.normalize_top_k = flag("norm_topk_prob", false);
    m.moe.aux_loss_coeff = nonnegative("router_aux_loss_coef", 0.001);
    if (const nlohmann::json* dense = find("mlp_only_layers")) {
      bool prefix = dense->is_array() && static_cast<int64_t>(dense->size()) <= m.n_layers;
      for (size_t i = 0; prefix && i < dense->size(); ++i)
        prefix = (*dense)[i].is_number_integer() && (*dense)[i].get<int64_t>() == static_cast<int64_t>(i);
      TRIPOD_INPUT_CHECK(prefix,
                         "{}: mlp_only_layers = {}; tripod's dense layers are the first ones: give [0, 1, ..., N-1] "
                         "(moe.layers = {{first_dense = N}})",
                         where, dense->dump().substr(0, 80));
      m.moe.first_dense = static_cast<int>(dense->size());
    }
    TRIPOD_INPUT_CHECK(m.moe.first_dense < m.n_layers,
                       "{}: mlp_only_layers names every one of the {} layers; tripod reads a Qwen3-MoE with a sparse "
                       "layer", where, m.n_layers);
  }
  // What tripod's config validation asks of a model (ModelConfig::validate), in this file's keys.
  TRIPOD_INPUT_CHECK(m.vocab_size >= 2, "{}: vocab_size = {} must be >= 2", where, m.vocab_size);
  TRIPOD_INPUT_CHECK(m.d_model % m.n_heads == 0, "{}: num_attention_heads = {} does not divide hidden_size = {}",
                     where, m.n_heads, m.d_model);
  TRIPOD_INPUT_CHECK(m.n_heads % m.n_kv_heads == 0,
                     "{}: num_key_value_heads = {} does not divide num_attention_heads = {}", where, m.n_kv_heads,
                     m.n_heads);
  TRIPOD_INPUT_CHECK(m.head_dim() % 2 == 0,
                     "{}: hidden_size / num_attention_heads = {} / {} = {} is odd; rotary embeddings rotate pairs",
                     where, m.d_model, m.n_heads, m.head_dim());
  TRIPOD_INPUT_CHECK(count("head_dim", m.head_dim()) == m.head_dim(),
                     "{}: head_dim = {} is not hidden_size / num_attention_heads = {}; tripod needs them equal", where,
                     hf["head_dim"].dump(), m.head_dim());
  if (m.moe.enabled())
    TRIPOD_INPUT_CHECK(m.moe.top_k <= m.moe.experts, "{}: num_experts_per_tok = {} exceeds the {} experts", where,
                       m.moe.top_k, m.moe.experts);
  return m;
}

void check_llama_agrees(const ModelConfig& hf, const ModelConfig& c, const std::string& where,
                        const std::string& config_path) {
  auto same = [&](bool ok, const char* hf_key, const std::string& hf_value, const std::string& key,
                  const std::string& v) {
    TRIPOD_INPUT_CHECK(ok, "{}: {} = {} but {} = {} in {}", where, hf_key, hf_value, key, v, config_path);
  };
  auto same_int = [&](int a, const char* hf_key, int b, const std::string& key) {
    same(a == b, hf_key, std::to_string(a), key, std::to_string(b));
  };
  // The folder's type: a mixture of experts (and which) or a dense Llama.
  const HfArch arch = !hf.moe.enabled() ? HfArch::Llama : hf.qk_norm ? HfArch::Qwen3Moe : HfArch::Mixtral;
  same(llama_shaped(c) && c.bias == hf.bias, "model_type", fmt::format("\"{}\"", hf_model_type(arch)), "model.arch",
       fmt::format("\"{}\" (norm \"{}\", position \"{}\", mlp \"{}\", bias {})", enum_name(c.arch), enum_name(c.norm),
                   enum_name(c.position), enum_name(c.mlp), c.bias));
  same_int(hf.d_model, "hidden_size", c.d_model, "model.d_model");
  if (arch != HfArch::Mixtral)  // Mixtral's intermediate_size is an expert's width (below)
    same_int(hf.ffn(), "intermediate_size", c.ffn(), "model.ffn_hidden");
  same_int(hf.n_layers, "num_hidden_layers", c.n_layers, "model.n_layers");
  same_int(hf.n_heads, "num_attention_heads", c.n_heads, "model.n_heads");
  same_int(hf.kv_heads(), "num_key_value_heads", c.kv_heads(), "model.n_kv_heads");
  same_int(hf.vocab_size, "vocab_size", c.vocab_size, "model.vocab_size");
  same(hf.norm_eps == c.norm_eps, "rms_norm_eps", fmt::format("{}", hf.norm_eps), "model.norm_eps",
       fmt::format("{}", c.norm_eps));
  same(hf.rope_theta == c.rope_theta, "rope_theta", fmt::format("{}", hf.rope_theta), "model.rope_theta",
       fmt::format("{}", c.rope_theta));
  same(hf.tie_embeddings == c.tie_embeddings, "tie_word_embeddings", fmt::format("{}", hf.tie_embeddings),
       "model.tie_embeddings", fmt::format("{}", c.tie_embeddings));
  if (arch == HfArch::Llama) {
    same_int(0, "model_type \"llama\" (a dense model) has experts", c.moe.experts, "moe.experts");
    same(!c.qk_norm, "model_type \"llama\" has q/k norms", "false", "model.qk_norm", "true");
    return;
  }
  const bool mixtral = arch == HfArch::Mixtral;
  same_int(hf.moe.experts, mixtral ? "num_local_experts" : "num_experts", c.moe.experts, "moe.experts");
  same_int(hf.moe.top_k, "num_experts_per_tok", c.moe.top_k, "moe.top_k");
  same_int(hf.expert_ffn(), mixtral ? "intermediate_size" : "moe_intermediate_size", c.expert_ffn(),
           "moe.ffn_hidden");
  same(c.moe.router == MoeRouter::Softmax, "the router", "a softmax", "moe.router",
       fmt::format("\"{}\"", enum_name(c.moe.router)));
  same_int(0, "shared experts", c.moe.shared_experts, "moe.shared_experts");
  same(hf.moe.normalize_top_k == c.moe.normalize_top_k, mixtral ? "the renormalised top-k" : "norm_topk_prob",
       fmt::format("{}", hf.moe.normalize_top_k), "moe.normalize_top_k", fmt::format("{}", c.moe.normalize_top_k));
  same_int(hf.moe.first_dense, mixtral ? "dense layers" : "mlp_only_layers' length", c.moe.first_dense,
           "moe.layers' first_dense");
  same(hf.qk_norm == c.qk_norm, mixtral ? "q/k norms (Mixtral has none)" : "q/k norms (Qwen3 has them)",
       fmt::format("{}", hf.qk_norm), "model.qk_norm", fmt::format("{}", c.qk_norm));
}

}  // namespace tripod
