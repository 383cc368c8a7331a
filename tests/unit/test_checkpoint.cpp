// Checkpoint pieces in one process: the CRC32C check value, resharding geometry against a whole
// tensor, safetensors files, and weights taken through safetensors and back giving the same loss.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>

#include "checkpoint/crc32c.h"
#include "checkpoint/llama_hf.h"
#include "checkpoint/load.h"
#include "checkpoint/metadata.h"
#include "checkpoint/reader.h"
#include "checkpoint/writer.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/shard_spec.h"
#include "checkpoint/verify.h"
#include "cli_util.h"
#include "harness.h"

namespace tripod {
namespace {

namespace fs = std::filesystem;

TEST(Crc32c, KnownValues) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);  // the standard check value (RFC 3720)
  EXPECT_EQ(crc32c("", 0), 0u);
  std::string s(1000, 'x');
  for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<char>(i * 7);
  EXPECT_EQ(crc32c(s.data() + 10, 990, crc32c(s.data(), 10)), crc32c(s.data(), 1000));  // continuation
}

// Long inputs (the interleaved streams) against a bit-at-a-time reference, continued and combined.
TEST(Crc32c, LongInputsMatchTheDefinition) {
  std::string s(100003, '\0');
  for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<char>((i * 2654435761u) >> 13);
  auto reference = [](const std::string& d) {
    uint32_t c = ~0u;
    for (unsigned char b : d) {
      c ^= b;
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
    }
    return ~c;
  };
  const uint32_t want = reference(s);
  EXPECT_EQ(crc32c(s.data(), s.size()), want);
  for (size_t cut : {size_t{1}, size_t{4096}, size_t{12289}, size_t{50000}, s.size()}) {
    const uint32_t a = crc32c(s.data(), cut), b = crc32c(s.data() + cut, s.size() - cut);
    EXPECT_EQ(crc32c(s.data() + cut, s.size() - cut, a), want) << cut;
    EXPECT_EQ(crc32c_combine(a, b, s.size() - cut), want) << cut;
  }
}

// A (3, 8, 6) tensor split along dim 1 across tp = 2, each TP box further split into flat
// distributed-optimizer pieces, reassembled as tp = 4 boxes and as the whole tensor.
TEST(ShardSpec, PiecesOfOneGridAssembleIntoAnother) {
  const Shape g = {3, 8, 6};
  std::vector<float> whole(shape_numel(g));
  std::iota(whole.begin(), whole.end(), 0.f);
  auto at = [&](int64_t a, int64_t b, int64_t c) { return whole[(a * 8 + b) * 6 + c]; };
  struct Stored {
    PieceGeom geom;
    std::vector<float> data;
  };
  std::vector<Stored> stored;
  for (int r = 0; r < 2; ++r) {
    PieceGeom box{.global_shape = g, .shard_dim = 1, .box_offset = r * 4, .box_size = 4, .flat_begin = 0,
                  .flat_end = 72};
    std::vector<float> local;
    for (int64_t a = 0; a < 3; ++a)
      for (int64_t b = 0; b < 4; ++b)
        for (int64_t c = 0; c < 6; ++c) local.push_back(at(a, r * 4 + b, c));
    for (auto [b, e] : {std::pair<int64_t, int64_t>{0, 29}, {29, 72}}) {  // uneven DP cut
      PieceGeom p = box;
      p.flat_begin = b;
      p.flat_end = e;
      stored.push_back({p, std::vector<float>(local.begin() + b, local.begin() + e)});
    }
  }
  for (int r = 0; r < 4; ++r) {
    PieceGeom target{.global_shape = g, .shard_dim = 1, .box_offset = r * 2, .box_size = 2, .flat_begin = 5,
                     .flat_end = 31};
    std::vector<float> out(target.numel(), -1.f);
    int64_t n = 0;
    for (const Stored& s : stored) n += copy_overlap(s.geom, s.data.data(), target, out.data());
    EXPECT_EQ(n, target.numel());
    for (int64_t i = 0; i < target.numel(); ++i) {
      int64_t f = i + 5, a = f / 12, b = (f / 6) % 2, c = f % 6;
      EXPECT_EQ(out[i], at(a, r * 2 + b, c)) << "tp rank " << r << " element " << f;
    }
  }
  PieceGeom all{.global_shape = g, .shard_dim = -1, .box_offset = 0, .box_size = 3, .flat_begin = 0, .flat_end = 144};
  std::vector<float> out(144, -1.f);
  for (const Stored& s : stored) copy_overlap(s.geom, s.data.data(), all, out.data());
  EXPECT_EQ(out, whole);
  // The whole tensor as one stored piece feeds a split target too (converted weights).
  PieceGeom target{.global_shape = g, .shard_dim = 1, .box_offset = 6, .box_size = 2, .flat_begin = 0, .flat_end = 36};
  std::vector<float> part(36);
  EXPECT_EQ(copy_overlap(all, whole.data(), target, part.data()), 36);
  EXPECT_EQ(part[13], at(1, 6 + 0, 1));
  // Two pieces split along different dims, neither whole: refused.
  PieceGeom other{.global_shape = g, .shard_dim = 2, .box_offset = 0, .box_size = 3, .flat_begin = 0, .flat_end = 72};
  EXPECT_THROW(overlap_count(other, target), InputError);
}

TEST(ShardSpec, IterDirNames) {
  EXPECT_EQ(iter_dir_name(42), "iter_0000042");
  EXPECT_EQ(parse_iter_dir_name("iter_0000042"), 42);
  EXPECT_EQ(parse_iter_dir_name("iter_0000042.tmp"), -1);
  EXPECT_EQ(parse_iter_dir_name("latest"), -1);
  EXPECT_EQ(parse_iter_dir_name("iter_99999999999999999999999"), -1);  // would overflow
}

// Commits of hand-made directories: a re-save of an existing iteration replaces it in one step,
// `latest` never moves back, and `keep` removes only the same run's older checkpoints.
TEST(CheckpointCommit, ResaveLatestAndKeep) {
  const fs::path root = test::scratch_dir("commit");
  auto commit = [&](int64_t it, const std::string& run, const std::string& content, int keep) {
    const fs::path tmp = root / (iter_dir_name(it) + ".tmp");
    fs::create_directories(tmp);
    test::write_file(tmp / "pp00_tp00_dp00.h5", content);
    commit_checkpoint_dir(root.string(), tmp.string(), (root / iter_dir_name(it)).string(),
                          {{"iteration", it}, {"run_id", run}}, keep);
  };
  commit(5, "A", "a5", 0);
  commit(6, "A", "a6", 0);
  EXPECT_EQ(test::slurp(root / "latest"), "iter_0000006\n");
  commit(5, "B", "b5", 0);  // a run resumed from an earlier checkpoint saves iteration 5 again
  EXPECT_EQ(test::slurp(root / "iter_0000005" / "pp00_tp00_dp00.h5"), "b5");
  EXPECT_EQ(test::slurp(root / "latest"), "iter_0000006\n") << "latest moved back";
  for (const auto& e : fs::directory_iterator(root))
    EXPECT_EQ(parse_iter_dir_name(e.path().filename().string()) >= 0 || e.path().filename() == "latest", true)
        << "left behind: " << e.path();
  commit(7, "B", "b7", 1);  // keep 1: B's iteration 5 goes, A's iteration 6 stays
  EXPECT_FALSE(fs::exists(root / "iter_0000005"));
  EXPECT_TRUE(fs::exists(root / "iter_0000006"));
  EXPECT_EQ(test::slurp(root / "latest"), "iter_0000007\n");
  EXPECT_EQ(committed_checkpoints(root.string()).size(), 2u);
  fs::remove_all(root);
}

TEST(CheckpointMetadata, EveryFieldIsCheckedAndTheModelComparedByKey) {
  nlohmann::json m = {{"format", "tripod-checkpoint"}, {"format_version", 2}, {"iteration", 4},
                      {"files", {{{"name", "pp00_tp00_dp00.h5"}, {"bytes", 10}}}},
                      {"grid", {{"dp", 1}, {"pp", 1}, {"tp", 1}}}, {"model", {{"n_heads", 2}, {"seq_len", 8}}}};
  m["metadata_crc32c"] = metadata_checksum(m);
  EXPECT_NO_THROW(validate_metadata(m, "m.json"));
  auto refused = [&](const std::function<void(nlohmann::json&)>& edit, const std::string& needle, bool resum = true) {
    nlohmann::json bad = m;
    edit(bad);
    if (resum) bad["metadata_crc32c"] = metadata_checksum(bad);
    try {
      validate_metadata(bad, "m.json");
      ADD_FAILURE() << "accepted: " << bad.dump();
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("m.json"), std::string::npos) << e.what();
    }
  };
  refused([](auto& j) { j["iteration"] = -2; }, "'iteration'");
  refused([](auto& j) { j["iteration"] = "3"; }, "'iteration'");
  refused([](auto& j) { j.erase("grid"); }, "'grid' is missing");
  refused([](auto& j) { j["grid"]["tp"] = 0.5; }, "'grid.tp'");
  refused([](auto& j) { j["files"][0]["name"] = "../x.h5"; }, "'files[0].name'");
  // Only the names pieces are written under: a name longer than a file name may be (fuzzing found
  // that the reader's std::filesystem calls threw on one) or with a line break is refused too.
  refused([](auto& j) { j["files"][0]["name"] = "pp00_tp00_dp00" + std::string(300, '0') + ".h5"; }, "'files[0].name'");
  refused([](auto& j) { j["files"][0]["name"] = "pp0\n_tp00_dp00.h5"; }, "'files[0].name'");
  refused([](auto& j) { j["files"][0]["name"] = "pp00_tp00_dp00.h5x"; }, "'files[0].name'");
  refused([](auto& j) { j["model"]["n_heads"] = nullptr; }, "'model.n_heads'");
  refused([](auto& j) { j["iteration"] = 5; }, "checksum", /*resum=*/false);
  // The model: every recorded key but seq_len, named with both values.
  EXPECT_NO_THROW(check_model_record(m["model"], {{"n_heads", 2}, {"seq_len", 16}}, "ck"));
  try {
    check_model_record(m["model"], {{"n_heads", 4}, {"seq_len", 8}}, "ck");
    ADD_FAILURE() << "n_heads 2 vs 4 accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("model.n_heads = 2, this run's model has 4"), std::string::npos) << e.what();
  }
  EXPECT_THROW(check_model_record({{"norm", "rmsnorm"}}, {{"n_heads", 2}}, "ck"), InputError);
}

TEST(Safetensors, WriteReadAndRefuseTruncated) {
  auto dir = test::scratch_dir("st_unit");
  SafetensorsFile f;
  f.metadata["n_head"] = "4";
  f.tensors.push_back({"a", {2, 3}, {1, 2, 3, 4, 5, 6}});
  f.tensors.push_back({"b.c", {1}, {-0.5f}});
  write_safetensors((dir / "x.safetensors").string(), f);
  SafetensorsFile g = read_safetensors((dir / "x.safetensors").string());
  ASSERT_EQ(g.tensors.size(), 2u);
  EXPECT_EQ(g.tensors[0].name, "a");
  EXPECT_EQ(g.tensors[0].shape, Shape({2, 3}));
  EXPECT_EQ(g.tensors[0].data, f.tensors[0].data);
  EXPECT_EQ(g.tensors[1].data, f.tensors[1].data);
  EXPECT_EQ(g.metadata["n_head"], "4");
  // The header is padded to 8 bytes and the data follow it.
  EXPECT_EQ(fs::file_size(dir / "x.safetensors") % 4, 0u);
  fs::resize_file(dir / "x.safetensors", fs::file_size(dir / "x.safetensors") - 4);
  try {
    read_safetensors((dir / "x.safetensors").string());
    ADD_FAILURE() << "a truncated file was read";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("x.safetensors"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

// Weights exported to safetensors and imported back train exactly like the original weights.
TEST(CheckpointTrainer, SafetensorsRoundTripGivesTheSameLoss) {
  auto ops = make_ops(Device::CPU);
  SyntheticSource data(16, 100, 3);
  auto self = test::make_selfworld(*ops);
  auto dir = test::scratch_dir("st_trainer");
  Config cfg = test::tiny_config(2, 32, 4, 16, 100);
  cfg.checkpoint.dir = (dir / "ck").string();
  validate_layout(cfg, 1);
  Trainer t1(cfg, *ops, *self.par, &data);
  for (int s = 0; s < 3; ++s) t1.step();
  t1.save_checkpoint();
  t1.finish_checkpoints();
  const std::string bin = test::tripod_bin();
  auto r = test::run_cmd(bin + " ckpt convert " + (dir / "ck").string() + " --to safetensors " +
                         (dir / "w.safetensors").string());
  ASSERT_EQ(r.status, 0) << r.err;
  r = test::run_cmd(bin + " ckpt convert " + (dir / "w.safetensors").string() + " --from safetensors " +
                    (dir / "imported").string() + " --n-heads 4");
  ASSERT_EQ(r.status, 0) << r.err;

  Config c2 = cfg;
  c2.checkpoint.dir = "";
  c2.checkpoint.load = (dir / "imported").string();
  Trainer t2(c2, *ops, *self.par, &data);  // params only: step 0, fresh optimizer
  EXPECT_EQ(t2.completed_steps(), 0);
  Config c3 = cfg;
  c3.checkpoint.dir = "";
  Trainer t3(c3, *ops, *self.par, &data);  // the reference: t1's values copied in memory
  Trainer fresh(c3, *ops, *self.par, &data);
  ops->copy(t1.registry().flat_values(), t3.registry().flat_values());
  // load_param_values (the values-only entry point) gives the same values too.
  Trainer t4(c3, *ops, *self.par, &data);
  EXPECT_EQ(load_param_values(resolve_checkpoint((dir / "imported").string(), ""), t4.registry(), *ops), 0);
  // A root, its `latest` file and the directory it names all resolve to the same checkpoint.
  EXPECT_EQ(resolve_checkpoint((dir / "imported" / "latest").string(), ""),
            resolve_checkpoint((dir / "imported").string(), ""));
  const float* v1 = t1.registry().flat_values().data<float>();
  for (Trainer* t : {&t2, &t4})
    EXPECT_TRUE(std::equal(v1, v1 + t1.registry().flat_size(), t->registry().flat_values().data<float>()));
  double fresh_loss = fresh.step().loss;
  for (int s = 0; s < 2; ++s) {
    double a = t2.step().loss, b = t3.step().loss;
    EXPECT_EQ(a, b) << "step " << s + 1;
    if (s == 0) {
      EXPECT_NE(a, fresh_loss);  // the loaded weights are not the initial ones
    }
  }
  fs::remove_all(dir);
}

// verify_checkpoint: a whole checkpoint passes with its counts; a damaged piece is a problem
// naming the tensor and its file, returned (not thrown) so the command can list them all.
TEST(CheckpointVerify, CountsEverythingAndReturnsProblems) {
  auto ops = make_ops(Device::CPU);
  SyntheticSource data(16, 100, 3);
  auto self = test::make_selfworld(*ops);
  auto dir = test::scratch_dir("verify");
  Config cfg = test::tiny_config(2, 32, 4, 16, 100);
  cfg.checkpoint.dir = (dir / "ck").string();
  validate_layout(cfg, 1);
  Trainer t(cfg, *ops, *self.par, &data);
  t.step();
  t.save_checkpoint();
  t.finish_checkpoints();
  const std::string ck = resolve_checkpoint(cfg.checkpoint.dir, "");
  const VerifyResult v = verify_checkpoint(ck);
  EXPECT_TRUE(v.ok()) << v.problems.front();
  EXPECT_EQ(v.dir, ck);
  EXPECT_EQ(v.files, 1);
  const int64_t tensors = static_cast<int64_t>(t.registry().params().size());
  EXPECT_EQ(v.tensors, tensors);
  EXPECT_EQ(v.datasets, 3 * tensors);  // value, m, v (f32 values are the master)
  EXPECT_TRUE(v.optimizer_state);
  int64_t bytes = 0;  // every stored element, vocabulary padding excluded, three times
  for (const Param& p : t.registry().params())
    bytes += 3 * 4 * (p.spec.vocab_rows >= 0 ? p.spec.vocab_rows * p.spec.global_shape[1] : p.numel());
  EXPECT_EQ(v.bytes, bytes);
  // One value flipped inside the stored data of h.1.mlp.fc.weight.
  CheckpointReader r(ck);
  const StoredPiece* fc = nullptr;
  for (const StoredPiece& p : r.index())
    if (p.spec.name == "h.1.mlp.fc.weight" && p.spec.kind == StateKind::Value) fc = &p;
  ASSERT_NE(fc, nullptr);
  const std::vector<float> values = r.read_piece(*fc);
  std::string bytes_of_file = test::slurp(fc->file);
  const std::string needle(reinterpret_cast<const char*>(values.data()), 64);
  const size_t at = bytes_of_file.find(needle);
  ASSERT_NE(at, std::string::npos);
  bytes_of_file[at + 40] ^= 0x01;
  std::ofstream(fc->file, std::ios::binary) << bytes_of_file;
  const VerifyResult bad = verify_checkpoint(ck);
  ASSERT_EQ(bad.problems.size(), 1u);
  EXPECT_NE(bad.problems[0].find("h.1.mlp.fc.weight"), std::string::npos) << bad.problems[0];
  EXPECT_NE(bad.problems[0].find("pp00_tp00_dp00.h5"), std::string::npos) << bad.problems[0];
  fs::remove_all(dir);
}

// Hugging Face LlamaConfig: the writer and the parser are inverse, and every field is checked.
ModelConfig llama(int layers, int heads, int kv, int d_model, bool tie, bool bias) {
  Config c = test::tiny_config(layers, d_model, heads, 8, 64);
  c.model.arch = Arch::Llama;
  c.model.norm = NormKind::RmsNorm;
  c.model.position = PositionKind::Rope;
  c.model.mlp = MlpKind::SwiGlu;
  c.model.n_kv_heads = kv;
  c.model.tie_embeddings = tie;
  c.model.bias = bias;
  c.model.rope_theta = 500000.0;
  c.model.norm_eps = 1e-5;
  return c.model;
}

TEST(LlamaHfConfig, WriterAndParserAreInverse) {
  for (const ModelConfig& m : {llama(2, 4, 2, 32, false, false), llama(3, 4, 4, 32, true, false),
                               llama(1, 2, 1, 16, true, true)}) {
    const ModelConfig back = llama_model_from_hf(llama_hf_config(m), "config.json");
    EXPECT_EQ(model_to_json(back), model_to_json(m)) << llama_hf_config(m).dump();
    EXPECT_NO_THROW(check_llama_agrees(back, m, "config.json", "c.toml"));
  }
  // The checked-in Hugging Face folder's config.json (written by transformers): GQA, untied.
  const auto hf = nlohmann::json::parse(test::slurp(std::string(TRIPOD_SOURCE_PATH) + "/tests/fixtures/llama_hf/config.json"));
  const ModelConfig m = llama_model_from_hf(hf, "config.json");
  EXPECT_EQ(m.d_model, 32);
  EXPECT_EQ(m.ffn_hidden, 48);
  EXPECT_EQ(m.n_heads, 4);
  EXPECT_EQ(m.kv_heads(), 2);
  EXPECT_EQ(m.seq_len, 8);
  EXPECT_EQ(m.rope_theta, 500000.0);
  EXPECT_FALSE(m.tie_embeddings);
  EXPECT_TRUE(llama_shaped(m));
  // Hugging Face's defaults for absent and null keys.
  nlohmann::json bare = hf;
  for (const char* k : {"num_key_value_heads", "rms_norm_eps", "rope_theta", "head_dim", "tie_word_embeddings"})
    bare.erase(k);
  bare["attention_bias"] = nullptr;
  const ModelConfig d = llama_model_from_hf(bare, "config.json");
  EXPECT_EQ(d.kv_heads(), 4);
  EXPECT_EQ(d.norm_eps, 1e-6);
  EXPECT_EQ(d.rope_theta, 10000.0);
  EXPECT_FALSE(d.tie_embeddings);
  EXPECT_FALSE(d.bias);
}

TEST(LlamaHfConfig, EveryFieldIsCheckedByTypeAndRange) {
  const nlohmann::json good = llama_hf_config(llama(2, 4, 2, 32, false, false));
  ASSERT_NO_THROW(llama_model_from_hf(good, "dir/config.json"));
  using Edit = std::function<void(nlohmann::json&)>;
  for (const auto& [needle, edit] : std::vector<std::pair<std::string, Edit>>{
           {"model_type", [](auto& j) { j["model_type"] = 3; }},
           {"model_type", [](auto& j) { j["model_type"] = "mistral"; }},
           {"model_type", [](auto& j) { j.erase("model_type"); }},
           {"hidden_size = \"32\"", [](auto& j) { j["hidden_size"] = "32"; }},
           {"hidden_size = 32.5", [](auto& j) { j["hidden_size"] = 32.5; }},
           {"hidden_size is missing", [](auto& j) { j.erase("hidden_size"); }},
           {"intermediate_size = -48", [](auto& j) { j["intermediate_size"] = -48; }},
           {"num_hidden_layers = 2147483648", [](auto& j) { j["num_hidden_layers"] = 1ll << 31; }},
           {"num_hidden_layers = 18446744073709551615", [](auto& j) { j["num_hidden_layers"] = ~0ull; }},
           {"num_attention_heads = 0", [](auto& j) { j["num_attention_heads"] = 0; }},
           {"num_attention_heads = 3 does not divide hidden_size", [](auto& j) { j["num_attention_heads"] = 3; }},
           {"num_key_value_heads = 3 does not divide", [](auto& j) { j["num_key_value_heads"] = 3; }},
           {"num_key_value_heads = [2]", [](auto& j) { j["num_key_value_heads"] = {2}; }},
           {"vocab_size = 1 must be >= 2", [](auto& j) { j["vocab_size"] = 1; }},
           {"max_position_embeddings = 0", [](auto& j) { j["max_position_embeddings"] = 0; }},
           {"rms_norm_eps = -1", [](auto& j) { j["rms_norm_eps"] = -1; }},
           {"rms_norm_eps = \"1e-5\"", [](auto& j) { j["rms_norm_eps"] = "1e-5"; }},
           {"rope_theta = 0", [](auto& j) { j["rope_theta"] = 0; }},
           {"rope_scaling", [](auto& j) { j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}}; }},
           {"hidden_act = \"gelu\"", [](auto& j) { j["hidden_act"] = "gelu"; }},
           {"hidden_act = {}", [](auto& j) { j["hidden_act"] = nlohmann::json::object(); }},
           {"attention_bias = 1", [](auto& j) { j["attention_bias"] = 1; }},
           {"attention_bias = true but mlp_bias = false", [](auto& j) { j["attention_bias"] = true; }},
           {"tie_word_embeddings = \"yes\"", [](auto& j) { j["tie_word_embeddings"] = "yes"; }},
           {"head_dim = 16", [](auto& j) { j["head_dim"] = 16; }},
           {"= 3 is odd", [](auto& j) { j["hidden_size"] = 12, j["head_dim"] = 3; }}}) {
    nlohmann::json bad = good;
    edit(bad);
    try {
      llama_model_from_hf(bad, "dir/config.json");
      ADD_FAILURE() << "accepted: " << bad.dump();
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).rfind("dir/config.json: ", 0), 0u) << e.what();
    }
  }
  EXPECT_THROW(llama_model_from_hf(nlohmann::json::array({good}), "dir/config.json"), InputError);
}

TEST(LlamaHfConfig, AgreementWithTheConfigNamesBothKeys) {
  const ModelConfig hf = llama(2, 4, 2, 32, false, false);
  ModelConfig c = hf;
  c.seq_len = 4;  // the positions a run trains on are its own choice
  EXPECT_NO_THROW(check_llama_agrees(hf, c, "d/config.json", "c.toml"));
  using Edit = std::function<void(ModelConfig&)>;
  for (const auto& [needle, edit] : std::vector<std::pair<std::string, Edit>>{
           {"num_key_value_heads = 2 but model.n_kv_heads = 4", [](auto& m) { m.n_kv_heads = 4; }},
           {"num_hidden_layers = 2 but model.n_layers = 3", [](auto& m) { m.n_layers = 3; }},
           {"rope_theta = 500000 but model.rope_theta = 10000", [](auto& m) { m.rope_theta = 10000; }},
           {"tie_word_embeddings = false but model.tie_embeddings = true", [](auto& m) { m.tie_embeddings = true; }},
           {"model.arch = \"gpt2\"", [](auto& m) { m = test::tiny_config(2, 32, 4, 8, 64).model; }}}) {
    ModelConfig other = hf;
    edit(other);
    try {
      check_llama_agrees(hf, other, "d/config.json", "c.toml");
      ADD_FAILURE() << needle;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("in c.toml"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace tripod
