// Fuzzes an imported Hugging Face Llama config.json: llama_model_from_hf (every field's type and
// range) and, for a config it accepts, what `ckpt convert --from safetensors` relies on:
// - tripod's own config validation accepts the model (the imported checkpoint records it as TOML,
//   and every run that loads the checkpoint parses that back);
// - the writer gives it back unchanged (export then import is the identity);
// - the agreement check with --config passes for the same model and only refuses another one.
#include <nlohmann/json.hpp>

#include "checkpoint/llama_hf.h"
#include "tests/fuzz/fuzz_util.h"
#include "config/config.h"

using namespace tripod;

namespace {

[[noreturn]] void finding(const char* what, const nlohmann::json& in) {
  std::fprintf(stderr, "finding: %s\n%s\n", what, in.dump().c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const nlohmann::json hf = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (hf.is_discarded()) return 0;  // read_safetensors_folder refuses invalid JSON before this
  ModelConfig m;
  bool accepted = false;
  fuzz::expect_only_input_errors([&] {
    m = llama_model_from_hf(hf, "config.json");
    accepted = true;
  });
  if (!accepted) return 0;
  // From here on every check must pass: any exception, InputError included, is a finding.
  try {
    Config cfg;
    cfg.model = m;
    cfg.data.synthetic = true;
    cfg.train.steps = 1;
    if (model_to_json(parse_config(config_to_toml(cfg), "imported.toml").model) != model_to_json(m))
      finding("the model changes through its TOML record", hf);
    if (model_to_json(llama_model_from_hf(llama_hf_config(m), "out/config.json")) != model_to_json(m))
      finding("llama_hf_config does not give the model back", hf);
    check_llama_agrees(m, m, "config.json", "same.toml");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    finding("an accepted model fails its TOML record, the writer or the agreement with itself", hf);
  }
  ModelConfig other = m;
  other.n_layers = m.n_layers % 3 + 1;
  other.rope_theta = 500000.0;
  fuzz::expect_only_input_errors([&] { check_llama_agrees(m, other, "config.json", "other.toml"); });
  return 0;
}
