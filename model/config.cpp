// The [model] section's checks: every value a model can be built from.
#include "model/config.h"

#include <cmath>

#include "core/error.h"

namespace tripod {

void ModelConfig::validate(const std::string& origin) const {
  auto require = [&](bool ok, const char* key, const std::string& what) {
    if (!ok) throw InputError(fmt::format("{}: model.{} {}", origin, key, what));
  };
  require(norm_eps > 0 && std::isfinite(norm_eps), "norm_eps", fmt::format("must be a finite number > 0, got {}", norm_eps));
  require(rope_theta > 0 && std::isfinite(rope_theta), "rope_theta",
          fmt::format("must be a finite number > 0, got {}", rope_theta));
  require(n_layers >= 1, "n_layers", fmt::format("must be >= 1, got {}", n_layers));
  require(n_heads >= 1, "n_heads", fmt::format("must be >= 1, got {}", n_heads));
  require(d_model >= 1, "d_model", fmt::format("must be >= 1, got {}", d_model));
  require(d_model % n_heads == 0, "n_heads", fmt::format("= {} must divide model.d_model = {}", n_heads, d_model));
  require(n_kv_heads >= 0, "n_kv_heads", fmt::format("must be >= 1 (or 0 for model.n_heads), got {}", n_kv_heads));
  require(n_heads % kv_heads() == 0, "n_kv_heads",
          fmt::format("= {} must divide model.n_heads = {} (each key/value head serves a group of query heads)",
                      kv_heads(), n_heads));
  require(!rope() || head_dim() % 2 == 0, "position",
          fmt::format("= \"rope\" rotates pairs of a head's dimensions: the head dimension model.d_model / "
                      "model.n_heads = {} / {} = {} must be even", d_model, n_heads, head_dim()));
  require(ffn_hidden >= 0, "ffn_hidden",
          fmt::format("must be >= 1 (or 0: 4*d_model for gelu, Llama's rule for swiglu), got {}", ffn_hidden));
  require(seq_len >= 1, "seq_len", fmt::format("must be >= 1, got {}", seq_len));
  require(max_positions >= 0, "max_positions", fmt::format("must be >= 1 (or 0 for seq_len), got {}", max_positions));
  require(seq_len <= positions(), "seq_len",
          fmt::format("= {} exceeds the position table (model.max_positions = {})", seq_len, positions()));
  require(vocab_size >= 2, "vocab_size", fmt::format("must be >= 2, got {}", vocab_size));
  require(ffn() >= 1, "ffn_hidden", fmt::format("= {} after derivation; must be >= 1", ffn()));
  moe.validate(origin, n_layers);
}

void MoeConfig::validate(const std::string& origin, int n_layers) const {
  auto require = [&](bool ok, const char* key, const std::string& what) {
    if (!ok) throw InputError(fmt::format("{}: moe.{} {}", origin, key, what));
  };
  require(experts >= 0 && experts <= 65536, "experts",
          fmt::format("must be in [0, 65536] (0: a dense model), got {}", experts));
  if (experts == 0) return;  // dense: the other keys are not read
  require(top_k >= 1 && top_k <= experts, "top_k",
          fmt::format("= {} must be in [1, moe.experts = {}] (each token goes to top_k distinct experts)", top_k,
                      experts));
  require(ffn_hidden >= 0, "ffn_hidden", fmt::format("must be >= 1 (or 0 for model.ffn_hidden), got {}", ffn_hidden));
  require(shared_experts >= 0 && shared_experts <= 1024, "shared_experts",
          fmt::format("must be in [0, 1024], got {}", shared_experts));
  require(first_dense >= 0 && first_dense < n_layers, "layers",
          fmt::format("= {{first_dense = {}}} must leave a sparse layer: first_dense in [0, model.n_layers = {}) "
                      "(or \"all\")", first_dense, n_layers));
  require(aux_loss_coeff >= 0, "aux_loss_coeff", fmt::format("must be >= 0, got {}", aux_loss_coeff));
  require(z_loss_coeff >= 0, "z_loss_coeff", fmt::format("must be >= 0, got {}", z_loss_coeff));
  require(bias_update_rate >= 0, "bias_update_rate",
          fmt::format("must be >= 0 (0: no selection bias), got {}", bias_update_rate));
  require(capacity_factor == 0 || capacity_factor >= 0.01, "capacity_factor",
          fmt::format("must be 0 (dropless) or >= 0.01, got {}", capacity_factor));
}

void RecomputeConfig::validate(const std::string& origin) const {
  if (num_layers < -1)
    throw InputError(fmt::format("{}: recompute.num_layers must be >= 0 (or -1 for every layer), got {}", origin,
                                 num_layers));
}

}  // namespace tripod
