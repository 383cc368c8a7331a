// Hugging Face Llama config.json (LlamaConfig) to and from tripod's ModelConfig: what `tripod ckpt
// convert` writes beside exported Llama weights and reads from an imported Llama folder.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "model/config.h"

namespace tripod {

// RMSNorm, rotary positions and SwiGLU: a model that has a Hugging Face Llama equivalent.
bool llama_shaped(const ModelConfig& m);

// The LlamaConfig fields of a Llama-shaped model.
nlohmann::json llama_hf_config(const ModelConfig& m);

// The model a LlamaConfig describes (seq_len = max_positions = max_position_embeddings). Every field
// is checked by type and range, and the model must be one tripod's config validation accepts:
// InputError naming `where` (the config.json) and the field otherwise.
ModelConfig llama_model_from_hf(const nlohmann::json& hf, const std::string& where);

// `hf` (from llama_model_from_hf) and `config` (the model of the TOML file `config_path`) describe
// the same function: InputError naming both keys and values at the first difference. The
// positions (seq_len, max_positions) are the config's choice and are not compared.
void check_llama_agrees(const ModelConfig& hf, const ModelConfig& config, const std::string& where,
                        const std::string& config_path);

}  // namespace tripod
