// Validation of checkpoint metadata.
#include "checkpoint/metadata.h"

#include <set>

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "checkpoint/crc32c.h"
#include "checkpoint/writer.h"
#include "core/error.h"

namespace tripod {

std::string metadata_checksum(nlohmann::json meta) {
  meta.erase("metadata_crc32c");
  const std::string text = meta.dump();
  return fmt::format("{:08x}", crc32c(text.data(), text.size()));
}

namespace {

using json = nlohmann::json;

// A name shard_file_name writes: "pp" digits "_tp" digits "_dp" digits ".h5", at most 255 bytes.
bool is_shard_file_name(const std::string& n) {
  if (n.size() > 255) return false;
  size_t i = 0;
  for (const char* part : {"pp", "_tp", "_dp"}) {
    if (n.compare(i, std::strlen(part), part) != 0) return false;
    i += std::strlen(part);
    const size_t digits = i;
    while (i < n.size() && n[i] >= '0' && n[i] <= '9') ++i;
    if (i == digits) return false;
  }
  return n.compare(i, std::string::npos, ".h5") == 0;
}

// The checks of one object's fields; `where` names the object in errors ("grid").
struct Fields {
  const json& obj;
  const std::string& path;
  std::string where;

  std::string name(const char* key) const { return where.empty() ? key : where + "." + key; }
  [[noreturn]] void fail(const char* key, const std::string& what) const {
    throw InputError(fmt::format("checkpoint metadata {}: field '{}' {}", path, name(key), what));
  }
  const json* find(const char* key, bool required) const {
    auto it = obj.find(key);
    if (it == obj.end()) {
      if (required) fail(key, "is missing");
      return nullptr;
    }
    return &*it;
  }
  // An integer in [lo, hi].
  void integer(const char* key, int64_t lo, int64_t hi = std::numeric_limits<int64_t>::max(),
               bool required = true) const {
    const json* v = find(key, required);
    if (!v) return;
    bool ok = false;
    if (v->is_number_unsigned()) {
      const uint64_t u = v->get<uint64_t>();
      ok = u <= static_cast<uint64_t>(hi) && static_cast<int64_t>(u) >= lo;
    } else if (v->is_number_integer()) {
      ok = v->get<int64_t>() >= lo && v->get<int64_t>() <= hi;
    }
    if (!ok) fail(key, fmt::format("is {}; it must be an integer from {} to {}", v->dump(), lo, hi));
  }
  void number(const char* key) const {
    const json* v = find(key, false);
    if (v && !(v->is_number() && std::isfinite(v->get<double>())))
      fail(key, fmt::format("is {}; it must be a finite number", v->dump()));
  }
  void string(const char* key, bool required = false) const {
    const json* v = find(key, required);
    if (v && !v->is_string()) fail(key, fmt::format("is {}; it must be a string", v->dump()));
  }
  void boolean(const char* key, bool required = false) const {
    const json* v = find(key, required);
    if (v && !v->is_boolean()) fail(key, fmt::format("is {}; it must be true or false", v->dump()));
  }
  Fields object(const char* key, bool required) const {
    static const json empty = json::object();
    const json* v = find(key, required);
    if (v && !v->is_object()) fail(key, fmt::format("is {}; it must be an object", v->dump()));
    return Fields{v ? *v : empty, path, name(key)};
  }
};

}  // namespace

void validate_metadata(const json& meta, const std::string& path) {
  if (!meta.is_object() || meta.value("format", json()) != "tripod-checkpoint")
    throw InputError(fmt::format("checkpoint metadata {} is not a tripod checkpoint's metadata (no \"format\": "
                                 "\"tripod-checkpoint\")", path));
  const Fields top{meta, path, ""};
  top.integer("format_version", 1);
  const int64_t version = meta["format_version"].get<int64_t>();
  if (version > kCheckpointFormatVersion)
    throw InputError(fmt::format("checkpoint metadata {} has format version {}, which this tripod cannot read (it "
                                 "reads versions 1 to {}; written by a newer tripod?)",
                                 path, version, kCheckpointFormatVersion));
  if (version >= 2) {
    top.string("metadata_crc32c", true);
    const std::string want = metadata_checksum(meta), got = meta["metadata_crc32c"].get<std::string>();
    if (got != want)
      throw InputError(fmt::format("checkpoint metadata {} fails its checksum (metadata_crc32c {}, content {}): the "
                                   "file is damaged or was edited", path, got, want));
  }
  top.string("tripod_version");
  top.string("config_toml");
  top.string("source");
  top.boolean("has_optimizer");
  top.integer("iteration", 0);
  top.integer("consumed_samples", 0, std::numeric_limits<int64_t>::max(), false);
  top.integer("global_batch_size", 1, std::numeric_limits<int32_t>::max(), false);
  const json* files = top.find("files", true);
  if (!files->is_array() || files->empty()) top.fail("files", "must be a non-empty array of {name, bytes}");
  for (size_t i = 0; i < files->size(); ++i) {
    const json& f = (*files)[i];
    const std::string where = fmt::format("files[{}]", i);
    if (!f.is_object()) top.fail("files", fmt::format("entry {} is {}, not {{name, bytes}}", i, f.dump()));
    const Fields ff{f, path, where};
    ff.string("name", true);
    const std::string n = f["name"].get<std::string>();
    if (!is_shard_file_name(n))
      ff.fail("name", fmt::format("is {}; it must be a piece's file name, ppNN_tpNN_dpNN.h5",
                                  json(n.size() > 64 ? n.substr(0, 64) + "..." : n).dump()));
    ff.integer("bytes", 0);
  }
  const Fields grid = top.object("grid", true);
  for (const char* k : {"dp", "pp", "tp"}) grid.integer(k, 1, 1 << 20);
  grid.integer("vp", 1, 1 << 20, false);
  grid.integer("cp", 1, 1 << 20, false);
  grid.integer("ep", 1, 1 << 20, false);
  grid.integer("world_size", 1, 1 << 30, false);
  grid.boolean("distributed_optimizer");
  grid.string("schedule");
  grid.string("placement");
  top.string("schedule_csv");
  if (const json* b = top.find("buffers", false)) {
    bool ok = b->is_array();
    for (const json& e : ok ? *b : json::array()) ok = ok && e.is_string();
    if (!ok) top.fail("buffers", fmt::format("is {}; it must be a list of tensor names", b->dump().substr(0, 64)));
  }
  const Fields documents = top.object("documents", false);  // the packed-document keys trained with
  for (const char* k : {"reset_position_ids", "reset_attention_mask", "eod_mask_loss"}) documents.boolean(k);
  documents.integer("eod_token", -1, std::numeric_limits<int32_t>::max(), false);
  const Fields model = top.object("model", false);
  auto scalar = [](const json& v) {
    return v.is_string() || v.is_boolean() || (v.is_number() && std::isfinite(v.get<double>()));
  };
  for (const auto& [k, v] : model.obj.items()) {
    if (k == "moe" && v.is_object()) {  // the [moe] keys of a mixture of experts
      const Fields moe = model.object("moe", true);
      for (const auto& [mk, mv] : v.items())
        if (!scalar(mv)) moe.fail(mk.c_str(), fmt::format("is {}; it must be a number, string or boolean", mv.dump()));
      for (const char* mk : {"experts", "top_k"}) moe.integer(mk, 1, 1 << 20, false);
      continue;
    }
    if (!scalar(v)) model.fail(k.c_str(), fmt::format("is {}; it must be a number, string or boolean", v.dump()));
  }
  for (const char* k : {"n_layers", "n_heads", "d_model", "vocab_size"}) model.integer(k, 1, 1 << 30, false);
  for (const char* k : {"ffn_hidden", "seq_len", "max_positions"}) model.integer(k, 1, 1 << 30, false);
  const Fields trainer = top.object("trainer", false);
  for (const char* k : {"skipped_total", "bad_in_a_row", "adam_steps"})
    trainer.integer(k, 0, std::numeric_limits<int64_t>::max(), false);
  const Fields lr = top.object("lr_schedule", false);
  for (const char* k : {"lr", "min_lr", "next_lr"}) lr.number(k);
  for (const char* k : {"warmup_steps", "total_steps", "next_step"})
    lr.integer(k, 0, std::numeric_limits<int64_t>::max(), false);
  lr.string("decay");
}

void check_model_record(const json& recorded, const json& current, const std::string& path) {
  auto refuse = [&](const std::string& key, const std::string& was, const std::string& now) {
    throw InputError(fmt::format("checkpoint {} holds a model with {} = {}, this run's model has {}: it computes "
                                 "another function; load it with the same model config",
                                 path, key, was, now));
  };
  for (const auto& [key, was] : recorded.items()) {
    if (key == "seq_len" || key == "moe") continue;  // seq_len: positions are compared by max_positions
    auto now = current.find(key);
    const std::string here = now == current.end() ? "(not a key of this model)" : now->dump();
    if (now == current.end() || *now != was) refuse("model." + key, was.dump(), here);
  }
  // Recorded only where they change the model (config/config.h model_to_json): absent is the
  // default (false; a dense model), compared both ways.
  auto qk = [](const json& m) { return m.value("qk_norm", false); };
  if (qk(recorded) != qk(current)) refuse("model.qk_norm", json(qk(recorded)).dump(), json(qk(current)).dump());
  const json none = json::object();
  const json& was_moe = recorded.contains("moe") ? recorded["moe"] : none;
  const json& now_moe = current.contains("moe") ? current["moe"] : none;
  if (was_moe.empty() != now_moe.empty())
    refuse("moe.experts", was_moe.empty() ? "0 (a dense model)" : was_moe.value("experts", json()).dump(),
           now_moe.empty() ? "0 (a dense model)" : now_moe.value("experts", json()).dump());
  // The losses' coefficients, the capacity and the bias update rate are training choices: a run
  // may change them (a selection bias present on one side only shows as a missing tensor).
  static const std::set<std::string> training = {"aux_loss_coeff", "z_loss_coeff", "capacity_factor",
                                                 "bias_update_rate"};
  for (const auto& [key, was] : was_moe.items()) {
    if (training.count(key)) continue;
    auto now = now_moe.find(key);
    if (now == now_moe.end() || *now != was)
      refuse("moe." + key, was.dump(), now == now_moe.end() ? "(not a key of this model)" : now->dump());
  }
}

}  // namespace tripod
