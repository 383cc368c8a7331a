// Snapshots, the file writer and the atomic commit.
#include "checkpoint/writer.h"

#include <spdlog/spdlog.h>

#include <fcntl.h>
#include <stdio.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "checkpoint/crc32c.h"
#include "checkpoint/hdf5_file.h"
#include "checkpoint/metadata.h"
#include "checkpoint/reader.h"
#include "checkpoint/reshard.h"
#include "core/error.h"
#include "core/version.h"

namespace fs = std::filesystem;

namespace tripod {

int64_t Snapshot::bytes() const {
  int64_t n = 0;
  for (const auto& d : data) n += static_cast<int64_t>(d.size()) * 4;
  return n;
}

std::string shard_file_name(const Coords& c) { return fmt::format("pp{:02d}_tp{:02d}_dp{:02d}.h5", c.pp, c.tp, c.dp); }

Coords checkpoint_coords(const RankGrid& grid, const Coords& c) {
  Coords out = c;
  out.dp = grid.dpcp_rank(c);
  out.cp = 0;
  return out;
}

bool rank_writes_file(const Coords& c, bool distributed_optimizer, bool with_optimizer, int ep) {
  return c.dp < ep || (distributed_optimizer && with_optimizer);
}

namespace {

// Host f32 copy of `n` elements of `t` starting at flat element `begin` (one copy, no zero fill).
HostFloats to_host(Ops& ops, const Tensor& t, int64_t begin, int64_t n) {
  HostFloats out(n);
  if (n == 0) return out;
  Tensor h = Tensor::wrap(out.data(), {n}, DType::F32);
  ops.copy(t.flat(begin, begin + n), h);
  return out;
}

}  // namespace

Snapshot take_snapshot(ParamRegistry& reg, Ops& ops, const std::vector<OptimizerShardRef>& opt, const Coords& c,
                       bool distributed_optimizer, int ep) {
  Snapshot s;
  const bool with_opt = !opt.empty();
  if (!rank_writes_file(c, distributed_optimizer, with_opt, ep)) return s;
  s.file = shard_file_name(c);
  auto saves = [&](const ParamSpec& p) { return !p.tied_copy && (p.shard_dim >= 0 || c.tp == 0); };
  // Rank 0 of the tensor's reduce group: DP x CP, or EDP for a routed expert's under ep > 1 (the
  // DP x CP indices [0, ep), EP rank q holding EP rank q's experts).
  auto writes_values = [&](const ParamSpec& p) { return ep > 1 && p.expert >= 0 ? c.dp < ep : c.dp == 0; };
  if (c.dp < ep)
    for (Param* pp : reg.tensors()) {  // parameters and buffers
      Param& p = *pp;
      if (!saves(p.spec) || !writes_values(p.spec)) continue;
      PieceGeom g = saved_geometry(p.spec);
      if (g.numel() == 0) continue;  // a TP shard made only of vocabulary padding
      s.specs.push_back({.name = p.spec.name, .kind = StateKind::Value, .geom = g});
      s.data.push_back(to_host(ops, p.value.flat(0, p.numel()), 0, g.numel()));
    }
  if (with_opt && (distributed_optimizer || c.dp < ep))
    for (const OptimizerShardRef& sh : opt)
      for (Param& p : reg.params()) {
        if (!saves(p.spec) || !(distributed_optimizer || writes_values(p.spec))) continue;
        const int64_t b = std::max(sh.span.begin, p.offset), e = std::min(sh.span.end, p.offset + p.numel());
        if (b >= e) continue;
        PieceGeom g = saved_geometry(p.spec);
        g.flat_begin = std::min(b - p.offset, g.box_numel());  // the padding rows come last (dim 0)
        g.flat_end = std::min(e - p.offset, g.box_numel());
        if (g.numel() == 0) continue;
        const int64_t at = p.offset + g.flat_begin - sh.span.begin;  // into the shard's tensors
        for (auto [kind, t] : {std::pair{StateKind::Master, &sh.master}, std::pair{StateKind::M, &sh.m},
                               std::pair{StateKind::V, &sh.v}}) {
          if (!t->defined()) continue;
          s.specs.push_back({.name = p.spec.name, .kind = kind, .geom = g});
          s.data.push_back(to_host(ops, *t, at, g.numel()));
        }
      }
  return s;
}

void add_fp8_state(Snapshot& snap, const std::vector<std::pair<std::string, std::vector<float>>>& state) {
  for (const auto& [name, v] : state) {
    const int64_t n = static_cast<int64_t>(v.size());
    TRIPOD_CHECK(n >= 6 && n % 3 == 0, "FP8 state of {}: {} floats", name, n);
    snap.specs.push_back({.name = name, .kind = StateKind::Fp8, .geom = PieceGeom::whole({3, n / 3})});
    snap.data.emplace_back(v.begin(), v.end());
  }
}

std::vector<std::pair<std::string, std::vector<float>>> read_fp8_state(const std::string& ckpt_dir) {
  CheckpointReader r(ckpt_dir);
  return r.fp8_state();
}

int64_t write_snapshot(Snapshot& snap, const std::string& dir, int sleep_after_first_ms) {
  H5Writer w(dir + "/" + snap.file);
  for (size_t i = 0; i < snap.specs.size(); ++i) {
    snap.specs[i].crc = crc32c(snap.data[i].data(), snap.data[i].size() * sizeof(float));
    w.write(snap.specs[i], snap.data[i].data());
    if (i == 0 && sleep_after_first_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_after_first_ms));
  }
  return w.close();
}

std::vector<std::pair<int64_t, std::string>> committed_checkpoints(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const int64_t it = parse_iter_dir_name(e.path().filename().string());
    if (it >= 0 && e.is_directory(ec) && fs::exists(e.path() / "metadata.json", ec)) out.emplace_back(it, e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

namespace {

// The text of `path` written durably: a temporary file, fsync, rename, fsync of the directory.
void write_file_atomically(const fs::path& path, const std::string& text) {
  fs::path tmp = path;
  tmp += ".tmp";
  {
    std::ofstream out(tmp);
    out << text;
    out.close();
    if (!out.good()) TRIPOD_FAIL("writing {}: {}", tmp.string(), std::strerror(errno));
  }
  fsync_path(tmp.string());
  fs::rename(tmp, path);
  fsync_path(path.parent_path().string());
}

// The run a committed checkpoint belongs to ("" when unreadable or unrecorded).
std::string run_id_of(const fs::path& dir) {
  std::ifstream in(dir / "metadata.json");
  nlohmann::json m = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  return m.is_object() && m.contains("run_id") && m["run_id"].is_string() ? m["run_id"].get<std::string>() : "";
}

}  // namespace

void commit_checkpoint_dir(const std::string& root, const std::string& tmp_dir, const std::string& final_dir,
                           nlohmann::json meta, int keep) {
  fs::path tmp(tmp_dir), fin(final_dir);
  nlohmann::json files = nlohmann::json::array();
  std::vector<fs::path> entries;
  for (const auto& e : fs::directory_iterator(tmp))
    if (e.is_regular_file() && e.path().extension() == ".h5") entries.push_back(e.path());
  std::sort(entries.begin(), entries.end());
  for (const auto& p : entries) files.push_back({{"name", p.filename().string()}, {"bytes", fs::file_size(p)}});
  meta["format"] = "tripod-checkpoint";
  meta["format_version"] = kCheckpointFormatVersion;
  meta["tripod_version"] = TRIPOD_VERSION;
  meta["checksum"] = "crc32c (Castagnoli) of each dataset's little-endian f32 bytes, attribute crc32c";
  meta["files"] = files;
  meta["metadata_crc32c"] = metadata_checksum(meta);
  write_file_atomically(tmp / "metadata.json", meta.dump(2) + "\n");
  fsync_path(tmp.string());
  if (fs::exists(fin)) {
    // A checkpoint of the same iteration (a run resumed from an earlier one): swapped in one
    // atomic step, so that `latest` never names a missing directory; the old one is then removed.
    if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, fin.c_str(), RENAME_EXCHANGE) != 0)
      TRIPOD_FAIL("replacing {} with the new save of its iteration: {}", fin.string(), std::strerror(errno));
    fsync_path(root);
    fs::remove_all(tmp);
  } else {
    fs::rename(tmp, fin);
  }
  fsync_path(root);
  // `latest` never moves back to an older iteration (a run resumed from an earlier checkpoint
  // saves below a newer one until it passes it).
  const int64_t current = parse_iter_dir_name(fin.filename().string());
  std::ifstream latest_in(fs::path(root) / "latest");
  std::string latest_name;
  std::getline(latest_in, latest_name);
  const int64_t latest = parse_iter_dir_name(latest_name);
  if (latest > current && fs::exists(fs::path(root) / latest_name / "metadata.json"))
    spdlog::info("checkpoint: {} stays the latest ({} is older)", latest_name, fin.filename().string());
  else
    write_file_atomically(fs::path(root) / "latest", fin.filename().string() + "\n");
  // checkpoint.keep: only this run's older checkpoints are removed, never another run's.
  const std::string run = meta.value("run_id", "");
  if (keep > 0 && !run.empty()) {
    std::vector<std::pair<int64_t, std::string>> older;
    for (auto& [it, dir] : committed_checkpoints(root))
      if (it < current && run_id_of(dir) == run) older.emplace_back(it, dir);
    std::sort(older.begin(), older.end(), std::greater<>());
    for (size_t i = keep - 1; i < older.size(); ++i) {
      spdlog::info("checkpoint: removing {} (checkpoint.keep = {})", older[i].second, keep);
      fs::remove_all(older[i].second);
    }
  }
}

CheckpointSaver::CheckpointSaver(std::string root, int keep, bool async, Communicator& world, int test_sleep_ms)
    : root_(std::move(root)), keep_(keep), async_(async), world_(world), test_sleep_ms_(test_sleep_ms) {}

CheckpointSaver::~CheckpointSaver() {
  if (thread_.joinable()) thread_.join();
}

void CheckpointSaver::save(int64_t iteration, Snapshot snap, nlohmann::json meta) {
  finish();
  const fs::path tmp = fs::path(root_) / (iter_dir_name(iteration) + ".tmp");
  if (world_.rank() == 0) {
    fs::create_directories(root_);
    for (const auto& e : fs::directory_iterator(root_))  // leftovers of killed saves
      if (e.path().extension() == ".tmp") fs::remove_all(e.path());
    fs::create_directories(tmp);
  }
  world_.barrier();
  pending_ = true;
  iteration_ = iteration;
  meta_ = std::move(meta);
  error_.clear();
  auto work = [this, dir = tmp.string(), s = std::move(snap)]() mutable {
    try {
      if (!s.file.empty()) write_snapshot(s, dir, test_sleep_ms_);
    } catch (const std::exception& e) {
      error_ = e.what();
    }
  };
  if (async_) {
    thread_ = std::thread(std::move(work));
  } else {
    work();
    commit();
  }
}

void CheckpointSaver::finish() {
  if (!pending_) return;
  commit();
}

void CheckpointSaver::commit() {
  if (thread_.joinable()) thread_.join();
  pending_ = false;
  // Every rank's file is written and fsynced (or failed): agree, then rank 0 commits.
  CpuAllocator host;
  Tensor flag = Tensor::empty(host, {1}, DType::F32, MemCategory::Workspace);
  flag.data<float>()[0] = error_.empty() ? 0.f : 1.f;
  world_.all_reduce(flag, ReduceOp::Max);
  const fs::path tmp = fs::path(root_) / (iter_dir_name(iteration_) + ".tmp");
  const fs::path fin = fs::path(root_) / iter_dir_name(iteration_);
  if (flag.data<float>()[0] != 0.f)
    TRIPOD_FAIL("checkpoint save of iteration {} failed{}; {} is left incomplete and will not be loaded", iteration_,
                error_.empty() ? " on another rank" : ": " + error_, tmp.string());
  std::string err;
  if (world_.rank() == 0) {
    try {
      commit_checkpoint_dir(root_, tmp.string(), fin.string(), meta_, keep_);
    } catch (const std::exception& e) {
      err = e.what();
    }
  }
  flag.data<float>()[0] = err.empty() ? 0.f : 1.f;
  world_.all_reduce(flag, ReduceOp::Max);
  if (flag.data<float>()[0] != 0.f) TRIPOD_FAIL("committing checkpoint {} failed{}", fin.string(), err.empty() ? "" : ": " + err);
  spdlog::info("checkpoint: saved iteration {} to {}", iteration_, fin.string());
}

}  // namespace tripod
