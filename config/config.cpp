// TOML -> typed config, with validation that names the key and what is valid.
#include "config/config.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <fstream>
#include <set>
#include <sstream>
#include <variant>
#include <toml++/toml.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/gpt.h"
#include "parallel/pipeline/schedules.h"

namespace tripod {

namespace {

// A key whose value is one of an enum's names (core/enum_names.h): parsed into the enum here, the
// boundary, and written back by name.
// parallel.layers_per_stage: a list of layer counts, or "auto".
struct LayerSplitRef {
  std::vector<int>* counts;
  bool* balanced;
};

// moe.layers: "all", or {first_dense = N} (the first N layers keep their dense MLP).
struct MoeLayersRef {
  int* first_dense;
};

// data.eod_token: a piece (a string) or a token id (an integer).
struct EodTokenRef {
  std::string* piece;
  int64_t* id;
};

struct EnumRef {
  void* ptr;
  std::string_view (*name)(const void*);
  bool (*parse)(void*, std::string_view);
  std::string (*choices)();
  template <class E>
  explicit EnumRef(E* e)
      : ptr(e),
        name([](const void* p) { return enum_name(*static_cast<const E*>(p)); }),
        parse([](void* p, std::string_view text) {
          const std::optional<E> v = parse_choice<E>(text);
          if (v) *static_cast<E*>(p) = *v;
          return v.has_value();
        }),
        choices(&enum_choices<E>) {}
};

// Reads the keys of one [section], remembering which were read so the rest can be refused.
class Section {
 public:
  Section(const toml::table& root, std::string name, std::string origin) : name_(std::move(name)), origin_(origin) {
    if (auto node = root.get(name_)) {
      table_ = node->as_table();
      TRIPOD_INPUT_CHECK(table_, "{}: '{}' must be a table ([{}])", origin_, name_, name_);
    }
  }

  std::string key(const char* k) const { return fmt::format("{}.{}", name_, k); }

  template <class T> bool get(const char* k, T& out) {
    seen_.insert(k);
    if (!table_) return false;
    const toml::node* node = table_->get(k);
    if (!node) return false;
    if constexpr (std::is_same_v<T, bool>) {
      auto v = node->value<bool>();
      TRIPOD_INPUT_CHECK(v && node->is_boolean(), "{}: {} must be true or false", origin_, key(k));
      out = *v;
    } else if constexpr (std::is_integral_v<T>) {
      TRIPOD_INPUT_CHECK(node->is_integer(), "{}: {} must be an integer, got {}", origin_, key(k), type_of(*node));
      int64_t v = *node->value<int64_t>();
      if constexpr (std::is_unsigned_v<T>)
        TRIPOD_INPUT_CHECK(v >= 0, "{}: {} must be >= 0, got {}", origin_, key(k), v);
      TRIPOD_INPUT_CHECK(static_cast<int64_t>(static_cast<T>(v)) == v, "{}: {} = {} is out of range", origin_, key(k), v);
      out = static_cast<T>(v);
    } else if constexpr (std::is_floating_point_v<T>) {
      TRIPOD_INPUT_CHECK(node->is_number(), "{}: {} must be a number, got {}", origin_, key(k), type_of(*node));
      out = *node->value<double>();
      TRIPOD_INPUT_CHECK(std::isfinite(out), "{}: {} must be a finite number, got {}", origin_, key(k), out);
    } else if constexpr (std::is_same_v<T, std::string>) {
      TRIPOD_INPUT_CHECK(node->is_string(), "{}: {} must be a string, got {}", origin_, key(k), type_of(*node));
      out = *node->value<std::string>();
    } else if constexpr (std::is_same_v<T, EnumRef>) {
      TRIPOD_INPUT_CHECK(node->is_string(), "{}: {} must be a string (one of {}), got {}", origin_, key(k),
                         out.choices(), type_of(*node));
      const std::string v = *node->value<std::string>();
      TRIPOD_INPUT_CHECK(out.parse(out.ptr, v), "{}: {} = \"{}\" is not one of {}", origin_, key(k), v, out.choices());
    } else if constexpr (std::is_same_v<T, EodTokenRef>) {
      out.piece->clear();
      *out.id = -1;
      if (node->is_integer()) {
        const int64_t v = *node->value<int64_t>();
        TRIPOD_INPUT_CHECK(v >= 0 && v <= std::numeric_limits<int32_t>::max(),
                           "{}: {} = {} is not a token id (give an id >= 0, or the token's piece as a string)",
                           origin_, key(k), v);
        *out.id = v;
      } else {
        TRIPOD_INPUT_CHECK(node->is_string(), "{}: {} must be a token id (an integer) or the token's piece (a string), "
                           "got {}", origin_, key(k), type_of(*node));
        *out.piece = *node->value<std::string>();
      }
    } else if constexpr (std::is_same_v<T, LayerSplitRef>) {
      out.counts->clear();
      *out.balanced = false;
      if (node->is_string()) {
        const std::string v = *node->value<std::string>();
        TRIPOD_INPUT_CHECK(v == "auto",
                           "{}: {} = \"{}\" is not valid: give \"auto\" (layers split so the stages' predicted costs "
                           "are even) or a list of layer counts, one per virtual stage",
                           origin_, key(k), v);
        *out.balanced = true;
        return true;
      }
      auto* arr = node->as_array();
      TRIPOD_INPUT_CHECK(arr, "{}: {} must be \"auto\" or a list of layer counts (one per virtual stage), got {}",
                         origin_, key(k), type_of(*node));
      for (auto& e : *arr) {
        TRIPOD_INPUT_CHECK(e.is_integer() && *e.value<int64_t>() == static_cast<int>(*e.value<int64_t>()),
                           "{}: {} must be \"auto\" or a list of integers (layer counts per virtual stage)", origin_,
                           key(k));
        out.counts->push_back(static_cast<int>(*e.value<int64_t>()));
      }
    } else if constexpr (std::is_same_v<T, std::vector<EvalTaskConfig>>) {
      out.clear();
      auto* arr = node->as_array();
      TRIPOD_INPUT_CHECK(arr, "{}: {} must be a list of tables like {{name = \"hellaswag\", path = \"FILE\"}}, got {}",
                         origin_, key(k), type_of(*node));
      for (size_t i = 0; i < arr->size(); ++i) out.push_back(eval_task(*arr->get(i), fmt::format("{}[{}]", key(k), i)));
    } else if constexpr (std::is_same_v<T, MoeLayersRef>) {
      const char* valid = "\"all\" (every layer a mixture of experts) or {first_dense = N} (the first N layers dense)";
      if (node->is_string()) {
        const std::string v = *node->value<std::string>();
        TRIPOD_INPUT_CHECK(v == "all", "{}: {} = \"{}\" is not valid: give {}", origin_, key(k), v, valid);
        *out.first_dense = 0;
        return true;
      }
      const toml::table* t = node->as_table();
      TRIPOD_INPUT_CHECK(t && t->size() == 1 && t->get("first_dense") && t->get("first_dense")->is_integer(),
                         "{}: {} must be {}, got {}", origin_, key(k), valid, type_of(*node));
      const int64_t v = *t->get("first_dense")->value<int64_t>();
      TRIPOD_INPUT_CHECK(v >= 0 && v <= (1 << 30), "{}: {}.first_dense must be >= 0, got {}", origin_, key(k), v);
      *out.first_dense = static_cast<int>(v);
    } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
      out.clear();
      if (node->is_string()) {
        out.push_back(*node->value<std::string>());
        return true;
      }
      auto* arr = node->as_array();
      TRIPOD_INPUT_CHECK(arr, "{}: {} must be a list of strings, got {}", origin_, key(k), type_of(*node));
      for (auto& e : *arr) {
        TRIPOD_INPUT_CHECK(e.is_string(), "{}: {} must be a list of strings", origin_, key(k));
        out.push_back(*e.value<std::string>());
      }
    } else if constexpr (std::is_same_v<T, std::vector<double>> || std::is_same_v<T, std::vector<int>>) {
      out.clear();
      auto* arr = node->as_array();
      TRIPOD_INPUT_CHECK(arr, "{}: {} must be a list of numbers, got {}", origin_, key(k), type_of(*node));
      for (auto& e : *arr) {
        if constexpr (std::is_same_v<T, std::vector<int>>) {
          TRIPOD_INPUT_CHECK(e.is_integer() && *e.value<int64_t>() == static_cast<int>(*e.value<int64_t>()),
                             "{}: {} must be a list of integers", origin_, key(k));
          out.push_back(static_cast<int>(*e.value<int64_t>()));
        } else {
          TRIPOD_INPUT_CHECK(e.is_number() && std::isfinite(*e.value<double>()),
                             "{}: {} must be a list of finite numbers", origin_, key(k));
          out.push_back(*e.value<double>());
        }
      }
    }
    return true;
  }

  // Refuses keys nobody asked for.
  void finish() const {
    if (!table_) return;
    for (auto& [k, v] : *table_) {
      std::string ks(k.str());
      if (!seen_.count(ks))
        throw InputError(fmt::format("{}: unknown key {}.{} (valid keys of [{}]: {})", origin_, name_, ks, name_,
                                     fmt::join(seen_, ", ")));
    }
  }

 private:
  // One task of eval.tasks: {name, path, limit, tag}; `where` is "eval.tasks[i]".
  EvalTaskConfig eval_task(const toml::node& node, const std::string& where) const {
    const toml::table* t = node.as_table();
    TRIPOD_INPUT_CHECK(t, "{}: {} must be a table like {{name = \"hellaswag\", path = \"FILE\"}}, got {}", origin_,
                       where, type_of(node));
    EvalTaskConfig task;
    for (auto& [k, v] : *t) {
      const std::string ks(k.str());
      if (ks == "name") {
        TRIPOD_INPUT_CHECK(v.is_string(), "{}: {}.name must be a string (one of {}), got {}", origin_, where,
                           enum_choices<TaskKind>(), type_of(v));
        const std::string name = *v.value<std::string>();
        const std::optional<TaskKind> kind = parse_enum<TaskKind>(name);
        TRIPOD_INPUT_CHECK(kind, "{}: {}.name = \"{}\" is not a task (valid: {})", origin_, where, name,
                           enum_choices<TaskKind>());
        task.name = *kind;
      } else if (ks == "path" || ks == "tag") {
        TRIPOD_INPUT_CHECK(v.is_string(), "{}: {}.{} must be a string, got {}", origin_, where, ks, type_of(v));
        (ks == "path" ? task.path : task.tag) = *v.value<std::string>();
      } else if (ks == "limit") {
        TRIPOD_INPUT_CHECK(v.is_integer() && *v.value<int64_t>() >= 0,
                           "{}: {}.limit must be an integer >= 0 (examples to evaluate; 0: all), got {}", origin_,
                           where, v.is_integer() ? std::to_string(*v.value<int64_t>()) : type_of(v));
        task.limit = *v.value<int64_t>();
      } else {
        throw InputError(fmt::format("{}: unknown key {}.{} (valid keys of a task: name, path, limit, tag)", origin_,
                                     where, ks));
      }
    }
    TRIPOD_INPUT_CHECK(t->contains("name"), "{}: {} has no name (valid: {})", origin_, where, enum_choices<TaskKind>());
    TRIPOD_INPUT_CHECK(t->contains("path"), "{}: {} has no path: name the task's file", origin_, where);
    return task;
  }

  static std::string type_of(const toml::node& n) {
    switch (n.type()) {
      case toml::node_type::string: return "a string";
      case toml::node_type::integer: return "an integer";
      case toml::node_type::floating_point: return "a float";
      case toml::node_type::boolean: return "a boolean";
      case toml::node_type::array: return "a list";
      case toml::node_type::table: return "a table";
      default: return "a date/time";
    }
  }
  std::string name_, origin_;
  const toml::table* table_ = nullptr;
  std::set<std::string> seen_;
};

// Each section's keys, listed once: parsing reads them and the resolved config writes them.
using FieldRef = std::variant<int*, int64_t*, uint64_t*, double*, bool*, std::string*, std::vector<std::string>*,
                              std::vector<double>*, std::vector<int>*, std::vector<EvalTaskConfig>*, EnumRef,
                              LayerSplitRef, MoeLayersRef, EodTokenRef>;
struct Field {
  const char* key;
  FieldRef ref;
};

std::vector<Field> fields(ModelConfig& m) {
  return {{"arch", EnumRef(&m.arch)},
          {"n_layers", &m.n_layers},
          {"n_heads", &m.n_heads},
          {"n_kv_heads", &m.n_kv_heads},
          {"d_model", &m.d_model},
          {"ffn_hidden", &m.ffn_hidden},
          {"seq_len", &m.seq_len},
          {"max_positions", &m.max_positions},
          {"vocab_size", &m.vocab_size},
          {"norm", EnumRef(&m.norm)},
          {"norm_eps", &m.norm_eps},
          {"position", EnumRef(&m.position)},
          {"rope_theta", &m.rope_theta},
          {"mlp", EnumRef(&m.mlp)},
          {"bias", &m.bias},
          {"tie_embeddings", &m.tie_embeddings},
          {"qk_norm", &m.qk_norm}};
}
std::vector<Field> fields(MoeConfig& m) {
  return {{"experts", &m.experts},
          {"top_k", &m.top_k},
          {"ffn_hidden", &m.ffn_hidden},
          {"shared_experts", &m.shared_experts},
          {"router", EnumRef(&m.router)},
          {"normalize_top_k", &m.normalize_top_k},
          {"layers", MoeLayersRef{&m.first_dense}},
          {"aux_loss_coeff", &m.aux_loss_coeff},
          {"z_loss_coeff", &m.z_loss_coeff},
          {"bias_update_rate", &m.bias_update_rate},
          {"capacity_factor", &m.capacity_factor}};
}
std::vector<Field> fields(ParallelConfig& p) {
  return {{"tp", &p.tp},
          {"pp", &p.pp},
          {"dp", &p.dp},
          {"vp", &p.vp},
          {"cp", &p.cp},
          {"cp_comm", EnumRef(&p.cp_comm)},
          {"ep", &p.ep},
          {"moe_dispatcher", EnumRef(&p.moe_dispatcher)},
          {"schedule", EnumRef(&p.schedule)},
          {"schedule_file", &p.schedule_file},
          {"placement", EnumRef(&p.placement)},
          {"layers_per_stage", LayerSplitRef{&p.layers_per_stage, &p.balance_layers}},
          {"hardware", &p.hardware},
          {"sequence_parallel", &p.sequence_parallel},
          {"distributed_optimizer", &p.distributed_optimizer},
          {"bucket_mb", &p.bucket_mb},
          {"timeout_s", &p.timeout_s},
          {"flight_recorder_size", &p.flight_recorder_size}};
}
std::vector<Field> fields(TrainConfig& t) {
  return {{"device", EnumRef(&t.device)},
          {"seed", &t.seed},
          {"micro_batch_size", &t.micro_batch_size},
          {"global_batch_size", &t.global_batch_size},
          {"steps", &t.steps},
          {"lr", &t.lr},
          {"min_lr", &t.min_lr},
          {"warmup_steps", &t.warmup_steps},
          {"decay", EnumRef(&t.decay)},
          {"weight_decay", &t.weight_decay},
          {"beta1", &t.beta1},
          {"beta2", &t.beta2},
          {"eps", &t.eps},
          {"grad_clip", &t.grad_clip},
          {"log_interval", &t.log_interval},
          {"eval_interval", &t.eval_interval},
          {"eval_steps", &t.eval_steps},
          {"output_dir", &t.output_dir},
          {"exit_interval", &t.exit_interval},
          {"max_bad_steps", &t.max_bad_steps},
          {"trace", &t.trace},
          {"tensorboard_dir", &t.tensorboard_dir},
          {"straggler_factor", &t.straggler_factor},
          {"precision", EnumRef(&t.precision)},
          {"fp8_recipe", EnumRef(&t.fp8_recipe)},
          {"fp8_amax_history", &t.fp8_amax_history},
          {"fp8_margin", &t.fp8_margin},
          {"fp8_bf16_layers", &t.fp8_bf16_layers},
          {"profile_steps", &t.profile_steps}};
}
std::vector<Field> fields(RecomputeConfig& r) { return {{"mode", EnumRef(&r.mode)}, {"num_layers", &r.num_layers}}; }
std::vector<Field> fields(DataConfig& d) {
  return {{"prefixes", &d.prefixes}, {"weights", &d.weights}, {"split", &d.split}, {"tokenizer", &d.tokenizer},
          {"tokenizer_pattern", &d.tokenizer_pattern}, {"eod_token", EodTokenRef{&d.eod_token, &d.eod_token_id}},
          {"synthetic", &d.synthetic}, {"reset_position_ids", &d.reset_position_ids},
          {"reset_attention_mask", &d.reset_attention_mask}, {"eod_mask_loss", &d.eod_mask_loss}};
}
std::vector<Field> fields(CheckpointConfig& k) {
  return {{"dir", &k.dir},   {"interval", &k.interval}, {"keep", &k.keep},
          {"load", &k.load}, {"async", &k.async},       {"overwrite", &k.overwrite}};
}

std::vector<Field> fields(EvalConfig& e) { return {{"tasks", &e.tasks}}; }

void read_fields(Section& s, const std::vector<Field>& fs) {
  for (Field f : fs)
    std::visit(
        [&](auto& ref) {
          if constexpr (std::is_same_v<std::decay_t<decltype(ref)>, EnumRef> ||
                        std::is_same_v<std::decay_t<decltype(ref)>, LayerSplitRef> ||
                        std::is_same_v<std::decay_t<decltype(ref)>, MoeLayersRef> ||
                        std::is_same_v<std::decay_t<decltype(ref)>, EodTokenRef>)
            s.get(f.key, ref);
          else
            s.get(f.key, *ref);
        },
        f.ref);
}

toml::table write_fields(const std::vector<Field>& fs) {
  toml::table t;
  for (const Field& f : fs)
    std::visit(
        [&](const auto& ref) {
          using R = std::decay_t<decltype(ref)>;
          if constexpr (std::is_same_v<R, EnumRef>) {
            t.insert(f.key, std::string(ref.name(ref.ptr)));
          } else if constexpr (std::is_same_v<R, LayerSplitRef>) {  // resolved counts, or "auto" before
            if (*ref.balanced && ref.counts->empty()) {
              t.insert(f.key, "auto");
            } else {
              toml::array a;
              for (int e : *ref.counts) a.push_back(e);
              t.insert(f.key, std::move(a));
            }
          } else if constexpr (std::is_same_v<R, std::vector<EvalTaskConfig>*>) {
            toml::array a;
            for (const EvalTaskConfig& task : *ref) {
              toml::table e{{"name", std::string(enum_name(task.name))}, {"path", task.path}, {"limit", task.limit}};
              if (!task.tag.empty()) e.insert("tag", task.tag);
              a.push_back(std::move(e));
            }
            t.insert(f.key, std::move(a));
          } else if constexpr (std::is_same_v<R, MoeLayersRef>) {
            if (*ref.first_dense == 0)
              t.insert(f.key, "all");
            else
              t.insert(f.key, toml::table{{"first_dense", *ref.first_dense}});
          } else if constexpr (std::is_same_v<R, EodTokenRef>) {  // the id when given (or resolved), else the piece
            if (*ref.id >= 0)
              t.insert(f.key, *ref.id);
            else
              t.insert(f.key, *ref.piece);
          } else if constexpr (std::is_same_v<R, uint64_t*>) {
            t.insert(f.key, static_cast<int64_t>(*ref));
          } else if constexpr (std::is_same_v<R, std::vector<std::string>*> || std::is_same_v<R, std::vector<double>*> ||
                               std::is_same_v<R, std::vector<int>*>) {
            toml::array a;
            for (const auto& e : *ref) a.push_back(e);
            t.insert(f.key, std::move(a));
          } else {
            t.insert(f.key, *ref);
          }
        },
        f.ref);
  return t;
}

// Reads one [section] of `root` into `out` (its field list), refusing keys it does not have.
template <class S> void read_section(const toml::table& root, const char* name, const std::string& origin, S& out) {
  Section s(root, name, origin);
  read_fields(s, fields(out));
  s.finish();
}

void apply_override(toml::table& root, const std::string& assignment) {
  auto eq = assignment.find('=');
  auto dot = assignment.find('.');
  TRIPOD_INPUT_CHECK(eq != std::string::npos && dot != std::string::npos && dot < eq,
                     "--set '{}' must look like section.key=value", assignment);
  std::string section = assignment.substr(0, dot), key = assignment.substr(dot + 1, eq - dot - 1);
  std::string value = assignment.substr(eq + 1);
  toml::node_view<toml::node> existing = root[section];
  if (!existing) root.insert(section, toml::table{});
  toml::table* sec = root[section].as_table();
  TRIPOD_INPUT_CHECK(sec, "--set {}: '{}' is not a section", assignment, section);
  // A value in TOML syntax (numbers, booleans, quoted strings, lists); anything else is a string.
  try {
    toml::table parsed = toml::parse("v = " + value);
    sec->insert_or_assign(key, *parsed.get("v"));
  } catch (const toml::parse_error&) {
    sec->insert_or_assign(key, value);
  }
}

}  // namespace

namespace {

void require(bool ok, const std::string& origin, const char* key, const std::string& what) {
  if (!ok) throw InputError(fmt::format("{}: {} {}", origin, key, what));
}

}  // namespace

void ParallelConfig::validate(const std::string& origin) const {
  require(tp >= 1, origin, "parallel.tp", fmt::format("must be >= 1, got {}", tp));
  require(pp >= 1, origin, "parallel.pp", fmt::format("must be >= 1, got {}", pp));
  require(dp >= 0, origin, "parallel.dp", fmt::format("must be >= 1 (or absent to derive it), got {}", dp));
  require(vp >= 1, origin, "parallel.vp", fmt::format("must be >= 1, got {}", vp));
  require(cp >= 1 && cp <= 4096, origin, "parallel.cp", fmt::format("must be in [1, 4096], got {}", cp));
  require(ep >= 1 && ep <= 65536, origin, "parallel.ep", fmt::format("must be in [1, 65536], got {}", ep));
  require(bucket_mb > 0 && bucket_mb <= 1e6, origin, "parallel.bucket_mb",
          fmt::format("must be in (0, 1e6] (MB), got {}", bucket_mb));
  require(timeout_s > 0 && timeout_s <= 1e8, origin, "parallel.timeout_s",
          fmt::format("must be in (0, 1e8] (seconds), got {}", timeout_s));
  require(flight_recorder_size >= 0 && flight_recorder_size <= 10000000, origin, "parallel.flight_recorder_size",
          fmt::format("must be in [0, 10000000] (operations; 0 turns the flight recorder off), got {}",
                      flight_recorder_size));
}

void TrainConfig::validate(const std::string& origin, bool training) const {
  require(micro_batch_size >= 1, origin, "train.micro_batch_size", fmt::format("must be >= 1, got {}", micro_batch_size));
  require(global_batch_size >= 0, origin, "train.global_batch_size",
          fmt::format("must be >= 1 (or absent for micro_batch_size * dp), got {}", global_batch_size));
  require(steps >= (training ? 1 : 0), origin, "train.steps", fmt::format("must be >= 1, got {}", steps));
  require(lr > 0, origin, "train.lr", fmt::format("must be > 0, got {}", lr));
  require(min_lr >= 0 && min_lr <= lr, origin, "train.min_lr",
          fmt::format("must be in [0, train.lr = {}], got {}", lr, min_lr));
  require(warmup_steps >= 0, origin, "train.warmup_steps", fmt::format("must be >= 0, got {}", warmup_steps));
  require(weight_decay >= 0, origin, "train.weight_decay", fmt::format("must be >= 0, got {}", weight_decay));
  require(beta1 >= 0 && beta1 < 1, origin, "train.beta1", fmt::format("must be in [0, 1), got {}", beta1));
  require(beta2 >= 0 && beta2 < 1, origin, "train.beta2", fmt::format("must be in [0, 1), got {}", beta2));
  require(eps > 0, origin, "train.eps", fmt::format("must be > 0, got {}", eps));
  require(grad_clip >= 0, origin, "train.grad_clip", fmt::format("must be >= 0 (0 turns clipping off), got {}", grad_clip));
  require(log_interval >= 1, origin, "train.log_interval", fmt::format("must be >= 1, got {}", log_interval));
  require(eval_interval >= 0, origin, "train.eval_interval", fmt::format("must be >= 0, got {}", eval_interval));
  require(eval_steps >= 1, origin, "train.eval_steps", fmt::format("must be >= 1, got {}", eval_steps));
  require(!output_dir.empty(), origin, "train.output_dir", "must not be empty");
  require(exit_interval >= 0, origin, "train.exit_interval", fmt::format("must be >= 0, got {}", exit_interval));
  require(max_bad_steps >= 1, origin, "train.max_bad_steps", fmt::format("must be >= 1, got {}", max_bad_steps));
  require(straggler_factor == 0 || straggler_factor > 1, origin, "train.straggler_factor",
          fmt::format("must be > 1 (or 0 for no straggler detection), got {}", straggler_factor));
  require(fp8_amax_history >= 1 && fp8_amax_history <= 1000000, origin, "train.fp8_amax_history",
          fmt::format("must be in [1, 1000000] (steps of amax history of the delayed recipe), got {}",
                      fp8_amax_history));
  require(fp8_margin >= 0 && fp8_margin <= 64, origin, "train.fp8_margin",
          fmt::format("must be in [0, 64] (FP8 scales are divided by 2^margin), got {}", fp8_margin));
  require(fp8_bf16_layers >= 0, origin, "train.fp8_bf16_layers",
          fmt::format("must be >= 0 (the first and last layers kept in bf16), got {}", fp8_bf16_layers));
  require(profile_steps >= 0 && profile_steps <= 1000, origin, "train.profile_steps",
          fmt::format("must be in [0, 1000] (steps timed for tripod plan --check; 0: none), got {}", profile_steps));
}

void DataConfig::validate(const std::string& origin, bool reads_data) const {
  require(!reads_data || !prefixes.empty() || synthetic, origin, "data.prefixes",
          "is missing: name the indexed datasets to train on (or set data.synthetic = true for synthetic tokens)");
  require(weights.empty() || weights.size() == prefixes.size(), origin, "data.weights",
          fmt::format("has {} entries for {} data.prefixes; give one weight per prefix", weights.size(),
                      prefixes.size()));
  for (double w : weights) require(w > 0, origin, "data.weights", fmt::format("must all be > 0, got {}", w));
  if (documents() && synthetic) {
    const char* key = reset_attention_mask ? "data.reset_attention_mask"
                      : reset_position_ids ? "data.reset_position_ids"
                                           : "data.eod_mask_loss";
    require(false, origin, key,
            "needs documents that end with data.eod_token, and data.synthetic = true has none: train on indexed "
            "datasets (data.prefixes) or turn data.reset_position_ids, data.reset_attention_mask and "
            "data.eod_mask_loss off");
  }
}

void EvalConfig::validate(const std::string& origin) const {
  std::set<std::string> labels;
  for (size_t i = 0; i < tasks.size(); ++i) {
    const EvalTaskConfig& t = tasks[i];
    const std::string where = fmt::format("eval.tasks[{}]", i);
    require(!t.path.empty(), origin, where.c_str(), "has an empty path: name the task's file");
    const std::string label = t.label();
    const bool plain = std::all_of(label.begin(), label.end(), [](char c) {
      return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.';
    });
    require(plain, origin, (where + ".tag").c_str(),
            fmt::format("= \"{}\" must be letters, digits, '_', '-' or '.' (it names the task's figures)", label));
    require(labels.insert(label).second, origin, (where + ".tag").c_str(),
            fmt::format("= \"{}\" names another task too: give each task its own tag", label));
  }
}

void CheckpointConfig::validate(const std::string& origin) const {
  require(interval >= 0, origin, "checkpoint.interval", fmt::format("must be >= 0, got {}", interval));
  require(keep >= 0, origin, "checkpoint.keep", fmt::format("must be >= 0 (0 keeps all), got {}", keep));
  require(interval == 0 || !dir.empty(), origin, "checkpoint.dir", "must be set when checkpoint.interval > 0");
}

Config parse_config(const std::string& text, const std::string& origin, const std::vector<std::string>& overrides,
                    ConfigUse use) {
  toml::table root;
  try {
    root = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    throw InputError(fmt::format("{}:{}:{}: TOML syntax error: {}", origin, e.source().begin.line,
                                 e.source().begin.column, e.description()));
  }
  for (const auto& o : overrides) apply_override(root, o);

  static const std::set<std::string> kSections = {"model",     "moe",  "parallel",   "train",
                                                  "recompute", "data", "checkpoint", "eval"};
  for (auto& [k, v] : root)
    TRIPOD_INPUT_CHECK(kSections.count(std::string(k.str())), "{}: unknown section [{}] (valid: {})", origin,
                       k.str(), fmt::join(kSections, ", "));

  Config c;
  {
    // The architecture preset first: it sets the keys that the ones given then override.
    Section s(root, "model", origin);
    EnumRef arch(&c.model.arch);
    s.get("arch", arch);
    c.model.apply_arch_preset();
  }
  read_section(root, "model", origin, c.model);
  read_section(root, "moe", origin, c.model.moe);
  read_section(root, "parallel", origin, c.parallel);
  read_section(root, "train", origin, c.train);
  read_section(root, "recompute", origin, c.recompute);
  read_section(root, "data", origin, c.data);
  read_section(root, "checkpoint", origin, c.checkpoint);
  read_section(root, "eval", origin, c.eval);

  c.model.validate(origin);
  ModelConfig& m = c.model;  // resolved: the config records what runs
  m.ffn_hidden = m.ffn();
  m.n_kv_heads = m.kv_heads();
  m.max_positions = m.positions();
  if (m.moe.enabled()) m.moe.ffn_hidden = m.expert_ffn();
  c.parallel.validate(origin);
  c.train.validate(origin, use.training);
  c.recompute.validate(origin);
  c.data.validate(origin, use.data);
  require(c.data.eod_token_id < c.model.vocab_size, origin, "data.eod_token",
          fmt::format("= {} is not a token of the vocabulary (model.vocab_size = {}: ids 0 to {})", c.data.eod_token_id,
                      c.model.vocab_size, c.model.vocab_size - 1));
  c.checkpoint.validate(origin);
  if (c.train.fp8()) {
    // cuBLASLt's FP8 GEMMs take dimensions that are multiples of 16 (model/fp8.h); the CPU's
    // emulation refuses what the GPU would, so a config that trains here trains there.
    require(m.d_model % 16 == 0, origin, "model.d_model",
            fmt::format("= {} must be a multiple of 16 with train.precision = \"fp8\" (FP8 GEMM dimensions "
                        "are multiples of 16)", m.d_model));
    require(m.ffn() % 16 == 0 || !c.train.fp8_config().any_fp8_mlp(m), origin, "model.ffn_hidden",
            fmt::format("= {} must be a multiple of 16 with train.precision = \"fp8\" (FP8 GEMM dimensions "
                        "are multiples of 16)", m.ffn()));
    require(2 * c.train.fp8_bf16_layers < m.n_layers, origin, "train.fp8_bf16_layers",
            fmt::format("= {} keeps the first and last {} of model.n_layers = {} layers in bf16, which leaves none "
                        "in fp8: give at most {}", c.train.fp8_bf16_layers, c.train.fp8_bf16_layers, m.n_layers,
                        (m.n_layers - 1) / 2));
  }
  c.eval.validate(origin);
  return c;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides, ConfigUse use) {
  std::error_code ec;
  TRIPOD_INPUT_CHECK(!std::filesystem::is_directory(path, ec), "config file {} is a directory; give a TOML file", path);
  std::ifstream in(path);
  TRIPOD_INPUT_CHECK(in, "config file {} cannot be read (missing or not readable)", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_config(ss.str(), path, overrides, use);
}

void validate_layout(Config& cfg, int world_size) {
  ParallelConfig& p = cfg.parallel;
  const ModelConfig& m = cfg.model;
  const int mp = p.tp * p.pp * p.cp;
  if (p.dp == 0) {
    if (p.cp > 1)
      TRIPOD_INPUT_CHECK(world_size % mp == 0,
                         "the world size {} is not a multiple of parallel.tp * parallel.pp * parallel.cp = {} * {} * {} "
                         "= {}", world_size, p.tp, p.pp, p.cp, mp);
    else
      TRIPOD_INPUT_CHECK(world_size % mp == 0,
                         "the world size {} is not a multiple of parallel.tp * parallel.pp = {} * {} = {}", world_size,
                         p.tp, p.pp, mp);
    p.dp = world_size / mp;
  }
  if (p.cp > 1)
    TRIPOD_INPUT_CHECK(mp * p.dp == world_size,
                       "parallel.tp * parallel.pp * parallel.cp * parallel.dp = {} * {} * {} * {} = {} but the world "
                       "size is {} ranks", p.tp, p.pp, p.cp, p.dp, mp * p.dp, world_size);
  else
    TRIPOD_INPUT_CHECK(p.tp * p.pp * p.dp == world_size,
                       "parallel.tp * parallel.pp * parallel.dp = {} * {} * {} = {} but the world size is {} ranks",
                       p.tp, p.pp, p.dp, p.tp * p.pp * p.dp, world_size);
  // Context parallelism: every sequence in 2 * cp chunks, rank i of a CP group holding chunks i
  // and 2cp-1-i (equal causal attention work on every rank).
  if (p.cp > 1)
    TRIPOD_INPUT_CHECK(m.seq_len % (2 * p.cp) == 0,
                       "model.seq_len = {} is not divisible by 2 * parallel.cp = {}: context parallelism splits every "
                       "sequence into 2 * cp equal chunks (use a seq_len that is a multiple of {}, or another cp)",
                       m.seq_len, 2 * p.cp, 2 * p.cp);
  TRIPOD_INPUT_CHECK(m.n_heads % p.tp == 0, "parallel.tp = {} must divide model.n_heads = {}", p.tp, m.n_heads);
  TRIPOD_INPUT_CHECK(m.kv_heads() % p.tp == 0,
                     "parallel.tp = {} must divide model.n_kv_heads = {} (each TP rank holds whole key/value heads)",
                     p.tp, m.kv_heads());
  TRIPOD_INPUT_CHECK(m.ffn() % p.tp == 0, "parallel.tp = {} must divide the MLP width (model.ffn_hidden) = {}", p.tp,
                     m.ffn());
  if (m.moe.enabled())  // experts are column- and row-parallel like the dense MLP
    TRIPOD_INPUT_CHECK(m.expert_ffn() % p.tp == 0,
                       "parallel.tp = {} must divide an expert's width (moe.ffn_hidden) = {}: every TP rank holds a "
                       "slice of every expert", p.tp, m.expert_ffn());
  // Expert parallelism: ep ranks of each DP x CP group split the routed experts.
  if (p.ep > 1) {
    TRIPOD_INPUT_CHECK(m.moe.enabled(), "parallel.ep = {} splits the routed experts of a mixture of experts, and this "
                       "model has none ([moe] experts = 0): use parallel.ep = 1", p.ep);
    TRIPOD_INPUT_CHECK(m.moe.experts % p.ep == 0,
                       "parallel.ep = {} must divide moe.experts = {}: every EP rank holds the same number of experts "
                       "(valid: a divisor of {} that divides parallel.dp * parallel.cp = {})", p.ep, m.moe.experts,
                       m.moe.experts, p.dp * p.cp);
    TRIPOD_INPUT_CHECK((p.dp * p.cp) % p.ep == 0,
                       "parallel.ep = {} must divide parallel.dp * parallel.cp = {} * {} = {}: expert-parallel ranks "
                       "are taken from the data- and context-parallel ones, so the world size does not change (valid: "
                       "a divisor of {} that divides moe.experts = {})", p.ep, p.dp, p.cp, p.dp * p.cp, p.dp * p.cp,
                       m.moe.experts);
  }
  TrainConfig& t = cfg.train;
  if (t.global_batch_size == 0) t.global_batch_size = t.micro_batch_size * p.dp;
  TRIPOD_INPUT_CHECK(t.global_batch_size % (t.micro_batch_size * p.dp) == 0,
                     "train.global_batch_size = {} is not a multiple of train.micro_batch_size * parallel.dp = {} * {} "
                     "= {}",
                     t.global_batch_size, t.micro_batch_size, p.dp, t.micro_batch_size * p.dp);
  if (p.sequence_parallel && p.tp > 1)
    TRIPOD_INPUT_CHECK(
        (static_cast<int64_t>(t.micro_batch_size) * m.seq_len / p.cp) % p.tp == 0,
        "parallel.sequence_parallel splits the micro_batch_size * seq_len / parallel.cp = {} tokens across tp = {} "
        "ranks; make it divisible",
        static_cast<int64_t>(t.micro_batch_size) * m.seq_len / p.cp, p.tp);
  TRIPOD_INPUT_CHECK(p.vp == 1 || p.pp > 1, "parallel.vp = {} needs parallel.pp > 1 (virtual stages interleave across "
                     "pipeline ranks)", p.vp);
  if (p.schedule_file.empty())  // a schedule file brings its own chunks and placement (make_schedule checks them)
    check_schedule_kind(p.schedule, p.pp, p.vp, t.global_batch_size / (t.micro_batch_size * p.dp), p.placement,
                        {.schedule = "parallel.schedule", .pp = "parallel.pp", .vp = "parallel.vp",
                         .placement = "parallel.placement",
                         .microbatches = "the micro-batches per rank, train.global_batch_size / "
                                         "(train.micro_batch_size * parallel.dp),"});
  if (p.balance_layers)  // balance_stages fills the counts in; every stage needs a layer
    TRIPOD_INPUT_CHECK(m.n_layers >= p.pp * p.vp,
                       "parallel.layers_per_stage = \"auto\": model.n_layers = {} is fewer than the pp*vp = {}*{} = {} "
                       "pipeline stages; every stage needs a layer",
                       m.n_layers, p.pp, p.vp, p.pp * p.vp);
  else
    layers_per_stage(m.n_layers, p.pp, p.vp, p.layers_per_stage);  // throws on impossible splits
  if (t.fp8()) {
    // Every FP8 GEMM dimension a multiple of 16 (cuBLASLt's rule): the TP shards' widths and the
    // tokens of a micro-batch, which the weight gradients' GEMMs sum over.
    const int64_t tokens = static_cast<int64_t>(t.micro_batch_size) * m.seq_len / p.cp;
    TRIPOD_INPUT_CHECK(tokens % 16 == 0,
                       "train.precision = \"fp8\": a micro-batch's train.micro_batch_size * model.seq_len{} = {} "
                       "tokens must be a multiple of 16 (FP8 GEMM dimensions are multiples of 16)",
                       p.cp > 1 ? " / parallel.cp" : "", tokens);
    const int64_t D = m.head_dim();
    std::vector<std::pair<const char*, int64_t>> widths = {
        {"the attention heads' width n_heads * head_dim", m.n_heads * D},
        {"the QKV width (n_heads + 2 n_kv_heads) * head_dim", (m.n_heads + 2 * m.kv_heads()) * D}};
    // The dense MLPs' width; a mixture-of-experts layer's experts stay in bf16.
    if (t.fp8_config().any_fp8_mlp(m)) widths.emplace_back("the MLP width model.ffn_hidden", m.ffn());
    for (const auto& [what, width] : widths)
      TRIPOD_INPUT_CHECK(width % (16 * p.tp) == 0,
                         "train.precision = \"fp8\": parallel.tp = {} splits {} = {} into {} per rank, which must "
                         "be a multiple of 16 (FP8 GEMM dimensions are multiples of 16)",
                         p.tp, what, width, static_cast<double>(width) / p.tp);
  }
}

namespace {

// The int, double, bool and enum fields of `fs` as JSON (what a checkpoint's "model" records).
nlohmann::json fields_to_json(const std::vector<Field>& fs) {
  nlohmann::json out = nlohmann::json::object();
  for (const Field& f : fs)
    std::visit(
        [&](const auto& ref) {
          using R = std::decay_t<decltype(ref)>;
          if constexpr (std::is_same_v<R, EnumRef>)
            out[f.key] = std::string(ref.name(ref.ptr));
          else if constexpr (std::is_same_v<R, int*> || std::is_same_v<R, double*> || std::is_same_v<R, bool*>)
            out[f.key] = *ref;
          else if constexpr (std::is_same_v<R, MoeLayersRef>)
            out["first_dense"] = *ref.first_dense;
        },
        f.ref);
  return out;
}

// The inverse: keys absent from `j` keep their values; `section` names them in errors.
void fields_from_json(const nlohmann::json& j, const std::vector<Field>& fs, const char* section,
                      const std::string& origin) {
  for (const Field& f : fs)
    std::visit(
        [&](const auto& ref) {
          using R = std::decay_t<decltype(ref)>;
          const char* key = std::is_same_v<R, MoeLayersRef> ? "first_dense" : f.key;
          if (!j.contains(key)) return;
          const nlohmann::json& v = j[key];
          if constexpr (std::is_same_v<R, EnumRef>) {
            TRIPOD_INPUT_CHECK(v.is_string() && ref.parse(ref.ptr, v.get<std::string>()),
                               "{}: {}.{} = {} is not one of {}", origin, section, key, v.dump(), ref.choices());
          } else if constexpr (std::is_same_v<R, int*> || std::is_same_v<R, double*> || std::is_same_v<R, bool*> ||
                               std::is_same_v<R, MoeLayersRef>) {
            using V = std::conditional_t<std::is_same_v<R, MoeLayersRef>, int*, R>;
            V target;
            if constexpr (std::is_same_v<R, MoeLayersRef>)
              target = ref.first_dense;
            else
              target = ref;
            try {
              *target = v.get<std::remove_pointer_t<V>>();
            } catch (const nlohmann::json::exception&) {
              throw InputError(fmt::format("{}: {}.{} = {} has the wrong type", origin, section, key, v.dump()));
            }
          }
        },
        f.ref);
}

}  // namespace

nlohmann::json model_to_json(const ModelConfig& model) {
  ModelConfig m = model;  // the field list takes mutable references
  m.ffn_hidden = m.ffn();  // resolved, also for configs not made by parse_config
  m.max_positions = m.positions();
  m.n_kv_heads = m.kv_heads();
  nlohmann::json out = fields_to_json(fields(m));
  // Keys added after the first checkpoints are recorded only where they change the model, so a
  // model without them records what it always did.
  if (!m.qk_norm) out.erase("qk_norm");
  if (m.moe.enabled()) {
    m.moe.ffn_hidden = m.expert_ffn();
    out["moe"] = fields_to_json(fields(m.moe));
  }
  return out;
}

ModelConfig model_from_json(const nlohmann::json& j, const std::string& origin) {
  ModelConfig m;
  fields_from_json(j, fields(m), "model", origin);
  if (j.contains("moe")) {
    TRIPOD_INPUT_CHECK(j["moe"].is_object(), "{}: model.moe = {} is not an object", origin, j["moe"].dump());
    fields_from_json(j["moe"], fields(m.moe), "moe", origin);
  }
  return m;
}

std::string config_to_toml(const Config& cfg) {
  Config c = cfg;  // the field lists take mutable references
  toml::table t{{"model", write_fields(fields(c.model))},
                {"parallel", write_fields(fields(c.parallel))},
                {"train", write_fields(fields(c.train))},
                {"recompute", write_fields(fields(c.recompute))},
                {"data", write_fields(fields(c.data))},
                {"checkpoint", write_fields(fields(c.checkpoint))}};
  // [moe] only for a mixture of experts: a dense model's file is what it always was.
  if (c.model.moe.enabled()) t.insert("moe", write_fields(fields(c.model.moe)));
  if (!c.eval.tasks.empty()) t.insert("eval", write_fields(fields(c.eval)));  // [eval] only with tasks
  // A library run without a run directory (output_dir "") records none, so that the text parses back.
  if (c.train.output_dir.empty()) t["train"].as_table()->erase("output_dir");
  std::stringstream ss;
  ss << t << "\n";
  return ss.str();
}

}  // namespace tripod
