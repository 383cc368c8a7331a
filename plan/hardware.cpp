// Hardware files: strict TOML reading and writing, and the kernel and collective times they imply.
#include "plan/hardware.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <toml++/toml.h>

#include <spdlog/spdlog.h>

#include "core/error.h"

namespace tripod {

namespace {

constexpr double kGiB = 1024.0 * 1024 * 1024;

// Reads the keys of one table, refusing any it did not read.
class Keys {
 public:
  Keys(const toml::table& t, std::string where) : t_(t), where_(std::move(where)) {}
  const toml::node* get(const char* k) {
    read_.insert(k);
    return t_.get(k);
  }
  double number(const char* k, double fallback, bool required = false, bool positive = true) {
    const toml::node* n = get(k);
    if (!n) {
      TRIPOD_INPUT_CHECK(!required, "{}: missing {}", where_, k);
      return fallback;
    }
    TRIPOD_INPUT_CHECK(n->is_number(), "{}: {} must be a number", where_, k);
    double v = n->value<double>().value();
    TRIPOD_INPUT_CHECK(std::isfinite(v) && (positive ? v > 0 : v >= 0), "{}: {} = {} must be {}", where_, k, v,
                       positive ? "> 0" : ">= 0");
    return v;
  }
  std::string string(const char* k, std::string fallback) {
    const toml::node* n = get(k);
    if (!n) return fallback;
    TRIPOD_INPUT_CHECK(n->is_string(), "{}: {} must be a string", where_, k);
    return n->value<std::string>().value();
  }
  int64_t integer(const char* k) {
    double v = number(k, 0, true);
    TRIPOD_INPUT_CHECK(v == std::floor(v) && v < 9e15, "{}: {} = {} must be an integer", where_, k, v);
    return static_cast<int64_t>(v);
  }
  bool boolean(const char* k, bool fallback) {
    const toml::node* n = get(k);
    if (!n) return fallback;
    TRIPOD_INPUT_CHECK(n->is_boolean(), "{}: {} must be true or false", where_, k);
    return n->value<bool>().value();
  }
  void finish() const {
    for (auto&& [k, v] : t_) {
      if (read_.count(std::string(k.str()))) continue;
      std::vector<std::string> valid(read_.begin(), read_.end());
      throw InputError(fmt::format("{}: unknown key {} (valid: {})", where_, k.str(), fmt::join(valid, ", ")));
    }
  }

 private:
  const toml::table& t_;
  std::string where_;
  std::set<std::string> read_;
};

const toml::table* table_of(const toml::table& root, const char* name, const std::string& origin) {
  const toml::node* n = root.get(name);
  if (!n) return nullptr;
  TRIPOD_INPUT_CHECK(n->is_table(), "{}: '{}' must be a table ([{}])", origin, name, name);
  return n->as_table();
}

template <class F>
void for_each_entry(const toml::table& root, const char* name, const std::string& origin, F&& f) {
  const toml::node* n = root.get(name);
  if (!n) return;
  const toml::array* arr = n->as_array();
  TRIPOD_INPUT_CHECK(arr, "{}: '{}' must be an array of tables ([[{}]])", origin, name, name);
  int i = 0;
  for (const toml::node& e : *arr) {
    TRIPOD_INPUT_CHECK(e.is_table(), "{}: '{}' must be an array of tables ([[{}]])", origin, name, name);
    Keys k(*e.as_table(), fmt::format("{}: [[{}]] #{}", origin, name, ++i));
    f(k);
    k.finish();
  }
}

Link read_link(const toml::table* t, const std::string& where) {
  TRIPOD_INPUT_CHECK(t, "{}: missing", where);
  Keys k(*t, where);
  Link l{k.number("bandwidth_gbs", 0, true) * 1e9, k.number("latency_us", 0, true, false) * 1e-6};
  k.finish();
  return l;
}

// Piecewise-linear interpolation of y over sorted x, held constant beyond the ends.
double interpolate(const std::vector<std::pair<double, double>>& pts, double x) {
  if (x <= pts.front().first) return pts.front().second;
  if (x >= pts.back().first) return pts.back().second;
  auto hi = std::lower_bound(pts.begin(), pts.end(), std::make_pair(x, -1e300));
  auto lo = hi - 1;
  double f = (x - lo->first) / (hi->first - lo->first);
  return lo->second + f * (hi->second - lo->second);
}

}  // namespace

const char* elementwise_name(Elementwise e) {
  static const char* names[] = {"layernorm", "gelu",  "add",    "cross_entropy", "embedding",
                                "adamw",     "rmsnorm", "swiglu", "rope"};
  return names[static_cast<int>(e)];
}

const char* collective_name(Collective c) {
  static const char* names[] = {"all_reduce", "all_gather", "reduce_scatter", "send_recv"};
  return names[static_cast<int>(c)];
}

double Hardware::gemm_time(int64_t m, int64_t n, int64_t k, bool backward) const {
  if (m <= 0 || n <= 0 || k <= 0) return 0;
  const double flops = (backward ? 4.0 : 2.0) * m * n * k;
  if (gemm.empty()) {
    const double d = static_cast<double>(std::min({m, n, k}));
    return flops / (peak_flops * gemm_efficiency * d / (d + gemm_half_dim));
  }
  // The rate (FLOP/s) of the nearest measured shapes in log(m), log(n), log(k), weighted by
  // inverse squared distance; a measured shape gets its own rate.
  std::vector<std::pair<double, double>> near;  // (squared distance, rate)
  for (const GemmPoint& p : gemm) {
    auto sq = [](double a, double b) { return std::pow(std::log2(a / b), 2); };
    double dist = sq(m, p.m) + sq(n, p.n) + sq(k, p.k);
    double s = backward ? p.backward_s : p.forward_s;
    near.push_back({dist, (backward ? 4.0 : 2.0) * p.m * p.n * p.k / s});
  }
  std::sort(near.begin(), near.end());
  if (near.front().first < 1e-12) return flops / near.front().second;
  double wsum = 0, rsum = 0;
  for (size_t i = 0; i < std::min<size_t>(4, near.size()); ++i) {
    wsum += 1 / near[i].first;
    rsum += near[i].second / near[i].first;
  }
  return flops / (rsum / wsum);
}

double Hardware::attention_time(int64_t pairs, int64_t t, int64_t d, bool backward) const {
  if (pairs <= 0) return 0;
  const double flops = AttentionPoint{.t = t, .d = d, .pairs = pairs}.flops(backward);
  if (attention.empty()) return flops / (peak_flops * attention_efficiency);
  // The points of the nearest head dimension; per measured length, the rate of a call of these
  // total FLOPs (interpolated in log FLOPs between its calls, held beyond them: a call larger
  // than any measured runs at the largest's rate); then interpolated in log(t) between lengths.
  int64_t best_d = attention.front().d;
  for (const AttentionPoint& p : attention)
    if (std::abs(std::log2(double(p.d) / d)) < std::abs(std::log2(double(best_d) / d))) best_d = p.d;
  std::map<int64_t, std::vector<std::pair<double, double>>> by_length;  // t -> (log2 FLOPs, FLOP/s)
  for (const AttentionPoint& p : attention)
    if (p.d == best_d)
      by_length[p.t].push_back({std::log2(p.flops(backward)), p.flops(backward) / (backward ? p.backward_s : p.forward_s)});
  std::vector<std::pair<double, double>> rates;  // (log2 t, FLOP/s)
  for (auto& [length, pts] : by_length) {
    std::sort(pts.begin(), pts.end());
    rates.push_back({std::log2(double(length)), interpolate(pts, std::log2(flops))});
  }
  return flops / interpolate(rates, std::log2(double(t)));
}

double Hardware::elementwise_time(Elementwise e, int64_t elements, bool backward) const {
  if (elements <= 0) return 0;
  // Measured calls of this op: seconds per element interpolated in log(elements), held beyond the
  // largest (the memory's bandwidth); below the smallest, that call's time (a launch's latency).
  std::vector<std::pair<double, double>> pts;  // (log2 elements, seconds per element)
  for (const ElementwisePoint& p : elementwise_points)
    if (p.op == e) pts.push_back({std::log2(double(p.elements)), (backward ? p.backward_s : p.forward_s) / p.elements});
  if (!pts.empty()) {
    std::sort(pts.begin(), pts.end());
    const double x = std::log2(double(elements));
    if (x < pts.front().first) return pts.front().second * std::exp2(pts.front().first);
    return elements * interpolate(pts, x);
  }
  const ElementwiseRate& r = elementwise[static_cast<int>(e)];
  const double per = backward ? r.backward_s : r.forward_s;
  if (per > 0) return elements * per;
  // Bytes each element moves: activations in the compute dtype (a), f32 state (4).
  const double a = static_cast<double>(act_bytes());
  double bytes = 0;
  switch (e) {
    case Elementwise::LayerNorm: bytes = backward ? 3 * a : 2 * a; break;         // x, y / dy, x, dx
    case Elementwise::Gelu: bytes = backward ? 3 * a : 2 * a; break;
    case Elementwise::Add: bytes = 3 * a; break;
    case Elementwise::CrossEntropy: bytes = backward ? 2 * a : a; break;          // per logit
    case Elementwise::Embedding: bytes = backward ? a + 8 : 3 * a; break;         // f32 += on the table
    case Elementwise::AdamW: bytes = 4 + 3 * 8 + (bf16() ? a : 0); break;         // g; master, m, v rw; copy
    case Elementwise::RmsNorm: bytes = backward ? 3 * a : 2 * a; break;           // as LayerNorm
    case Elementwise::SwiGlu: bytes = backward ? 5 * a : 3 * a; break;            // g, u, y / g, u, dy, dg, du
    case Elementwise::Rope: bytes = 2 * a; break;                                 // in place
    case Elementwise::Count: break;
  }
  return elements * bytes / (memory_bandwidth * memory_efficiency);
}

double Hardware::collective_time(Collective op, int ranks, int64_t bytes, bool intra_node) const {
  if (bytes <= 0 || (ranks <= 1 && op != Collective::SendRecv)) return 0;
  if (intra_node) {
    // Measured points for this op at the nearest rank count.
    int best = -1;
    for (const CollectivePoint& p : collectives)
      if (p.op == op && (best < 0 || std::abs(p.ranks - ranks) < std::abs(best - ranks))) best = p.ranks;
    if (best > 0) {
      std::vector<std::pair<double, double>> pts;
      for (const CollectivePoint& p : collectives)
        if (p.op == op && p.ranks == best) pts.push_back({double(p.bytes), p.seconds});
      std::sort(pts.begin(), pts.end());
      // Beyond the largest message: its bandwidth.
      if (bytes > pts.back().first) return pts.back().second * bytes / pts.back().first;
      return interpolate(pts, double(bytes));
    }
  }
  const Link& l = intra_node ? intra : inter;
  const double bw = l.bandwidth * collective_efficiency, n = ranks;
  switch (op) {
    case Collective::AllReduce: return 2 * (n - 1) / n * bytes / bw + 2 * (n - 1) * l.latency;
    case Collective::AllGather:
    case Collective::ReduceScatter: return (n - 1) / n * bytes / bw + (n - 1) * l.latency;
    case Collective::SendRecv: return bytes / bw + l.latency;
    case Collective::Count: break;
  }
  return 0;
}

Hardware parse_hardware(const std::string& text, const std::string& origin) {
  toml::table root;
  try {
    root = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    throw InputError(fmt::format("{}:{}:{}: TOML syntax error: {}", origin, e.source().begin.line,
                                 e.source().begin.column, e.description()));
  }
  const std::set<std::string> sections = {"device", "intra_node", "inter_node", "efficiency", "elementwise",
                                          "gemm", "attention", "collective"};
  for (auto&& [k, v] : root)
    TRIPOD_INPUT_CHECK(sections.count(std::string(k.str())),
                       "{}: unknown section [{}] (valid: device, intra_node, inter_node, efficiency, elementwise, "
                       "gemm, attention, collective)",
                       origin, k.str());
  Hardware hw;
  const toml::table* dev = table_of(root, "device", origin);
  TRIPOD_INPUT_CHECK(dev, "{}: missing [device]", origin);
  {
    Keys k(*dev, origin + ": [device]");
    hw.name = k.string("name", origin);
    const std::string kind = k.string("kind", "cuda");
    const std::optional<Device> device = parse_enum<Device>(kind);
    TRIPOD_INPUT_CHECK(device, "{}: device.kind = \"{}\" must be \"cuda\" or \"cpu\"", origin, kind);
    hw.device = *device;
    hw.peak_flops = k.number("peak_tflops", 0, true) * 1e12;
    hw.peak_flops_f32 = k.number("peak_tflops_f32", hw.peak_flops / 1e12) * 1e12;
    hw.memory_capacity = k.number("memory_gib", 0, true) * kGiB;
    hw.memory_bandwidth = k.number("memory_bandwidth_gbs", 0, true) * 1e9;
    hw.reserved_memory = k.number("reserved_gib", 0, false, false) * kGiB;
    double g = k.number("gpus_per_node", 1);
    TRIPOD_INPUT_CHECK(g == std::floor(g) && g >= 1 && g <= 1024, "{}: device.gpus_per_node = {} must be an integer "
                       "in 1..1024", origin, g);
    hw.gpus_per_node = static_cast<int>(g);
    TRIPOD_INPUT_CHECK(hw.reserved_memory < hw.memory_capacity, "{}: device.reserved_gib must be less than memory_gib",
                       origin);
    k.finish();
  }
  hw.intra = read_link(table_of(root, "intra_node", origin), origin + ": [intra_node]");
  hw.inter = read_link(table_of(root, "inter_node", origin), origin + ": [inter_node]");
  if (const toml::table* eff = table_of(root, "efficiency", origin)) {
    Keys k(*eff, origin + ": [efficiency]");
    hw.gemm_efficiency = k.number("gemm", hw.gemm_efficiency);
    hw.gemm_half_dim = k.number("gemm_half_dim", hw.gemm_half_dim, false, false);
    hw.attention_efficiency = k.number("attention", hw.attention_efficiency);
    hw.memory_efficiency = k.number("memory", hw.memory_efficiency);
    hw.collective_efficiency = k.number("collective", hw.collective_efficiency);
    hw.overlap_dp = k.boolean("overlap_dp", hw.overlap_dp);
    for (double e : {hw.gemm_efficiency, hw.attention_efficiency, hw.memory_efficiency, hw.collective_efficiency})
      TRIPOD_INPUT_CHECK(e <= 1, "{}: [efficiency] fractions must be in (0, 1], got {}", origin, e);
    k.finish();
  }
  // [[elementwise]] points (op, elements, the call's times), or the older [elementwise] table of
  // per-element times at no recorded size.
  const toml::node* el = root.get("elementwise");
  if (el && el->is_table()) {
    Keys k(*el->as_table(), origin + ": [elementwise]");
    bool any = false;
    for (int i = 0; i < static_cast<int>(Elementwise::Count); ++i) {
      std::string name = elementwise_name(static_cast<Elementwise>(i));
      hw.elementwise[i].forward_s = k.number((name + "_forward_s").c_str(), 0, false, false);
      hw.elementwise[i].backward_s = k.number((name + "_backward_s").c_str(), 0, false, false);
      any |= hw.elementwise[i].forward_s > 0 || hw.elementwise[i].backward_s > 0;
    }
    k.finish();
    if (any)
      hw.warnings.push_back(fmt::format(
          "{}: [elementwise] holds per-element times measured at one unrecorded size (an older tripod calibrate, "
          "on tensors that may sit in cache); `tripod calibrate` now writes [[elementwise]] points by size",
          origin));
  } else {
    for_each_entry(root, "elementwise", origin, [&](Keys& k) {
      const std::string op = k.string("op", "");
      int found = -1;
      std::vector<std::string> names;
      for (int i = 0; i < static_cast<int>(Elementwise::Count); ++i) {
        names.push_back(elementwise_name(static_cast<Elementwise>(i)));
        if (op == names.back()) found = i;
      }
      TRIPOD_INPUT_CHECK(found >= 0, "{}: [[elementwise]] op = \"{}\" must be one of {}", origin, op,
                         fmt::join(names, ", "));
      hw.elementwise_points.push_back({static_cast<Elementwise>(found), k.integer("elements"),
                                       k.number("forward_s", 0, true), k.number("backward_s", 0, true)});
    });
  }
  for_each_entry(root, "gemm", origin, [&](Keys& k) {
    hw.gemm.push_back({k.integer("m"), k.integer("n"), k.integer("k"), k.number("forward_s", 0, true),
                       k.number("backward_s", 0, true)});
  });
  bool per_pair = false;
  for_each_entry(root, "attention", origin, [&](Keys& k) {
    AttentionPoint p{.t = k.integer("t"), .d = k.integer("d"), .forward_s = k.number("forward_s", 0, true),
                     .backward_s = k.number("backward_s", 0, true)};
    if (k.get("pairs")) p.pairs = k.integer("pairs");
    else per_pair = true;
    hw.attention.push_back(p);
  });
  if (per_pair)
    hw.warnings.push_back(fmt::format(
        "{}: [[attention]] points without `pairs` are per (sequence, head) pair, timed on calls too small to fill a "
        "GPU (an older tripod calibrate): they are read as calls of one pair, so a GPU's attention is predicted "
        "far too slow; run `tripod calibrate` again",
        origin));
  for_each_entry(root, "collective", origin, [&](Keys& k) {
    std::string op = k.string("op", "");
    CollectivePoint p;
    int found = -1;
    for (int i = 0; i < static_cast<int>(Collective::Count); ++i)
      if (op == collective_name(static_cast<Collective>(i))) found = i;
    TRIPOD_INPUT_CHECK(found >= 0, "{}: [[collective]] op = \"{}\" must be one of all_reduce, all_gather, "
                       "reduce_scatter, send_recv", origin, op);
    p.op = static_cast<Collective>(found);
    p.ranks = static_cast<int>(k.integer("ranks"));
    p.bytes = k.integer("bytes");
    p.seconds = k.number("seconds", 0, true);
    hw.collectives.push_back(p);
  });
  return hw;
}

Hardware default_hardware(Device device) {
  if (device == Device::CUDA)
    return parse_hardware(R"hw([device]
name = "H100 SXM 80GB (built-in)"
kind = "cuda"
peak_tflops = 989
peak_tflops_f32 = 67
memory_gib = 79.6
memory_bandwidth_gbs = 3350
reserved_gib = 3
gpus_per_node = 8
[intra_node]
bandwidth_gbs = 450
latency_us = 3
[inter_node]
bandwidth_gbs = 50
latency_us = 8
[efficiency]
gemm = 0.7
gemm_half_dim = 256
attention = 0.45
memory = 0.8
collective = 0.8
)hw", "the built-in cuda hardware");
  return parse_hardware(R"hw([device]
name = "CPU (built-in)"
kind = "cpu"
peak_tflops = 1
memory_gib = 64
memory_bandwidth_gbs = 100
gpus_per_node = 1
[intra_node]
bandwidth_gbs = 10
latency_us = 5
[inter_node]
bandwidth_gbs = 10
latency_us = 5
[efficiency]
gemm = 0.5
gemm_half_dim = 64
attention = 0.2
memory = 0.5
collective = 0.5
overlap_dp = false
)hw", "the built-in cpu hardware");
}

Hardware load_hardware(const std::string& path) {
  std::ifstream in(path);
  TRIPOD_INPUT_CHECK(in, "hardware file {} cannot be read (missing or not readable)", path);
  std::stringstream ss;
  ss << in.rdbuf();
  Hardware hw = parse_hardware(ss.str(), path);
  for (const std::string& w : hw.warnings) spdlog::warn("{}", w);
  return hw;
}

std::string hardware_to_toml(const Hardware& hw) {
  std::string s;
  s += fmt::format("[device]\nname = \"{}\"\nkind = \"{}\"\npeak_tflops = {:.6g}\npeak_tflops_f32 = {:.6g}\n"
                   "memory_gib = {:.6g}\nmemory_bandwidth_gbs = {:.6g}\nreserved_gib = {:.6g}\ngpus_per_node = {}\n\n",
                   hw.name, enum_name(hw.device), hw.peak_flops / 1e12, hw.peak_flops_f32 / 1e12, hw.memory_capacity / kGiB,
                   hw.memory_bandwidth / 1e9, hw.reserved_memory / kGiB, hw.gpus_per_node);
  s += fmt::format("[intra_node]\nbandwidth_gbs = {:.6g}\nlatency_us = {:.6g}\n\n", hw.intra.bandwidth / 1e9,
                   hw.intra.latency * 1e6);
  s += fmt::format("[inter_node]\nbandwidth_gbs = {:.6g}\nlatency_us = {:.6g}\n\n", hw.inter.bandwidth / 1e9,
                   hw.inter.latency * 1e6);
  s += fmt::format("[efficiency]\ngemm = {:.6g}\ngemm_half_dim = {:.6g}\nattention = {:.6g}\nmemory = {:.6g}\n"
                   "collective = {:.6g}\noverlap_dp = {}\n\n",
                   hw.gemm_efficiency, hw.gemm_half_dim, hw.attention_efficiency, hw.memory_efficiency,
                   hw.collective_efficiency, hw.overlap_dp);
  // The older per-element table only when there are no sized points (TOML has one `elementwise`).
  std::string el;
  for (int i = 0; i < static_cast<int>(Elementwise::Count) && hw.elementwise_points.empty(); ++i) {
    const ElementwiseRate& r = hw.elementwise[i];
    if (r.forward_s > 0) el += fmt::format("{}_forward_s = {:.6g}\n", elementwise_name(Elementwise(i)), r.forward_s);
    if (r.backward_s > 0) el += fmt::format("{}_backward_s = {:.6g}\n", elementwise_name(Elementwise(i)), r.backward_s);
  }
  if (!el.empty()) s += "[elementwise]  # seconds per element\n" + el + "\n";
  auto rate = [](double bytes_or_flops, double seconds) { return seconds > 0 ? bytes_or_flops / seconds / 1e9 : 0.0; };
  for (const ElementwisePoint& p : hw.elementwise_points)
    s += fmt::format("[[elementwise]]  # {:.3g} / {:.3g} ns per element\nop = \"{}\"\nelements = {}\nforward_s = {:.6g}\n"
                     "backward_s = {:.6g}\n\n",
                     1e9 * p.forward_s / p.elements, 1e9 * p.backward_s / p.elements, elementwise_name(p.op),
                     p.elements, p.forward_s, p.backward_s);
  for (const GemmPoint& g : hw.gemm)
    s += fmt::format("[[gemm]]  # {:.4g} / {:.4g} TFLOP/s\nm = {}\nn = {}\nk = {}\nforward_s = {:.6g}\nbackward_s = {:.6g}\n\n",
                     rate(2.0 * g.m * g.n * g.k, g.forward_s) / 1e3, rate(4.0 * g.m * g.n * g.k, g.backward_s) / 1e3,
                     g.m, g.n, g.k, g.forward_s, g.backward_s);
  for (const AttentionPoint& a : hw.attention)
    s += fmt::format("[[attention]]  # {:.4g} / {:.4g} TFLOP/s\nt = {}\nd = {}\npairs = {}\nforward_s = {:.6g}\n"
                     "backward_s = {:.6g}\n\n",
                     rate(a.flops(false), a.forward_s) / 1e3, rate(a.flops(true), a.backward_s) / 1e3, a.t, a.d,
                     a.pairs, a.forward_s, a.backward_s);
  for (const CollectivePoint& c : hw.collectives)
    s += fmt::format("[[collective]]\nop = \"{}\"\nranks = {}\nbytes = {}\nseconds = {:.6g}\n\n",
                     collective_name(c.op), c.ranks, c.bytes, c.seconds);
  return s;
}

}  // namespace tripod
