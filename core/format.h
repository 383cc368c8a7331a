// Numbers for people.
#pragma once

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <string>

namespace tripod {

// "1h02m", "3m05s", "12s" ("?" for a negative or NaN time).
inline std::string format_duration(double s) {
  if (!(s >= 0)) return "?";
  const auto t = static_cast<int64_t>(s + 0.5);
  if (t >= 3600) return fmt::format("{}h{:02d}m", t / 3600, (t % 3600) / 60);
  if (t >= 60) return fmt::format("{}m{:02d}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}

// "1.23 GiB", "512 B".
inline std::string format_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (std::fabs(b) >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  if (u == 0) return fmt::format("{:.0f} B", b);
  return fmt::format("{:.{}f} {}", b, b >= 100 ? 0 : b >= 10 ? 1 : 2, units[u]);
}

// "812", "12.3k", "4.56M".
inline std::string format_si(double v) {
  const double a = std::fabs(v);
  if (a >= 1e9) return fmt::format("{:.3g}G", v / 1e9);
  if (a >= 1e6) return fmt::format("{:.3g}M", v / 1e6);
  if (a >= 1e3) return fmt::format("{:.3g}k", v / 1e3);
  return fmt::format("{:.3g}", v);
}

// "812", "12.3k", "4.56M", "1.24B" (a count of parameters, tokens, ...).
inline std::string format_count(double v) {
  if (v >= 1e9) return fmt::format("{:.2f}B", v / 1e9);
  if (v >= 1e6) return fmt::format("{:.2f}M", v / 1e6);
  if (v >= 1e3) return fmt::format("{:.1f}k", v / 1e3);
  return fmt::format("{:.0f}", v);
}

}  // namespace tripod
