// Test harness: gathering a sharded model's parameters into whole tensors.
#include "harness.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

namespace tripod::test {

SharedDir::SharedDir(const std::string& name) {
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  int id = rank_ == 0 ? static_cast<int>(::getpid()) : 0;
  MPI_Bcast(&id, 1, MPI_INT, 0, MPI_COMM_WORLD);
  path_ = std::filesystem::temp_directory_path() / fmt::format("tripod_{}_{}", name, id);
  if (rank_ == 0) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

SharedDir::~SharedDir() {
  MPI_Barrier(MPI_COMM_WORLD);
  std::error_code ec;
  if (rank_ == 0) std::filesystem::remove_all(path_, ec);
}

std::map<std::string, std::vector<float>> gather_global_params(ParamRegistry& reg, ParallelContext& par, Ops& ops,
                                                               bool grads) {
  MPI_Comm world = static_cast<MpiComm*>(par.world.get())->handle();
  // Every rank must walk the same list of names: gather the names of all stages first.
  std::map<std::string, Shape> global;  // name -> global shape with vocabulary rows trimmed
  for (int src = 0; src < par.grid.world_size(); ++src) {
    std::string names;
    if (par.rank == src)
      for (const Param& p : reg.params()) {
        Shape g = p.spec.global_shape;
        if (p.spec.vocab_rows >= 0) g[0] = p.spec.vocab_rows;
        names += p.spec.name;
        for (int64_t d : g) names += fmt::format(" {}", d);
        names += "\n";
      }
    int len = static_cast<int>(names.size());
    MPI_Bcast(&len, 1, MPI_INT, src, world);
    names.resize(len);
    MPI_Bcast(names.data(), len, MPI_CHAR, src, world);
    std::istringstream in(names);
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream ls(line);
      std::string name;
      ls >> name;
      Shape g;
      int64_t d;
      while (ls >> d) g.push_back(d);
      global[name] = g;
    }
  }
  std::map<std::string, std::vector<float>> out;
  for (auto& [name, g] : global) {
    std::vector<float> buf(shape_numel(g), 0.f);
    Param* p = reg.find(name);
    // One copy of each: the first of its reduce group (DP x CP; EDP for a routed expert's tensor).
    const int copy = p && p->spec.expert >= 0 ? par.grid.edp_rank(par.coords) : par.grid.dpcp_rank(par.coords);
    if (p && !p->spec.tied_copy && copy == 0 && (p->spec.shard_dim >= 0 || par.coords.tp == 0)) {
      Tensor local = Tensor::empty(ops.allocator(), p->spec.local_shape(), DType::F32, MemCategory::Workspace);
      ops.copy(grads ? p->grad : p->value, local);
      const Shape L = p->spec.local_shape();
      const int d = p->spec.shard_dim < 0 ? 0 : p->spec.shard_dim;
      const int64_t off = p->spec.shard_dim < 0 ? 0 : p->spec.shard_offset;
      int64_t outer = 1, inner = 1;
      for (int i = 0; i < d; ++i) outer *= L[i];
      for (size_t i = d + 1; i < L.size(); ++i) inner *= L[i];
      const float* src = local.data<float>();
      for (int64_t o = 0; o < outer; ++o)
        for (int64_t r = 0; r < L[d]; ++r) {
          int64_t gr = r + off;
          if (gr >= g[d]) continue;  // vocabulary padding
          std::copy(src + (o * L[d] + r) * inner, src + (o * L[d] + r + 1) * inner, buf.data() + (o * g[d] + gr) * inner);
        }
    }
    MPI_Allreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(buf.size()), MPI_FLOAT, MPI_SUM, world);
    out[name] = std::move(buf);
  }
  return out;
}

void set_global_params(const std::map<std::string, std::vector<float>>& global, ParamRegistry& reg, Ops& ops) {
  for (Param& p : reg.params()) {
    auto it = global.find(p.spec.name);
    TRIPOD_CHECK(it != global.end(), "set_global_params: no values for {}", p.spec.name);
    Shape g = p.spec.global_shape;
    if (p.spec.vocab_rows >= 0) g[0] = p.spec.vocab_rows;
    TRIPOD_CHECK(static_cast<int64_t>(it->second.size()) == shape_numel(g), "set_global_params: {} has {} values",
                 p.spec.name, it->second.size());
    const Shape L = p.spec.local_shape();
    const int d = p.spec.shard_dim < 0 ? 0 : p.spec.shard_dim;
    const int64_t off = p.spec.shard_dim < 0 ? 0 : p.spec.shard_offset;
    int64_t outer = 1, inner = 1;
    for (int i = 0; i < d; ++i) outer *= L[i];
    for (size_t i = d + 1; i < L.size(); ++i) inner *= L[i];
    std::vector<float> local(shape_numel(L), 0.f);
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t r = 0; r < L[d]; ++r) {
        const int64_t gr = r + off;
        if (gr >= g[d]) continue;  // vocabulary padding stays zero
        const float* src = it->second.data() + (o * g[d] + gr) * inner;
        std::copy(src, src + inner, local.data() + (o * L[d] + r) * inner);
      }
    Tensor host = Tensor::wrap(local.data(), L, DType::F32);
    ops.copy(host, p.value);
  }
}

RunResult run_training(Config cfg, Ops& ops, ParallelContext& par, const SampleSource& data) {
  validate_layout(cfg, par.grid.world_size());
  Trainer t(cfg, ops, par, &data);
  RunResult r;
  for (int64_t s = 0; s < cfg.train.steps; ++s) r.losses.push_back(t.step().loss);
  r.params = gather_global_params(t.registry(), par, ops);
  return r;
}

double global_relative_difference(const std::map<std::string, std::vector<float>>& a,
                                  const std::map<std::string, std::vector<float>>& b) {
  double norm = 0, diff = 0;
  for (const auto& [name, vb] : b) {
    auto it = a.find(name);
    if (it == a.end() || it->second.size() != vb.size()) return INFINITY;
    for (size_t i = 0; i < vb.size(); ++i) {
      norm += static_cast<double>(vb[i]) * vb[i];
      double d = static_cast<double>(it->second[i]) - vb[i];
      diff += d * d;
    }
  }
  double rel = std::sqrt(diff / norm);
  return std::isnan(rel) ? INFINITY : rel;
}

double max_relative_difference(const std::map<std::string, std::vector<float>>& a,
                               const std::map<std::string, std::vector<float>>& b, std::string* worst) {
  double out = 0;
  for (const auto& [name, vb] : b) {
    auto it = a.find(name);
    if (it == a.end() || it->second.size() != vb.size()) {
      if (worst) *worst = name + " (missing or wrong size)";
      return INFINITY;
    }
    double norm = 0, diff = 0;
    for (size_t i = 0; i < vb.size(); ++i) {
      norm += static_cast<double>(vb[i]) * vb[i];
      double d = static_cast<double>(it->second[i]) - vb[i];
      diff += d * d;
    }
    double rel = norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
    if (!(rel <= out)) {
      out = std::isnan(rel) ? INFINITY : rel;
      if (worst) *worst = name;
    }
  }
  return out;
}

void expect_matches(const RunResult& run, const RunResult& serial, const std::string& label, bool print) {
  EXPECT_EQ(run.losses.size(), serial.losses.size());
  double loss_diff = 0;
  for (size_t s = 0; s < std::min(run.losses.size(), serial.losses.size()); ++s) {
    EXPECT_NEAR(run.losses[s], serial.losses[s], kLossTol * serial.losses[s]) << label << ", step " << s + 1;
    loss_diff = std::max(loss_diff, std::abs(run.losses[s] - serial.losses[s]) / serial.losses[s]);
  }
  std::string worst;
  double all = global_relative_difference(run.params, serial.params);
  double tensor = max_relative_difference(run.params, serial.params, &worst);
  EXPECT_LE(all, kWeightsTol) << label << ": all weights";
  EXPECT_LE(tensor, kTensorTol) << label << ": largest tensor difference in " << worst;
  if (print)
    fmt::print("{:<46} loss {:.1e}  weights {:.1e}  worst tensor {:.1e} ({})\n", label, loss_diff, all, tensor, worst);
}

}  // namespace tripod::test
