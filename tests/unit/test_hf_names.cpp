// Hugging Face names (checkpoint/hf_names.h) over the one list of a model's tensors
// (model_param_specs): that list is what every rank's model registers, every tensor in it has a
// GPT-2 or Llama name, and Hugging Face tensors go to a checkpoint and come back unchanged.
#include <gtest/gtest.h>

#include <omp.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "checkpoint/hf_names.h"
#include "checkpoint/llama_hf.h"
#include "checkpoint/reader.h"
#include "checkpoint/reshard.h"
#include "checkpoint/writer.h"
#include "cli_util.h"
#include "harness.h"
#include "model/gpt.h"

namespace tripod {
namespace {

namespace fs = std::filesystem;

ModelConfig gpt2_model() { return test::tiny_config(2, 16, 2, 8, 100).model; }
ModelConfig llama_model(int kv, bool tie = false) {
  ModelConfig m = test::tiny_config(2, 16, 4, 8, 100).model;
  test::make_llama(m, kv);
  m.tie_embeddings = tie;
  return m;
}

// name -> saved shape of every tensor a checkpoint of the model stores.
std::map<std::string, Shape> saved_shapes(const std::vector<ParamSpec>& specs) {
  std::map<std::string, Shape> out;
  for (const ParamSpec& s : specs)
    if (!s.tied_copy) out[s.name] = saved_geometry(s).global_shape;
  return out;
}

// Initial values depend on the element's global index only: the same bits on any number of
// host threads, and a TP shard's values are its rows of the whole tensor (padding rows zero).
TEST(ModelParamSpecs, InitialValuesDependOnNeitherThreadsNorSharding) {
  ParamSpec whole;
  whole.name = "wte";
  whole.global_shape = {300, 24};
  whole.vocab_rows = 250;
  whole.init = Init::Normal;
  whole.stddev = 0.02f;
  ParamSpec shard = whole;
  shard.shard_dim = 0;
  shard.shard_offset = 100;
  shard.shard_size = 200;
  std::vector<float> all(300 * 24), one(200 * 24), three(200 * 24);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  init_shard_values(whole, 5, all.data());
  init_shard_values(shard, 5, one.data());
  omp_set_num_threads(3);
  init_shard_values(shard, 5, three.data());
  omp_set_num_threads(threads);
  EXPECT_EQ(0, std::memcmp(one.data(), three.data(), one.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(one.data(), all.data() + 100 * 24, one.size() * sizeof(float)));
  EXPECT_NE(all[0], 0.f);
  EXPECT_EQ(all[250 * 24], 0.f);  // the first padding row
}

// The list is what the model registers on every rank of a grid: the union over (pp, tp) ranks
// gives the same names and global shapes (vocabulary tables as saved, without padding).
TEST(ModelParamSpecs, AreWhatEveryRankOfAGridRegisters) {
  for (const ModelConfig& m : {gpt2_model(), llama_model(2), llama_model(4, true)}) {
    SCOPED_TRACE(std::string(enum_name(m.arch)) + " kv " + std::to_string(m.kv_heads()));
    const std::vector<ParamSpec> specs = model_param_specs(m);
    const auto want = saved_shapes(specs);
    EXPECT_EQ(want.size(), specs.size());  // one rank holding everything registers no tied copy
    int64_t numel = 0;  // ModelConfig::num_params, the planner's formula, counts the same tensors
    for (const ParamSpec& s : specs) numel += shape_numel(s.global_shape);
    EXPECT_EQ(numel, m.num_params(1));
    auto cpu = make_ops(Device::CPU);
    for (auto [tp, pp] : {std::pair{2, 1}, {1, 2}, {2, 2}}) {
      const RankGrid grid(tp, 1, pp);
      std::map<std::string, Shape> got;
      for (int rank = 0; rank < grid.world_size(); ++rank) {
        ParallelContext par;
        par.grid = grid;
        par.rank = rank;
        par.coords = grid.coords(rank);
        ParamRegistry reg;
        GptModel model(*cpu, par, m, rank_chunks(layers_per_stage(m.n_layers, pp, 1, {}), pp, 1, par.coords.pp),
                       RecomputeConfig{}, reg);
        std::vector<ParamSpec> registered;
        for (const Param& p : reg.params()) registered.push_back(p.spec);
        for (const auto& [name, shape] : saved_shapes(registered)) got[name] = shape;
      }
      EXPECT_EQ(got, want) << "tp " << tp << " pp " << pp;
    }
  }
}

TEST(HfNames, EveryTensorOfAModelHasOne) {
  const auto gpt2 = saved_shapes(model_param_specs(gpt2_model()));
  EXPECT_EQ(gpt2.size(), 4u + 2u * 12u);  // wte, wpe, ln_f weight and bias; 12 per layer
  std::set<std::string> hf;
  for (const auto& [name, shape] : gpt2) hf.insert(gpt2_hf_name(name).name);
  EXPECT_EQ(hf.size(), gpt2.size());  // one to one
  EXPECT_EQ(gpt2_hf_name("h.1.attn.qkv.weight").name, "transformer.h.1.attn.c_attn.weight");
  EXPECT_EQ(gpt2_hf_name("h.1.attn.qkv.weight").layout, HfLayout::Transpose);
  EXPECT_EQ(gpt2_hf_name("h.0.attn.qkv.bias").layout, HfLayout::Flatten);
  EXPECT_EQ(gpt2_hf_name("h.0.mlp.fc.bias").layout, HfLayout::Same);
  EXPECT_THROW(gpt2_hf_name("h.0.attn.q.weight"), InputError);
  for (const ModelConfig& m : {llama_model(2), llama_model(4, true)}) {
    std::set<std::string> names;
    for (const auto& [name, shape] : saved_shapes(model_param_specs(m))) {
      if (name.find("attn.qkv.") == std::string::npos) {
        names.insert(llama_hf_name(name));
        continue;
      }
      for (int w = 0; w < 3; ++w) names.insert(llama_hf_name(qkv_part_name(name, w)));
    }
    // embed_tokens, norm, (lm_head); per layer 2 norms, q, k, v, o, gate, up, down.
    EXPECT_EQ(names.size(), (m.tie_embeddings ? 2u : 3u) + 2u * 9u);
  }
  EXPECT_EQ(llama_hf_name("h.3.attn.k.weight"), "model.layers.3.self_attn.k_proj.weight");
  EXPECT_EQ(qkv_part_name("h.3.attn.qkv.bias", 2), "h.3.attn.v.bias");
  EXPECT_THROW(llama_hf_name("wpe"), InputError);
}

// Value i of tensor number t: every element of every tensor distinct.
std::vector<float> values(size_t t, int64_t n) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(t) * 1000.f + static_cast<float>(i) * 0.5f;
  return v;
}

// A GPT-2 file in Hugging Face names and layouts for `m`.
SafetensorsFile gpt2_file(const ModelConfig& m) {
  SafetensorsFile f;
  f.metadata["n_head"] = std::to_string(m.n_heads);
  size_t t = 0;
  for (const auto& [name, shape] : saved_shapes(model_param_specs(m))) {
    const HfName hf = gpt2_hf_name(name);
    Shape s = shape;
    if (hf.layout == HfLayout::Transpose) s = {shape.back(), shape_numel(shape) / shape.back()};
    if (hf.layout == HfLayout::Flatten) s = {shape_numel(shape)};
    f.tensors.push_back({.name = hf.name, .shape = s, .data = values(t++, shape_numel(shape))});
  }
  return f;
}

// A Llama folder's weights in Hugging Face names for `m`.
SafetensorsFile llama_weights(const ModelConfig& m) {
  SafetensorsFile f;
  size_t t = 0;
  for (const auto& [name, shape] : saved_shapes(model_param_specs(m))) {
    if (name.find("attn.qkv.") == std::string::npos) {
      f.tensors.push_back({.name = llama_hf_name(name), .shape = shape, .data = values(t++, shape_numel(shape))});
      continue;
    }
    const Shape one(shape.begin() + 1, shape.end());
    for (int w = 0; w < 3; ++w)
      f.tensors.push_back(
          {.name = llama_hf_name(qkv_part_name(name, w)), .shape = one, .data = values(t++, shape_numel(one))});
  }
  return f;
}

const NamedTensor& named(const SafetensorsFile& f, const std::string& name) {
  for (const NamedTensor& t : f.tensors)
    if (t.name == name) return t;
  throw std::runtime_error("no tensor " + name);
}
const HostFloats& snapshot_tensor(const Snapshot& s, const std::string& name) {
  for (size_t i = 0; i < s.specs.size(); ++i)
    if (s.specs[i].name == name) return s.data[i];
  throw std::runtime_error("no tensor " + name);
}

// `snap` as a params-only checkpoint of `m` under `root` (what `ckpt convert --from` writes).
std::string write_checkpoint(Snapshot& snap, const ModelConfig& m, const fs::path& root) {
  Config cfg;
  cfg.model = m;
  cfg.data.synthetic = true;
  cfg.train.steps = 1;
  const fs::path tmp = root / "iter_0000000.tmp", dir = root / "iter_0000000";
  fs::create_directories(tmp);
  write_snapshot(snap, tmp.string());
  nlohmann::json meta = {
      {"iteration", 0},
      {"consumed_samples", 0},
      {"has_optimizer", false},
      {"config_toml", config_to_toml(cfg)},
      {"model", model_to_json(m)},
      {"grid", {{"dp", 1}, {"pp", 1}, {"tp", 1}, {"vp", 1}, {"world_size", 1}, {"distributed_optimizer", false}}}};
  commit_checkpoint_dir(root.string(), tmp.string(), dir.string(), meta, 0);
  return dir.string();
}

// The same tensors (names, shapes, values), in any order.
void expect_same_tensors(const SafetensorsFile& a, const SafetensorsFile& b) {
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (const NamedTensor& t : a.tensors) {
    const NamedTensor& u = named(b, t.name);
    EXPECT_EQ(t.shape, u.shape) << t.name;
    EXPECT_TRUE(t.data == u.data) << t.name;
  }
}

TEST(HfNames, Gpt2TensorsImportAndExportUnchanged) {
  const ModelConfig m = gpt2_model();
  const SafetensorsFile f = gpt2_file(m);
  const ModelConfig got = gpt2_model_from_hf(f, 0, "x.safetensors");
  EXPECT_EQ(model_to_json(got), model_to_json(m));
  Snapshot snap = gpt2_from_hf(f, model_param_specs(got), "x.safetensors");
  // HF's c_attn.weight[i][w*C + o] is tripod's qkv.weight[w][o][i].
  const int64_t C = m.d_model;
  const NamedTensor& c_attn = named(f, "transformer.h.1.attn.c_attn.weight");
  const HostFloats& qkv = snapshot_tensor(snap, "h.1.attn.qkv.weight");
  for (int w : {0, 1, 2})
    for (auto [o, i] : {std::pair<int64_t, int64_t>{0, 0}, {3, 11}, {15, 7}})
      EXPECT_EQ(qkv[(w * C + o) * C + i], c_attn.data[i * 3 * C + w * C + o]) << w << " " << o << " " << i;
  const fs::path dir = test::scratch_dir("hf_gpt2");
  CheckpointReader r(write_checkpoint(snap, m, dir));
  const SafetensorsFile back = gpt2_hf_tensors(r);
  expect_same_tensors(back, f);
  EXPECT_EQ(back.metadata.at("n_heads"), "2");  // the model record, for a later import
  fs::remove_all(dir);
}

TEST(HfNames, Gpt2ImportRefusesNamingTheTensor) {
  const ModelConfig m = gpt2_model();
  auto refused = [&](SafetensorsFile f, const std::string& needle) {
    try {
      gpt2_from_hf(f, model_param_specs(gpt2_model_from_hf(f, 0, "x.safetensors")), "x.safetensors");
      ADD_FAILURE() << "accepted; expected an error naming " << needle;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("x.safetensors"), std::string::npos) << e.what();
    }
  };
  SafetensorsFile extra = gpt2_file(m);
  extra.tensors.push_back({.name = "transformer.h.0.attn.rotary", .shape = {1}, .data = {0.f}});
  refused(extra, "transformer.h.0.attn.rotary");
  SafetensorsFile missing = gpt2_file(m);
  std::erase_if(missing.tensors, [](const NamedTensor& t) { return t.name == "transformer.h.1.mlp.c_proj.bias"; });
  refused(missing, "transformer.h.1.mlp.c_proj.bias");
  SafetensorsFile shape = gpt2_file(m);
  for (NamedTensor& t : shape.tensors)
    if (t.name == "transformer.h.0.mlp.c_fc.weight") t.shape = {64, 16};  // (out, in): not Conv1D's
  refused(shape, "transformer.h.0.mlp.c_fc.weight");
  SafetensorsFile head = gpt2_file(m);
  head.tensors.push_back(named(head, "transformer.wte.weight"));
  head.tensors.back().name = "lm_head.weight";
  head.tensors.back().data[5] += 1;
  refused(head, "lm_head.weight differs");
  SafetensorsFile masks = gpt2_file(m);  // HF's causal-mask buffers are not parameters
  masks.tensors.push_back({.name = "transformer.h.0.attn.bias", .shape = {1}, .data = {1.f}});
  EXPECT_NO_THROW(gpt2_from_hf(masks, model_param_specs(m), "x.safetensors"));
}

TEST(HfNames, LlamaTensorsImportAndExportUnchanged) {
  for (const ModelConfig& m : {llama_model(2), llama_model(4, true)}) {
    SCOPED_TRACE(m.kv_heads());
    const SafetensorsFile w = llama_weights(m);
    EXPECT_NO_THROW(check_llama_layers(w, m, "hf"));
    Snapshot snap = llama_from_hf(w, m, model_param_specs(m), "hf");
    if (m.kv_heads() == m.n_heads) {  // q, k and v joined into the fused (3, C, C)
      const HostFloats& qkv = snapshot_tensor(snap, "h.1.attn.qkv.weight");
      const int64_t n = int64_t{m.d_model} * m.d_model;
      for (int p = 0; p < 3; ++p)
        EXPECT_TRUE(std::equal(qkv.begin() + p * n, qkv.begin() + (p + 1) * n,
                               named(w, llama_hf_name(qkv_part_name("h.1.attn.qkv.weight", p))).data.begin()));
    }
    const fs::path dir = test::scratch_dir("hf_llama");
    CheckpointReader r(write_checkpoint(snap, m, dir));
    expect_same_tensors(llama_hf_tensors(r), w);
    fs::remove_all(dir);
  }
}

TEST(HfNames, LlamaLayersAreBoundedByTheFolder) {
  ModelConfig m = llama_model(2);
  const SafetensorsFile w = llama_weights(m);
  m.n_layers = 1 << 30;  // a config.json claiming more than its folder holds
  try {
    check_llama_layers(w, m, "hf");
    ADD_FAILURE() << "accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.2.input_layernorm.weight"), std::string::npos) << e.what();
  }
  SafetensorsFile tied = llama_weights(llama_model(4, true));
  tied.tensors.push_back(named(tied, "model.embed_tokens.weight"));
  tied.tensors.back().name = "lm_head.weight";
  EXPECT_NO_THROW(llama_from_hf(tied, llama_model(4, true), model_param_specs(llama_model(4, true)), "hf"));
  tied.tensors.back().data[0] += 1;
  EXPECT_THROW(llama_from_hf(tied, llama_model(4, true), model_param_specs(llama_model(4, true)), "hf"), InputError);
}

}  // namespace
}  // namespace tripod
