// Hugging Face LlamaConfig <-> ModelConfig, every field checked.
#include "checkpoint/llama_hf.h"

#include <fmt/format.h>

#include <cmath>

#include "core/error.h"

namespace tripod {

bool llama_shaped(const ModelConfig& m) { return m.rms() && m.rope() && m.swiglu(); }

nlohmann::json llama_hf_config(const ModelConfig& m) {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
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
          {"attention_bias", m.bias},
          {"mlp_bias", m.bias},
          {"tie_word_embeddings", m.tie_embeddings},
          {"vocab_size", m.vocab_size},
          {"torch_dtype", "float32"}};
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
  TRIPOD_INPUT_CHECK(type == "llama", "{}: model_type = \"{}\"; tripod reads Llama folders (model_type \"llama\")",
                     where, type);
  const std::string act = text("hidden_act", "silu");
  TRIPOD_INPUT_CHECK(act == "silu", "{}: hidden_act = \"{}\"; tripod's SwiGLU uses silu", where, act);
  TRIPOD_INPUT_CHECK(!find("rope_scaling"), "{}: rope_scaling = {}; tripod's rotary embeddings have no scaling", where,
                     hf["rope_scaling"].dump());
  const bool attn_bias = flag("attention_bias", false), mlp_bias = flag("mlp_bias", false);
  TRIPOD_INPUT_CHECK(attn_bias == mlp_bias, "{}: attention_bias = {} but mlp_bias = {}; tripod has one model.bias",
                     where, attn_bias, mlp_bias);
  ModelConfig m;
  m.arch = Arch::Llama;
  m.apply_arch_preset();
  m.bias = attn_bias;
  m.d_model = count("hidden_size", 0);
  m.ffn_hidden = count("intermediate_size", 0);
  m.n_layers = count("num_hidden_layers", 0);
  m.n_heads = count("num_attention_heads", 0);
  m.n_kv_heads = count("num_key_value_heads", m.n_heads);
  m.vocab_size = count("vocab_size", 0);
  m.seq_len = m.max_positions = count("max_position_embeddings", 0);
  m.norm_eps = positive("rms_norm_eps", 1e-6);
  m.rope_theta = positive("rope_theta", 10000.0);
  m.tie_embeddings = flag("tie_word_embeddings", false);
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
  return m;
}

void check_llama_agrees(const ModelConfig& hf, const ModelConfig& c, const std::string& where,
                        const std::string& config_path) {
  auto same = [&](bool ok, const char* hf_key, const std::string& hf_value, const char* key, const std::string& v) {
    TRIPOD_INPUT_CHECK(ok, "{}: {} = {} but model.{} = {} in {}", where, hf_key, hf_value, key, v, config_path);
  };
  auto same_int = [&](int a, const char* hf_key, int b, const char* key) {
    same(a == b, hf_key, std::to_string(a), key, std::to_string(b));
  };
  same(llama_shaped(c) && c.bias == hf.bias, "model_type", "\"llama\"", "arch",
       fmt::format("\"{}\" (norm \"{}\", position \"{}\", mlp \"{}\", bias {})", enum_name(c.arch), enum_name(c.norm), enum_name(c.position), enum_name(c.mlp),
                   c.bias));
  same_int(hf.d_model, "hidden_size", c.d_model, "d_model");
  same_int(hf.ffn(), "intermediate_size", c.ffn(), "ffn_hidden");
  same_int(hf.n_layers, "num_hidden_layers", c.n_layers, "n_layers");
  same_int(hf.n_heads, "num_attention_heads", c.n_heads, "n_heads");
  same_int(hf.kv_heads(), "num_key_value_heads", c.kv_heads(), "n_kv_heads");
  same_int(hf.vocab_size, "vocab_size", c.vocab_size, "vocab_size");
  same(hf.norm_eps == c.norm_eps, "rms_norm_eps", fmt::format("{}", hf.norm_eps), "norm_eps",
       fmt::format("{}", c.norm_eps));
  same(hf.rope_theta == c.rope_theta, "rope_theta", fmt::format("{}", hf.rope_theta), "rope_theta",
       fmt::format("{}", c.rope_theta));
  same(hf.tie_embeddings == c.tie_embeddings, "tie_word_embeddings", fmt::format("{}", hf.tie_embeddings),
       "tie_embeddings", fmt::format("{}", c.tie_embeddings));
}

}  // namespace tripod
