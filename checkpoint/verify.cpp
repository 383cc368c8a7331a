// Checkpoint verification: checksums of every piece and exactly-once coverage of every tensor.
#include "checkpoint/verify.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include "checkpoint/reader.h"
#include "core/error.h"

namespace fs = std::filesystem;

namespace tripod {

VerifyResult verify_checkpoint(const std::string& dir) {
  CheckpointReader r(dir);  // metadata, files present with their recorded sizes
  VerifyResult out;
  out.dir = dir;
  out.files = static_cast<int64_t>(r.metadata()["files"].size());
  // Index each file separately, so one damaged file does not hide the others.
  std::vector<StoredPiece> pieces;
  for (const auto& f : r.metadata()["files"]) {
    const std::string path = (fs::path(dir) / f["name"].get<std::string>()).string();
    try {
      H5Reader h(path);
      for (auto& p : h.index()) pieces.push_back(std::move(p));
    } catch (const InputError& e) {
      out.problems.push_back(e.what());
    }
  }
  for (const StoredPiece& p : pieces) {
    try {
      r.read_piece(p);
      out.bytes += p.spec.geom.numel() * 4;
    } catch (const InputError& e) {
      out.problems.push_back(e.what());
    }
  }
  out.datasets = static_cast<int64_t>(pieces.size());
  // Coverage: every element of every tensor exactly once per state; value always, m and v with
  // the optimizer, master when any was saved.
  std::map<std::string, Shape> shapes;
  std::set<StateKind> kinds;
  for (const StoredPiece& p : pieces) {
    shapes.emplace(p.spec.name, p.spec.geom.global_shape);
    kinds.insert(p.spec.kind);
  }
  out.tensors = static_cast<int64_t>(shapes.size());
  std::vector<StateKind> required = {StateKind::Value};
  if (r.metadata().value("has_optimizer", false)) required.insert(required.end(), {StateKind::M, StateKind::V});
  if (kinds.count(StateKind::Master)) required.push_back(StateKind::Master);
  out.optimizer_state = required.size() > 1;
  // Buffers (metadata "buffers": state that is not trained, e.g. a router's selection bias) have
  // values only.
  std::set<std::string> buffers;
  for (const auto& b : r.metadata().value("buffers", nlohmann::json::array())) buffers.insert(b.get<std::string>());
  for (const auto& [name, shape] : shapes)
    for (StateKind kind : required) {
      if (kind != StateKind::Value && buffers.count(name)) continue;
      const PieceGeom whole = PieceGeom::whole(shape);
      std::vector<uint8_t> count(shape_numel(shape), 0);
      std::string where;
      for (const StoredPiece& p : pieces) {
        if (p.spec.name != name || p.spec.kind != kind) continue;
        if (p.spec.geom.global_shape != shape) {
          out.problems.push_back(fmt::format("{}: dataset {} gives tensor {} the shape {}, others {}", p.file,
                                             p.dataset, name, shape_str(p.spec.geom.global_shape), shape_str(shape)));
          continue;
        }
        for_each_overlap(p.spec.geom, whole, [&](int64_t, int64_t wi, int64_t n) {
          for (int64_t i = 0; i < n; ++i) count[wi + i] = static_cast<uint8_t>(std::min(count[wi + i] + 1, 2));
        });
        where += (where.empty() ? "" : ", ") + fs::path(p.file).filename().string();
      }
      int64_t missing = std::count(count.begin(), count.end(), 0), twice = std::count(count.begin(), count.end(), 2);
      if (missing || twice)
        out.problems.push_back(fmt::format("tensor {} ({}): {} of {} elements missing, {} stored more than once "
                                           "(pieces in: {}; a shard file missing or damaged?)",
                                           name, state_kind_name(kind), missing, count.size(), twice,
                                           where.empty() ? "none" : where));
    }
  return out;
}

}  // namespace tripod
