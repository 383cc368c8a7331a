// tripod's tensors under Hugging Face names and layouts, and the conversions `tripod ckpt convert`
// makes with them: a checkpoint to GPT2LMHeadModel or LlamaForCausalLM tensors, and such tensors
// to a params-only snapshot. Which tensors a model has is not listed here: an import takes them
// from the caller as the model registers them (model_param_specs), an export from the checkpoint.
#pragma once

#include <string>
#include <vector>

#include "checkpoint/llama_hf.h"
#include "checkpoint/reader.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/writer.h"
#include "model/config.h"
#include "model/param_registry.h"

namespace tripod {

// How a tripod tensor is stored under its Hugging Face GPT-2 name. tripod keeps linear weights as
// (out, in) and QKV as (3, C_out, C_in); HF's Conv1D keeps (in, out), and c_attn concatenates
// [q; k; v] along out with the same head order, so c_attn.weight[i][w*C + o] = qkv.weight[w][o][i]:
// the transpose of the (3C, C) view. c_attn.bias is the (3, C) bias flattened to (3C).
enum class HfLayout { Same, Transpose, Flatten };
struct HfName {
  std::string name;
  HfLayout layout = HfLayout::Same;
};
// "h.3.attn.qkv.weight" -> {"transformer.h.3.attn.c_attn.weight", Transpose}. InputError for a
// tensor GPT-2 does not have.
HfName gpt2_hf_name(const std::string& tripod_name);
// "h.3.attn.q.weight" -> "model.layers.3.self_attn.q_proj.weight" (the Llama family keeps tripod's
// (out, in) layout). A fused "attn.qkv" tensor has no name of its own: see qkv_part_name. A mixture
// of experts' router and experts: Mixtral's "model.layers.L.block_sparse_moe.gate.weight" and
// ".experts.E.w1/w3/w2.weight" (gate, up, down), Qwen3-MoE's "model.layers.L.mlp.gate.weight" and
// ".mlp.experts.E.{gate,up,down}_proj.weight" (and "self_attn.{q,k}_norm.weight"). InputError for
// a tensor that model type does not have.
std::string llama_hf_name(const std::string& tripod_name, HfArch arch = HfArch::Llama);
// "h.N.attn.qkv.X" -> "h.N.attn.q.X", ".k.X" or ".v.X" (w = 0, 1, 2): the parts of GPT-2's fused
// QKV, which a Llama model with as many key/value heads as query heads holds.
std::string qkv_part_name(std::string name, int w);

// The whole tensors of the checkpoint read by `r` (master weights when saved, else values) under
// GPT-2 names and layouts, the checkpoint's "model" record and its source in __metadata__.
SafetensorsFile gpt2_hf_tensors(CheckpointReader& r);
// The same under the names of Llama (or Mixtral, Qwen3-MoE: `arch`): the fused (3, C, C) QKV of a
// model with as many key/value heads as query heads split into q_proj, k_proj and v_proj.
SafetensorsFile llama_hf_tensors(CheckpointReader& r, HfArch arch = HfArch::Llama);

// The GPT-2 model that a file of HF GPT-2 tensors holds (names with or without "transformer."):
// vocabulary, width and positions from wte and wpe, layers counted, the MLP width from c_fc;
// heads from `n_heads` when > 0, else from __metadata__ n_heads or n_head. InputError naming
// `where` (the file) otherwise, and when lm_head.weight is present but not wte's copy.
ModelConfig gpt2_model_from_hf(const SafetensorsFile& f, int n_heads, const std::string& where);
// A params-only snapshot (one file, whole tensors) of the tensors `params` (the model's, as
// model_param_specs lists them) from `f`; every tensor of `f` must be used (causal-mask buffers
// excepted). InputError naming `where` and the tensor at the first one missing or of another shape.
Snapshot gpt2_from_hf(const SafetensorsFile& f, const std::vector<ParamSpec>& params, const std::string& where);

// InputError unless `weights` holds a layer norm of every one of the model's layers, naming the
// first missing one. A config.json may claim more layers than its folder holds (2^30): this
// bounds the work before the model's tensors are listed.
void check_llama_layers(const SafetensorsFile& weights, const ModelConfig& m, const std::string& where);
// As gpt2_from_hf for a Hugging Face Llama, Mixtral or Qwen3-MoE folder's weights (hf_arch_of(m))
// and the model `m` its config.json describes (q, k and v joined into the fused QKV where the model
// has one; a tied lm_head.weight must equal model.embed_tokens.weight; rotary inv_freq buffers
// ignored; tripod's buffers, a selection bias, start at zero).
Snapshot llama_from_hf(const SafetensorsFile& weights, const ModelConfig& m, const std::vector<ParamSpec>& params,
                       const std::string& where);

}  // namespace tripod
