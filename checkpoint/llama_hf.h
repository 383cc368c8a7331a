// Hugging Face configs of the Llama family to and from tripod's ModelConfig: what `tripod ckpt
// convert` writes beside exported weights and reads from an imported folder. Three model types:
// LlamaConfig ("llama"), MixtralConfig ("mixtral": every layer a softmax-routed mixture of
// experts, renormalised top-k) and Qwen3MoeConfig ("qwen3_moe": per-head q/k norms, experts with
// or without renormalised weights, the first layers dense).
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "model/config.h"

namespace tripod {

enum class HfArch { Llama, Mixtral, Qwen3Moe };
const char* hf_model_type(HfArch a);         // "llama", "mixtral", "qwen3_moe"
const char* hf_architecture_name(HfArch a);  // "LlamaForCausalLM", "MixtralForCausalLM", "Qwen3MoeForCausalLM"

// RMSNorm, rotary positions and SwiGLU: a model the Llama family may express.
bool llama_shaped(const ModelConfig& m);
// The Hugging Face model type of a Llama-shaped model: Qwen3-MoE for a mixture of experts with q/k
// norms, Mixtral for one without, Llama for a dense model. InputError naming the key that neither
// can express (a sigmoid router, shared experts, a selection bias; for Mixtral dense first layers
// or weights not renormalised, biases; q/k norms on a dense model).
HfArch hf_arch_of(const ModelConfig& m);

// The config.json fields of a Llama-shaped model (hf_arch_of's type).
nlohmann::json llama_hf_config(const ModelConfig& m);

// The model a LlamaConfig, MixtralConfig or Qwen3MoeConfig describes (seq_len = max_positions =
// max_position_embeddings; a mixture of experts' training keys (capacity, z-loss) at tripod's
// defaults, aux_loss_coeff from router_aux_loss_coef). Every field is checked by type and range,
// and the model must be one tripod's config validation accepts: InputError naming `where` (the
// config.json) and the field otherwise, and for a field tripod cannot express (sliding windows,
// router jitter, sparse layers other than all after the first ones).
ModelConfig llama_model_from_hf(const nlohmann::json& hf, const std::string& where);

// `hf` (from llama_model_from_hf) and `config` (the model of the TOML file `config_path`) describe
// the same function: InputError naming both keys and values at the first difference (e.g.
// "num_local_experts = 8 but moe.experts = 4"). The positions (seq_len, max_positions) and a
// mixture of experts' training keys are the config's choice and are not compared.
void check_llama_agrees(const ModelConfig& hf, const ModelConfig& config, const std::string& where,
                        const std::string& config_path);

}  // namespace tripod
