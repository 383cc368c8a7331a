// Loading under any grid: targets from the registry and the optimizer's spans, filled by the reader.
#include "checkpoint/reshard.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <optional>

#include "checkpoint/reader.h"
#include "core/error.h"

namespace fs = std::filesystem;

namespace tripod {

PieceGeom saved_geometry(const ParamSpec& s) {
  PieceGeom g;
  g.global_shape = s.global_shape;
  g.shard_dim = s.shard_dim;
  g.box_offset = s.shard_dim >= 0 ? s.shard_offset : 0;
  g.box_size = s.shard_dim >= 0 ? s.shard_size : s.global_shape[0];
  if (s.vocab_rows >= 0) {
    TRIPOD_CHECK(g.box_dim() == 0, "vocabulary table {} must be split along dim 0", s.name);
    g.global_shape[0] = s.vocab_rows;
    g.box_size = std::clamp<int64_t>(s.vocab_rows - g.box_offset, 0, g.box_size);
    g.box_offset = std::min(g.box_offset, s.vocab_rows);
  }
  g.flat_begin = 0;
  g.flat_end = g.box_numel();
  return g;
}

std::string resolve_checkpoint(const std::string& load, const std::string& dir) {
  auto follow = [](const fs::path& root) {
    std::ifstream in(root / "latest");
    std::string name;
    std::getline(in, name);
    TRIPOD_INPUT_CHECK(parse_iter_dir_name(name) >= 0, "{} does not name a checkpoint directory (got '{}')",
                       (root / "latest").string(), name);
    fs::path p = root / name;
    TRIPOD_INPUT_CHECK(fs::exists(p / "metadata.json"), "{} names {}, which is missing or incomplete",
                       (root / "latest").string(), p.string());
    return p.string();
  };
  if (load == "latest") {
    TRIPOD_INPUT_CHECK(!dir.empty(), "checkpoint.load = \"latest\" needs checkpoint.dir (the directory to look in)");
    TRIPOD_INPUT_CHECK(fs::exists(fs::path(dir) / "latest"),
                       "checkpoint.load = \"latest\": there is no checkpoint in {} (no 'latest' file)", dir);
    return follow(dir);
  }
  if (fs::path(load).filename() == "latest" && fs::is_regular_file(load)) return follow(fs::path(load).parent_path());
  TRIPOD_INPUT_CHECK(fs::is_directory(load), "checkpoint {} does not exist or is not a directory", load);
  if (fs::exists(fs::path(load) / "metadata.json")) return load;
  if (fs::exists(fs::path(load) / "latest")) return follow(load);
  throw InputError(fmt::format("{} is not a checkpoint: it has no metadata.json (an unfinished save?) and no "
                               "'latest' file", load));
}

namespace {

// One buffer to fill and where it goes once everything is read.
struct Staged {
  Param* param = nullptr;
  StateKind src_kind = StateKind::Value;  // the stored state it is read from
  Tensor* dst = nullptr;                  // the values (param->value) or an optimizer tensor
  int64_t dst_offset = 0;                 // flat element offset in *dst
  PieceGeom geom;
  HostFloats buf;  // (dst numel): geom's elements first, padding (zero) after
  const float* view = nullptr;  // when set: geom's checked elements in the reader's file mapping
                                // (buf's first geom.numel() are then unused and never touched)
};

// Every tensor of this rank must be in the checkpoint with the same (saved) global shape.
void check_tensors(CheckpointReader& r, ParamRegistry& reg) {
  for (const Param* pp : reg.tensors()) {
    const Param& p = *pp;
    PieceGeom g = saved_geometry(p.spec);
    auto it = r.tensors().find(p.spec.name);
    TRIPOD_INPUT_CHECK(it != r.tensors().end(),
                       "checkpoint {} has no tensor {} (the model has it, shape {}): a checkpoint of another model "
                       "shape?", r.dir(), p.spec.name, shape_str(g.global_shape));
    TRIPOD_INPUT_CHECK(it->second == g.global_shape,
                       "checkpoint {}: tensor {} is {} there but {} in this model (another model shape?)", r.dir(),
                       p.spec.name, shape_str(it->second), shape_str(g.global_shape));
  }
}

// Tensors are assembled in the order their first piece lies in the files, so that a cold read
// streams through each file instead of seeking between its value, m and v sections.
void fill(CheckpointReader& r, std::vector<Staged>& staged) {
  using Key = std::pair<std::string, StateKind>;
  std::map<Key, std::vector<CheckpointReader::Target>> groups;
  for (Staged& s : staged) groups[{s.param->spec.name, s.src_kind}].push_back({s.geom, s.buf.data(), &s.view});
  std::map<Key, std::pair<std::string, int64_t>> first;  // (file, offset) of the key's first piece
  for (const StoredPiece& p : r.index()) {
    auto it = first.try_emplace({p.spec.name, p.spec.kind}, p.file, p.offset).first;
    it->second = std::min(it->second, std::pair{p.file, p.offset});
  }
  std::vector<std::pair<std::pair<std::string, int64_t>, Key>> order;
  for (auto& [key, targets] : groups) order.emplace_back(first[key], key);
  std::sort(order.begin(), order.end());
  for (auto& [at, key] : order) r.assemble(key.first, key.second, groups[key]);
}

// n floats from src into dst's flat elements [offset, offset + n). Host f32 destinations are
// plain memory: large ones are copied in two halves on two threads (one core's memcpy falls well
// short of the memory bandwidth); others go through ops.copy.
void copy_in(Ops& ops, const float* src, Tensor& dst, int64_t offset, int64_t n) {
  Tensor d = dst.flat(offset, offset + n);
  if (d.device() == Device::CPU && d.dtype() == DType::F32 && n >= (1 << 20)) {
    float* out = d.data<float>();
    const int64_t half = n / 2;
    auto second = std::async(std::launch::async, [&] { std::memcpy(out + half, src + half, (n - half) * sizeof(float)); });
    std::memcpy(out, src, half * sizeof(float));
    second.get();
  } else {
    Tensor s = Tensor::wrap(const_cast<float*>(src), {n}, DType::F32);
    ops.copy(s, d);
  }
}

void apply(Ops& ops, std::vector<Staged>& staged) {
  for (Staged& s : staged) {
    const int64_t n = static_cast<int64_t>(s.buf.size()), viewed = s.view ? s.geom.numel() : 0;
    if (viewed > 0) copy_in(ops, s.view, *s.dst, s.dst_offset, viewed);
    if (n > viewed) copy_in(ops, s.buf.data() + viewed, *s.dst, s.dst_offset + viewed, n - viewed);
  }
  ops.synchronize();
}

std::vector<Staged> value_targets(CheckpointReader& r, ParamRegistry& reg) {
  const StateKind src = r.has_kind(StateKind::Master) ? StateKind::Master : StateKind::Value;
  std::vector<Staged> out;
  for (Param* pp : reg.tensors()) {  // a buffer's values are its own tensor, not in the flat values
    Param& p = *pp;
    Staged s{.param = &p, .src_kind = p.spec.buffer ? StateKind::Value : src,  // buffers have no master
             .dst = p.spec.buffer ? &p.value : &reg.flat_values(),
             .dst_offset = p.spec.buffer ? 0 : p.offset, .geom = saved_geometry(p.spec), .buf = {}};
    s.buf.resize(p.numel());
    std::fill(s.buf.begin() + s.geom.numel(), s.buf.end(), 0.f);  // vocabulary padding
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace

int64_t load_param_values(const std::string& ckpt_dir, ParamRegistry& reg, Ops& ops) {
  CheckpointReader r(ckpt_dir);
  check_tensors(r, reg);
  std::vector<Staged> staged = value_targets(r, reg);
  fill(r, staged);
  apply(ops, staged);
  return r.iteration();
}

LoadResult load_checkpoint(const std::string& ckpt_dir, ParamRegistry& reg, Ops& ops,
                           const std::vector<OptimizerShardRef>& opt, Communicator& world) {
  LoadResult res;
  std::string error;
  std::vector<Staged> staged;
  std::vector<std::string> ckpt_names;
  std::vector<float> present;  // per checkpoint tensor: this rank's model has it
  std::optional<CheckpointReader> reader;  // outlives apply(): staged views point into its file mappings
  try {
    CheckpointReader& r = reader.emplace(ckpt_dir);
    res.metadata = r.metadata();
    check_tensors(r, reg);
    for (const auto& [name, shape] : r.tensors()) {
      ckpt_names.push_back(name);
      present.push_back(reg.find(name) ? 1.f : 0.f);
    }
    staged = value_targets(r, reg);
    res.optimizer_loaded = r.has_kind(StateKind::M);
    if (res.optimizer_loaded) {
      const bool has_master = r.has_kind(StateKind::Master);
      for (const OptimizerShardRef& sh : opt)
        for (Param& p : reg.params()) {
          const int64_t b = std::max(sh.span.begin, p.offset), e = std::min(sh.span.end, p.offset + p.numel());
          if (b >= e) continue;
          PieceGeom g = saved_geometry(p.spec);
          g.flat_begin = std::min(b - p.offset, g.box_numel());
          g.flat_end = std::min(e - p.offset, g.box_numel());
          for (auto [kind, t] : {std::pair{StateKind::Master, &sh.master}, std::pair{StateKind::M, &sh.m},
                                 std::pair{StateKind::V, &sh.v}}) {
            if (!t->defined()) continue;
            StateKind src = kind == StateKind::Master && !has_master ? StateKind::Value : kind;
            Staged s{.param = &p, .src_kind = src, .dst = const_cast<Tensor*>(t), .dst_offset = b - sh.span.begin,
                     .geom = g, .buf = {}};
            s.buf.resize(e - b);
            std::fill(s.buf.begin() + g.numel(), s.buf.end(), 0.f);
            staged.push_back(std::move(s));
          }
        }
    } else {
      // No moments saved; separate masters (if any) still start from the loaded values.
      for (const OptimizerShardRef& sh : opt)
        for (Param& p : reg.params()) {
          const int64_t b = std::max(sh.span.begin, p.offset), e = std::min(sh.span.end, p.offset + p.numel());
          if (b >= e || !sh.master.defined()) continue;
          PieceGeom g = saved_geometry(p.spec);
          g.flat_begin = std::min(b - p.offset, g.box_numel());
          g.flat_end = std::min(e - p.offset, g.box_numel());
          Staged s{.param = &p, .src_kind = r.has_kind(StateKind::Master) ? StateKind::Master : StateKind::Value,
                   .dst = const_cast<Tensor*>(&sh.master), .dst_offset = b - sh.span.begin, .geom = g, .buf = {}};
          s.buf.resize(e - b);
          std::fill(s.buf.begin() + g.numel(), s.buf.end(), 0.f);
          staged.push_back(std::move(s));
        }
    }
    fill(r, staged);
  } catch (const InputError& e) {
    error = e.what();
  }
  throw_if_any_failed(error, world);  // nothing has been changed anywhere yet
  // Every checkpoint tensor must belong to some rank's model (all ranks read the same list).
  if (!present.empty()) {
    Tensor pr = Tensor::wrap(present.data(), {static_cast<int64_t>(present.size())}, DType::F32);
    world.all_reduce(pr, ReduceOp::Max);
    for (size_t i = 0; i < present.size(); ++i)
      if (present[i] == 0.f)
        throw InputError(fmt::format("checkpoint {} has tensor {}, which this model does not have (a checkpoint "
                                     "of another model shape?)", ckpt_dir, ckpt_names[i]));
  }
  apply(ops, staged);
  if (!res.optimizer_loaded && world.rank() == 0)
    spdlog::info("checkpoint {} holds parameters only: the optimizer state starts fresh", ckpt_dir);
  return res;
}

}  // namespace tripod
